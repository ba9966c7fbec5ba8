"""A run's start as a timeline users can read: system_logs/timeline.txt, one line per stage, from
the submit to the first output of the job, with the seconds since the submit began and the
stage's own duration.

    0.000 s  (+0.000)  submit: the job read, bound and checked
    0.041 s  (+0.041)  submit: code snapshot taken
    ...
    0.612 s  (+0.088)  launching: mpirun

Why a file of its own, written by each process as it passes a stage (the submitting CLI, the
supervisor): a slow start is found by reading it, on the emulator as on a CI runner, and the
benchmark (bench/cluster_bench.py) reads the same stages. Lines are appended whole (one write of
a short line in append mode), so processes that write in turn never mix them.
"""
from __future__ import annotations

import time
from pathlib import Path

FILE = "timeline.txt"
HEADER = "# submitted at "  # the first line: the wall-clock start every offset counts from


def path_of(run_dir: Path) -> Path:
    return run_dir / "system_logs" / FILE


def line(offset: float, step: float, stage: str) -> str:
    """One stage's line (pure)."""
    return f"{offset:8.3f} s  (+{step:.3f})  {stage}\n"


def parse(text: str) -> list[tuple[float, str]]:
    """(seconds since the submit, stage) of each line of a timeline (pure)."""
    found = []
    for row in text.splitlines():
        if row.startswith("#") or " s  (+" not in row:
            continue
        offset, rest = row.split(" s  (+", 1)
        found.append((float(offset), rest.split(")  ", 1)[1]))
    return found


class Timeline:
    """Stages appended to a run's timeline; `start` is the submit's wall-clock start."""

    def __init__(self, path: Path, start: float) -> None:
        self.path, self.start, self.last = path, start, start

    @classmethod
    def begin(cls, run_dir: Path, start: float) -> Timeline:
        """A new timeline for a submit that began at `start` (time.time())."""
        timeline = cls(path_of(run_dir), start)
        timeline.path.parent.mkdir(parents=True, exist_ok=True)
        timeline.path.write_text(f"{HEADER}{start:.3f}\n")
        return timeline

    @classmethod
    def resume(cls, run_dir: Path) -> Timeline | None:
        """The run's timeline, to go on with (the supervisor's); None when the submit wrote none."""
        path = path_of(run_dir)
        try:
            first = path.open().readline()
            start = float(first[len(HEADER):])
        except (OSError, ValueError):
            return None
        stages = parse(path.read_text())
        timeline = cls(path, start)
        timeline.last = start + (stages[-1][0] if stages else 0.0)
        return timeline

    def mark(self, stage: str, at: float | None = None) -> None:
        now = time.time() if at is None else at
        text = line(now - self.start, now - self.last, stage)
        self.last = now
        try:
            with self.path.open("a") as out:
                out.write(text)
        except OSError:
            pass  # a timeline is a report: it never fails a run
