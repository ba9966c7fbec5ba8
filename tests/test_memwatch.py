"""Memory per rank (emulator/runs/memwatch.py): measured while a job runs on either backend, kept
for the next submit of the same job, which is refused before anything is made when its ranks
cannot fit in this machine's memory; and the rule that stops a run driving the machine out of it."""
from __future__ import annotations

import threading

import psutil
import pytest

from amlemu.api import Emulator
from amlemu.errors import ConfigError
from amlemu.jobs.jobyaml import load_job
from amlemu.runs import memwatch
from amlemu.runs.memwatch import GIB, MIB, MemWatch, RankMemory, fit_problem, low_memory
from amlemu.specs import RunStatus
from amlemu.validate import check_job

HOLD = """
import time
held = b"x" * (160 * 2 ** 20)  # written, so resident: anonymous memory the rank holds
time.sleep(2.5)  # the watch samples each second
print(len(held))
"""


def test_a_figure_says_how_many_ranks_fit_and_nothing_is_refused_unmeasured() -> None:
    figure = RankMemory(500 * MIB, "run_7", ranks=2)
    assert fit_problem(None, 10_000, 1 * GIB) is None  # never measured: no guess
    assert fit_problem(figure, 16, 10 * GIB) is None  # 7.8 GiB of 9 GiB usable
    problem = fit_problem(figure, 64, 10 * GIB)
    assert problem == ("64 ranks need about 31.2 GiB: each held 500 MiB at its peak in run run_7, and this "
                       "machine has 10.0 GiB available; at most 18 such ranks fit")


def test_a_run_is_stopped_only_when_the_machine_is_nearly_out_of_memory_by_the_jobs_doing() -> None:
    total = 16 * GIB
    assert low_memory(available=500 * MIB, total=total, job_bytes=8 * GIB)
    assert not low_memory(available=500 * MIB, total=total, job_bytes=1 * GIB)  # something else holds it
    assert not low_memory(available=2 * GIB, total=total, job_bytes=14 * GIB)  # still room


def test_the_figure_is_per_environment_and_script_not_per_argument(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("")
    base = "code: src\ncompute: azureml:c1\nenvironment: {image: python:3.11-slim}\ncommand: python train.py "
    (tmp_path / "a.yml").write_text(base + "--lr 0.1\n")
    (tmp_path / "b.yml").write_text(base + "--lr 0.5 --batch 64\n")
    (tmp_path / "c.yml").write_text(base.replace("3.11", "3.12") + "--lr 0.1\n")
    a, b, c = (memwatch.figure_key(load_job(tmp_path / f"{n}.yml")) for n in "abc")
    assert a == b and a != c and a.endswith("| train.py")


def test_the_watch_keeps_the_peak_per_rank_and_warns_once() -> None:
    sizes = iter([100 * MIB, 300 * MIB, 200 * MIB])
    watch = MemWatch(lambda: {}, threading.Event(), on_low=lambda reason: None)
    watch.nodes = {"n0": (lambda: [1], 2)}
    memwatch_anon = memwatch.anon_bytes
    try:
        memwatch.anon_bytes = lambda pid: next(sizes)  # type: ignore[assignment]
        for _ in range(3):
            watch.sample()
    finally:
        memwatch.anon_bytes = memwatch_anon  # type: ignore[assignment]
    assert watch.peak_per_rank == 150 * MIB  # the node's 300 MiB over its 2 ranks


def test_anonymous_memory_is_read_for_a_live_process_and_zero_for_a_gone_one() -> None:
    assert memwatch.anon_bytes(psutil.Process().pid) > 1 * MIB
    assert memwatch.anon_bytes(2 ** 22 + 7) == 0


@pytest.mark.parametrize("backend", ["process", "docker"], indirect=True)
def test_a_jobs_ranks_are_measured_and_a_submit_that_cannot_fit_is_refused_before_anything_is_made(
        emu: Emulator, cluster, make_job) -> None:  # type: ignore[no-untyped-def]
    cluster()
    job = make_job(HOLD, nodes=2, name="hold")
    run = emu.submit(job)
    assert run.wait(timeout=180) is RunStatus.COMPLETED, run.record.error
    figure = memwatch.recorded(emu.home.root, memwatch.figure_key(load_job(job)))
    assert figure is not None and figure.run_id == run.id and figure.ranks == 2
    assert 150 * MIB <= figure.bytes < 400 * MIB, figure  # the 160 MiB it held, with its node's share
    per_node = int(psutil.virtual_memory().available / figure.bytes / 2 * 1.5) + 1  # half again more than fit
    runs_before = len(emu.store.runs())
    with pytest.raises(ConfigError) as refused:
        emu.submit(job, overrides=[f"distribution.process_count_per_instance={per_node}"])
    assert refused.value.field == "resources.instance_count"
    assert f"{2 * per_node} ranks need about" in str(refused.value) and f"in run {run.id}" in str(refused.value)
    assert len(emu.store.runs()) == runs_before  # refused before anything was made
    findings = check_job(load_job(job, [f"distribution.process_count_per_instance={per_node}"]), emu)
    assert [f.severity for f in findings if f.field == "resources.instance_count"] == ["error"]  # job validate says it
