"""The experiment runners' results file: one JSON line per finished run, each with a unique "name", so a
runner stopped at any point starts again where it left off (runs already in the file are skipped)."""
import fcntl
import hashlib
import json
import os


def done(results):
    """The names of the runs the results file already holds."""
    if not os.path.exists(results):
        return set()
    with open(results) as f:
        return {json.loads(line)["name"] for line in f if line.strip()}


def record(results, row, say=print):
    """Appends a finished run and says so: say(the start of its line), e.g. a Progress's print. Under an exclusive
    lock, so that runners sharing a results file never interleave their lines."""
    with open(results, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(row) + "\n")
    say(json.dumps(row)[:240])


def machine():
    """The CPU a run's numbers came from: float kernels and their reduction order differ between CPUs (the
    powered grid's seed 4, same commit, torch and one thread, moved by up to 1.1 points on another x86
    machine), so every row records it. Linux's /proc/cpuinfo; elsewhere what platform knows."""
    import platform
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return {"cpu": info.get("model name") or platform.processor() or platform.machine(),
            "cpu_vendor": info.get("vendor_id"), "cpu_family": info.get("cpu family"), "cpu_model": info.get("model"),
            "avx512": "avx512f" in info.get("flags", "").split(), "cpus": os.cpu_count()}


def core_seconds():
    """CPU seconds (user + system) of this process and its finished child processes so far: a run's cost as
    the difference of two calls, whatever else shares the machine."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def weights_digest(path):
    """The first 16 hex digits of a sha256 over a checkpoint's weights (names and bytes, in name order): two runs
    that must start from the same weights record it (pickling details and optimizer state do not count)."""
    import torch
    state = torch.load(path, map_location="cpu", weights_only=True)["model"]
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]
