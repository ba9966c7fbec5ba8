"""A run's start as a timeline users can read (system_logs/timeline.txt, runs/timeline.py): each
stage from the submit to the job's first output, in order, with its own duration."""
from __future__ import annotations

from pathlib import Path

import pytest

from amlemu.api import Emulator
from amlemu.runs import timeline
from amlemu.runs.timeline import Timeline
from amlemu.specs import RunStatus


def test_stages_are_written_in_turn_by_each_process_and_read_back(tmp_path: Path) -> None:
    first = Timeline.begin(tmp_path, start=1000.0)
    first.mark("submit: checked", at=1000.25)
    later = Timeline.resume(tmp_path)  # another process (the supervisor) goes on with it
    assert later is not None and later.start == 1000.0 and later.last == 1000.25
    later.mark("launched", at=1001.0)
    text = timeline.path_of(tmp_path).read_text()
    assert "   1.000 s  (+0.750)  launched" in text  # since the submit, and the stage's own time
    assert timeline.parse(text) == [(0.25, "submit: checked"), (1.0, "launched")]
    assert Timeline.resume(tmp_path / "no-run") is None  # a run the submit wrote none for


@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_a_submitted_runs_timeline_goes_from_the_submit_to_the_jobs_first_output(emu: Emulator, cluster,
                                                                                 make_job) -> None:
    cluster()
    run = emu.submit(make_job("print('hello', flush=True)", nodes=2))
    assert run.wait(timeout=120) is RunStatus.COMPLETED
    stages = timeline.parse(timeline.path_of(run.outputs.parent).read_text())
    names = [name for _, name in stages]
    assert names[0].startswith("submit:") and names[-1] == "first output of the job", names
    for stage in ("supervisor ready", "nodes allocated", "environment ready", "launch planned",
                  "node folders and env files laid out", "inputs ready", "launching: mpirun"):
        assert any(name.startswith(stage) for name in names), (stage, names)
    offsets = [offset for offset, _ in stages]
    assert offsets == sorted(offsets) and offsets[0] >= 0  # in the order they happened
