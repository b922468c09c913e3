"""nanomars/util/progress.py: what a log and a terminal show of long work, on a clock the test moves."""
import io

import pytest

import nanomars.util.progress as progress
from nanomars.util.progress import Progress


class Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    return now


def run(clock, tty, seconds_per_unit, total=100):
    stream = Stream(tty)
    p = Progress(total, "job", stream)
    p.update(what="first half")
    for i in range(total):
        clock[0] += seconds_per_unit
        p.update(1, "second half" if i + 1 == total // 2 else None)
    p.close()
    return stream.getvalue()


def test_a_log_gets_a_line_per_tenth_and_the_end(clock):
    lines = run(clock, False, 1.0).splitlines()
    assert [line.split()[1] for line in lines] == [f"{10 * k}/100" for k in range(11)]
    assert lines[0] == "job: 0/100 first half | 0:00 elapsed"
    assert lines[1] == "job: 10/100 first half | 0:10 elapsed, ~1:30 left"
    assert lines[6] == "job: 60/100 second half | 1:00 elapsed, ~0:40 left"
    assert lines[-1] == "job: 100/100 done | 1:40 elapsed"


def test_a_log_gets_few_lines_from_fast_work_and_a_sign_of_life_from_slow_work(clock):
    assert len(run(clock, False, 0.01).splitlines()) == 2  # 1 s in all: the start and the end
    slow = run(clock, False, 70.0, total=30).splitlines()  # every unit takes longer than a minute
    assert [line.split()[1] for line in slow] == [f"{k}/30" for k in range(31)]
    assert slow[20] == "job: 20/30 second half | 23:20 elapsed, ~11:40 left"
    assert "1:05:00" in run(clock, False, 39.0).splitlines()[-1]  # hours


def test_a_terminal_gets_one_line_redrawn_in_place(clock):
    out = run(clock, True, 1.0)
    assert "\n" not in out[:-1] and out.endswith("\n")
    frames = out[:-1].split("\r")[1:]
    assert len(frames) == 102  # the start, every unit (a second apart), the end
    assert frames[10].rstrip() == "job: 10/100 first half | 0:10 elapsed, ~1:30 left"
    assert frames[-1].rstrip() == "job: 100/100 done | 1:40 elapsed"


def test_print_goes_above_the_progress_line(clock, capsys):
    stream = Stream(True)
    p = Progress(2, "job", stream)
    clock[0] += 1
    p.update(1, "a")
    p.print("result a")
    assert capsys.readouterr().out == "result a\n"
    line = "job: 1/2 a | 0:01 elapsed, ~0:01 left"
    assert stream.getvalue() == "\r" + line + "\r" + " " * len(line) + "\r" + "\r" + line  # drawn, cleared, drawn
