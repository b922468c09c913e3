"""
Progress of long work (tools/bench.py, tools/evaluate.py, the experiment runners) on stderr, so stdout keeps only
the results: done / total, what runs now, time elapsed and an estimate of the rest (a straight line
through the rate so far). On a terminal it is one line redrawn in place; in a log file or a notebook it is
a plain line at the start, then each time another tenth of the work is done (but not within seconds of
the last line) or a minute has passed, and one at the end.
    progress = Progress(len(jobs), "bench")
    for job in jobs:
        progress.update(what=job.name)  # what runs now
        ...
        progress.update(1)  # one more done
        progress.print(result)  # output that goes with it (stdout)
    progress.close()
"""
import shutil
import sys
import time


def clock(seconds):
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


class Progress:
    def __init__(self, total, label, stream=None, every=60.0):  # every: the most seconds between lines in a log
        self.total, self.label, self.every = total, label, every
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.done, self.what = 0, ""
        self.start, self.shown = time.perf_counter(), float("-inf")  # when the last line was shown
        self.shown_tenth, self.width = -1, 0  # the tenth of the work and the line width last shown

    def line(self):
        elapsed = time.perf_counter() - self.start
        left = self.total - self.done
        rest = f", ~{clock(elapsed / self.done * left)} left" if self.done and left > 0 else ""
        what = f" {self.what}" if self.what else ""
        return f"{self.label}: {self.done}/{self.total}{what} | {clock(elapsed)} elapsed{rest}"

    def update(self, advance=0, what=None):
        """`advance` more units done; `what`: what runs now (shown until the next one is given)."""
        self.done += advance
        self.what = self.what if what is None else what
        now, tenth = time.perf_counter(), 10 * self.done // max(1, self.total)
        since = now - self.shown
        log_due = self.done < self.total and (since >= self.every or tenth > self.shown_tenth and since >= 5)
        if self.tty and since >= 0.1:  # a redraw is cheap, but not on every call
            self.draw()
        elif not self.tty and log_due:  # (the line at the end is close()'s)
            self.write(self.line() + "\n")
            self.shown_tenth = tenth
        else:
            return
        self.shown = now

    def draw(self):
        # wider than the terminal the line would wrap, and "\r" would only go back to its last row
        text = self.line()[:shutil.get_terminal_size().columns - 1]
        self.write("\r" + text.ljust(self.width))
        self.width = len(text)

    def write(self, text):
        self.stream.write(text)
        self.stream.flush()

    def print(self, text):
        """Prints text (stdout) above the progress line: on a terminal the line is cleared first and drawn again
        after, else the text would be written after it on the same line."""
        if self.tty:
            self.write("\r" + " " * self.width + "\r")
        print(text, flush=True)
        if self.tty:
            self.draw()

    def close(self):
        """The last line (on a terminal: the line redrawn once more, then a newline)."""
        self.what = "done"
        if self.tty:
            self.draw()
        self.write("\n" if self.tty else self.line() + "\n")
