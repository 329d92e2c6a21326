"""Console progress of a run (rounds) and of a sweep (runs).

When the stream is a terminal: a tqdm bar with the latest numbers and the time
left. Otherwise (CI, `ray job submit` logs, a file): one plain line per event,
with the same numbers and the time left, so logs stay readable.
"""
from __future__ import annotations

import sys
import threading
import time

from tqdm import tqdm

BAR_FORMAT = "{desc} {n_fmt}/{total_fmt} {unit} |{bar}| {elapsed} elapsed, ETA {remaining}{postfix}"


def _line(stream, text: str) -> None:
    """`text` and its newline in one write: `print` makes two, between which a line that Ray's log thread prints
    from a worker could land, inside ours."""
    stream.write(text + "\n")
    stream.flush()


def _eta(elapsed: float, finished: int, total: int) -> str:
    if not finished:
        return "?"
    return tqdm.format_interval(elapsed / finished * (total - finished))


class RunProgress:
    """Rounds of one run: `update(record)` after each round (a metrics.jsonl record). A resumed run starts at
    `first` (the rounds its checkpoint holds): it shows the run's own round numbers, and its time left comes from
    the rounds this process trained."""

    def __init__(self, name: str, rounds: int, stream=None, first: int = 0):
        self.name, self.rounds, self.first, self.done, self.t0 = name, rounds, first, first, time.monotonic()
        self.stream = stream or sys.stdout
        self.bar = (tqdm(total=rounds, initial=first, desc=name, unit="rounds", file=self.stream,
                         bar_format=BAR_FORMAT, dynamic_ncols=True, mininterval=0) if self.stream.isatty() else None)

    def update(self, rec: dict) -> None:
        self.done += 1
        acc = rec.get("accuracy")  # None: a round the evaluation schedule skips
        if self.bar is not None:
            avg = "AVG not evaluated" if acc is None else f"AVG {acc['AVG']:.2f}"
            self.bar.set_postfix_str(f"{avg}, loss {rec['train_loss']:.4f}", refresh=False)
            self.bar.update(1)
            return
        doms = "not evaluated" if acc is None else "  ".join(f"{d} {v:5.2f}" for d, v in acc.items())
        eta = _eta(time.monotonic() - self.t0, self.done - self.first, self.rounds - self.first)
        _line(self.stream, f"[{self.name}] round {self.done}/{self.rounds}  loss {rec['train_loss']:.4f}  {doms}  "
                           f"({rec['time_s']['round']:.1f}s, ETA {eta})")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class SweepProgress:
    """Runs of a sweep: counts done, running, failed and left, with the time left; thread-safe. Given the `rounds`
    each run has left to train (run name -> rounds), the time left comes from the rounds trained so far (`round`,
    after each round of a run: a line for each evaluated one) against those left (a run that ends, failed or not,
    has none left), else from the runs finished."""

    def __init__(self, total: int, stream=None, rounds: dict[str, int] | None = None):
        self.total, self.done, self.running, self.failed = total, 0, 0, 0
        self.rounds_left, self.trained = (None if rounds is None else dict(rounds)), 0
        self.t0, self.lock = time.monotonic(), threading.Lock()
        self.stream = stream or sys.stdout
        # on a terminal a bar over the rounds when they are given (its time left then comes from them), else the runs
        self.bar = (tqdm(total=sum(rounds.values()) if rounds else total, desc="sweep",
                         unit="rounds" if rounds else "runs", file=self.stream, bar_format=BAR_FORMAT,
                         dynamic_ncols=True, mininterval=0) if self.stream.isatty() else None)

    def counts(self) -> str:
        left = self.total - self.done - self.failed - self.running
        elapsed = time.monotonic() - self.t0
        eta = (_eta(elapsed, self.trained, self.trained + sum(self.rounds_left.values())) if self.rounds_left else
               _eta(elapsed, self.done + self.failed, self.total))
        return f"{self.done} done, {self.running} running, {self.failed} failed, {left} left, ETA {eta}"

    def _show(self, line: str | None) -> None:
        if self.bar is None:
            if line:
                _line(self.stream, f"[{self.counts()}] {line}")
            return
        if line:
            self.bar.write(line + "\n", file=self.stream, end="")  # one write, as `_line`'s
        if self.rounds_left:
            self.bar.total, self.bar.n = self.trained + sum(self.rounds_left.values()), self.trained
        else:
            self.bar.n = self.done + self.failed
        left = self.total - self.done - self.failed - self.running
        done = f"{self.done} done, " if self.rounds_left else ""
        self.bar.set_postfix_str(f"{done}{self.running} running, {self.failed} failed, {left} left", refresh=False)
        self.bar.refresh()

    def started(self, name: str) -> None:
        with self.lock:
            self.running += 1
            self._show(None if self.bar is not None else f"started {name}")

    def round(self, name: str, round_idx: int, rounds: int, avg: float | None) -> None:
        """Run `name` trained round `round_idx` (0-based) of its `rounds`; `avg` its AVG accuracy, None where the
        evaluation schedule skipped it (no line then)."""
        with self.lock:
            self.trained += 1
            if self.rounds_left:
                self.rounds_left[name] = max(0, self.rounds_left.get(name, 1) - 1)
            self._show(None if avg is None or self.bar is not None else
                       f"{name}: round {round_idx + 1}/{rounds}, AVG {avg:.2f}")

    def finished(self, name: str, summary: dict) -> None:
        with self.lock:
            self.running -= 1
            self.done += 1
            self.ended(name)
            # both metrics: FPL's tables read the last-5 mean, FedPLVM's and FedProto's the final round
            last5 = "" if summary["last5"] is None else f", {summary['last5']['AVG']:.2f} last-5 mean"
            self._show(f"{name}: AVG {summary['final']['AVG']:.2f} final{last5} ({summary['wall_time_s']:.0f}s)")

    def failed_run(self, name: str, message: str) -> None:
        with self.lock:
            self.running -= 1
            self.failed += 1
            self.ended(name)
            self._show(f"{name} FAILED: {message}")

    def ended(self, name: str) -> None:
        """Run `name` trains no more rounds (it finished, or failed with rounds untrained)."""
        if self.rounds_left:
            self.rounds_left[name] = 0

    def close(self) -> float:
        """Closes the bar; returns the seconds since the start."""
        if self.bar is not None:
            self.bar.close()
        return time.monotonic() - self.t0
