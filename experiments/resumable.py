"""The experiment runners' results file: one JSON line per finished run, each with a unique "name", so a
runner stopped at any point starts again where it left off (runs already in the file are skipped)."""
import json
import os


def done(results):
    """The names of the runs the results file already holds."""
    if not os.path.exists(results):
        return set()
    with open(results) as f:
        return {json.loads(line)["name"] for line in f if line.strip()}


def record(results, row, say=print):
    """Appends a finished run and says so: say(the start of its line), e.g. a Progress's print."""
    with open(results, "a") as f:
        f.write(json.dumps(row) + "\n")
    say(json.dumps(row)[:240])
