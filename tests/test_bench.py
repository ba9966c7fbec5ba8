"""The benchmark users read figures from (bench/cluster_bench.py, bench/common.py): each step is
reported as it ends, a step over its limit is reported and the next still runs, and a benchmark
that is terminated mid-run leaves nothing behind."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import wait_until

from amlemu.backends import hostguard

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import psutil  # noqa: E402
from common import Steps, background_load  # noqa: E402 - bench/common.py


class NoRuns:
    def runs(self) -> list:
        return []


def test_a_step_over_its_limit_is_reported_and_the_next_one_runs(capsys: pytest.CaptureFixture[str]) -> None:
    steps = Steps(NoRuns())  # type: ignore[arg-type]
    assert steps.run("slow", 0.2, lambda: time.sleep(30) or {}) is None
    assert steps.run("broken", 5, lambda: 1 / 0) is None
    assert steps.run("fast", 5, lambda: {"seconds": 1.5}) == {"seconds": 1.5}
    assert steps.results["slow"]["error"] == "timed out after 0 s" and steps.results["slow"]["step_seconds"] < 5
    assert steps.results["broken"]["error"].startswith("ZeroDivisionError")
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [line["step"] for line in lines] == ["slow", "broken", "fast"]  # each printed as it ended
    assert lines[2]["seconds"] == 1.5


@pytest.mark.slow
def test_a_benchmark_terminated_mid_step_removes_everything_it_made() -> None:
    import docker  # noqa: PLC0415

    proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "cluster_bench.py"), "--backend", "docker",
                             "--steps", "cold", "--repeat", "1"], stdout=subprocess.PIPE, text=True,
                            stderr=subprocess.STDOUT)
    try:
        first = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        client = docker.from_env()
        label = {"label": f"amlemu.home={first['home_id']}"}
        wait_until(lambda: client.containers.list(filters=label), 120, "the cold step's nodes were made")
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143 and "stopped by signal SIGTERM" in out, out
    assert client.containers.list(all=True, filters=label) == [] and client.networks.list(filters=label) == []
    assert hostguard.rules(hostguard.comment(first["home_id"])) == []
    assert not Path(first["home"]).exists()
    assert [pid for pid in os.listdir("/proc") if pid.isdigit() and first["home"].encode() in cmdline(pid)] == []


def cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # ended meanwhile
        return b""


def test_the_background_load_is_a_session_of_its_own_and_ends_whole() -> None:
    """Other work is another session (the kernel's autogroup shares the CPU by session): its busy
    loops are not in the benchmark's, whose bare mpirun they would otherwise share a group with."""
    def loops() -> list[psutil.Process]:
        return [p for p in psutil.Process().children(recursive=True) if "os.fork" in " ".join(p.cmdline())]

    def gone(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # ended, its parent not yet told
        except psutil.NoSuchProcess:
            return True

    with background_load(3):
        wait_until(lambda: len(loops()) == 3, 10, "three busy loops")
        pids = [p.pid for p in loops()]
        sessions = {os.getsid(pid) for pid in pids}
        assert len(sessions) == 1 and os.getsid(0) not in sessions
    wait_until(lambda: all(gone(pid) for pid in pids), 10, "every busy loop ended")
