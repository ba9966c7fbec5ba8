"""The pytest plugin as a user meets it: the example tests in parallel under xdist with nothing
left behind, failure messages that carry the run's story, strict mode, the reaper, GPU masking."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import docker
import psutil
import pytest
from conftest import FULL, REPO, TRAINING

from amlemu.api import Emulator
from amlemu.backends import get_backend
from amlemu.cluster import autoscale
from amlemu.cluster import gpus
from amlemu.home import Home
from amlemu.specs import ClusterSpec
from pytest_amlemu.plugin import _sessions_dir, command_line, reap_dead_sessions

pytestmark = pytest.mark.slow


def _pytest(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=900, env={**os.environ, **(env or {})})


def _made_by(homes: list[Path]) -> set[str]:
    """The containers and networks of these homes (other tests may run beside this one, under xdist)."""
    ids = {Home(home.resolve()).id for home in homes}
    api = docker.from_env().api  # list entries as they are: the SDK's list() inspects each one, and raises
    # NotFound when another test removes one in between
    containers = [(c["Names"][0].lstrip("/"), c.get("Labels")) for c in api.containers(all=True, filters={"label": "amlemu"})]
    networks = [(n["Name"], n.get("Labels")) for n in api.networks(filters={"label": "amlemu"})]
    return {name for name, labels in containers + networks if (labels or {}).get("amlemu.home") in ids}


def test_the_plugin_is_registered_by_the_package() -> None:
    entry = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    assert entry == {"amlemu": "pytest_amlemu.plugin"}
    out = _pytest("--help").stdout
    assert "--aml-backend" in out and "--aml-strict" in out


CONVERGES = "examples/test_converges_on_two_nodes.py::test_mnist_reaches_90_percent_on_two_nodes"


# `make test` runs every example but the MNIST one's 90%: a figure (6,000 images x 2 epochs on 2
# docker nodes, ~30 CPU-s), where the trainer learning on docker nodes is shown by test_seed_notebook
# and test_faults (2,000 images), aml_run.script's inputs by the shard example, a local folder as a
# job's input by test_job_resource, and run.metrics() / metric_history() by test_faults and
# test_metrics. `make test-full` runs them all.
@pytest.mark.parametrize("full", [pytest.param(False, marks=pytest.mark.long),  # a minute: not at the end
                                  pytest.param(True, marks=[FULL, TRAINING])], ids=["quick", "full"])
def test_the_examples_run_in_parallel_on_docker_nodes_and_leave_nothing(tmp_path: Path, full: bool) -> None:
    done = _pytest("-n", "2", "examples", "--aml-backend", "docker", "--aml-strict", "-q", "-rs",
                   f"--basetemp={tmp_path / 'base'}", *([] if full else ["--deselect", CONVERGES]))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert ("6 passed, 1 skipped in" if full else "5 passed, 1 skipped in") in done.stdout, done.stdout[-3000:]
    assert "needs an NVIDIA GPU: nvidia-smi shows none on this machine" in done.stdout
    homes = sorted(h for h in (tmp_path / "base").glob("*/amlemu-home*") if not h.is_symlink())  # not pytest's *current
    assert len(homes) == 2, homes  # one per xdist worker
    assert _made_by(homes) == set()


BOOM = """
import os, sys
rank = os.environ["OMPI_COMM_WORLD_RANK"]
print(f"rank {rank} reading its shard", flush=True)
if rank == "1":
    print("about to fail: shard 1 is corrupt", flush=True)
    sys.exit(3)
"""
USER_TEST = """
from pathlib import Path
import pytest

@pytest.mark.aml(nodes=2)
def test_training_on_two_nodes(aml_run):
    aml_run.script(Path(__file__).with_name("boom.py"))

def test_needs_an_emulator(aml_emulator):
    assert aml_emulator.home.root.exists()
"""


def test_a_failed_run_fails_the_test_with_its_status_rank_and_log_tail(tmp_path: Path) -> None:
    (tmp_path / "boom.py").write_text(textwrap.dedent(BOOM))
    (tmp_path / "test_user.py").write_text(textwrap.dedent(USER_TEST))
    done = _pytest(str(tmp_path / "test_user.py"), "--aml-backend", "process", "-q", cwd=tmp_path)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "RunFailed: expected Completed, but run" in done.stdout
    assert "ended Failed: rank 1 on node" in done.stdout and "failed with exit code 3" in done.stdout
    assert "about to fail: shard 1 is corrupt" in done.stdout  # the tail of the failing rank's log
    assert "1 failed, 1 passed" in done.stdout


HANG = """
import time
print("rank 0 waiting for a peer that never answers", flush=True)
time.sleep(600)
"""
HANG_TEST = """
from pathlib import Path
import pytest

@pytest.mark.aml(nodes=1, timeout=15)
def test_a_job_that_hangs(aml_run):
    aml_run.script(Path(__file__).with_name("hang.py"))
"""


def test_a_run_past_the_tests_limit_is_canceled_and_fails_the_test_with_its_story(tmp_path: Path) -> None:
    (tmp_path / "hang.py").write_text(textwrap.dedent(HANG))
    (tmp_path / "test_hang.py").write_text(textwrap.dedent(HANG_TEST))
    inner = tmp_path / "inner"  # the inner session's temporary folders: its home is in there
    done = _pytest(str(tmp_path / "test_hang.py"), "--aml-backend", "process", "-q", "--basetemp", str(inner),
                   cwd=tmp_path)
    out = done.stdout
    assert done.returncode == 1 and "1 failed" in out, out[-3000:]
    assert "RunFailed: run " in out and " did not end within 15 s (it was Running on node(s) t" in out, out[-3000:]
    assert "-node-0) and was canceled: it ended Canceled; last lines of rank 0:" in out, out[-3000:]
    assert "rank 0 waiting for a peer that never answers" in out, out[-3000:]  # the log tail
    left = [p.pid for p in psutil.process_iter(["cmdline"])  # the sandbox (its home's paths), the job
            if any(str(inner) in a or a == "hang.py" for a in p.info["cmdline"] or [])]
    assert left == [], f"the canceled run left processes behind: {left}"
    home = inner / "amlemu-home0"
    assert (home / "amlemu.db").exists()  # the session's home: no node folders left in it
    assert [p for sub in ("nodes", "caches", "process-nodes") for p in (home / sub).glob("*/*")] == []


def test_without_docker_the_aml_tests_skip_or_with_strict_fail(tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(textwrap.dedent(USER_TEST))
    no_engine = {"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    skipped = _pytest(str(tmp_path / "test_user.py"), "-k", "needs", "--aml-backend", "docker", "-q", "-rs",
                      cwd=tmp_path, env=no_engine)
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout
    assert "amlemu backend docker is not usable here: no Docker engine answers" in skipped.stdout
    strict = _pytest(str(tmp_path / "test_user.py"), "-k", "needs", "--aml-backend", "docker", "--aml-strict",
                     "-q", cwd=tmp_path, env=no_engine)
    assert strict.returncode == 1 and "amlemu backend docker is not usable here" in strict.stdout


def test_what_a_killed_session_left_is_reaped_by_the_next(tmp_path: Path) -> None:
    emu = Emulator(home=tmp_path / "home", backend="docker")
    emu.create_compute(ClusterSpec("left", "STANDARD_D2_V2", min_nodes=1, max_nodes=1))
    assert len(get_backend("docker", emu.home).list_nodes()) == 1
    dead = psutil.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    record = _sessions_dir() / "killed-session-test.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"pid": dead.pid, "started": dead.create_time(), "homes": [str(emu.home.root)]}))
    gone = reap_dead_sessions()
    assert any("left-node-0" in item for item in gone), gone
    assert get_backend("docker", emu.home).list_nodes() == [] and not record.exists()


def test_each_node_gets_its_own_gpus(tmp_path: Path) -> None:
    assert gpus.assign(("0", "1", "2", "3"), 1, 2) == ("2", "3")
    assert gpus.assign(("0", "1"), 3, 1) == ("1",)  # more nodes than GPUs: round robin
    assert gpus.assign((), 0, 1) == () and gpus.assign(("0",), 0, 0) == ()
    emu = Emulator(home=tmp_path / "home")
    spec = ClusterSpec("gpu", "Standard_NC12s_v3", max_nodes=2)  # 2 V100 per node
    requests = [autoscale.node_request(emu.home, spec, i, host_gpus=("0", "1", "2", "3")) for i in (0, 1)]
    assert [r.gpus for r in requests] == [("0", "1"), ("2", "3")]
    assert get_backend("docker", emu.home).plan_node(requests[1]).gpus == ("2", "3")
    assert get_backend("process", emu.home).node_env(requests[1])["CUDA_VISIBLE_DEVICES"] == "2,3"
    none = autoscale.node_request(emu.home, ClusterSpec("cpu", "STANDARD_D2_V2"), 0, host_gpus=("0",))
    assert get_backend("process", emu.home).node_env(none)["CUDA_VISIBLE_DEVICES"] == ""


def test_the_gpus_nodes_get_are_the_ones_this_process_may_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-smi (a fake with four GPUs) narrowed by CUDA_VISIBLE_DEVICES, asked once until reset."""
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nprintf '0\\n1\\n2\\n3\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    gpus.reset()  # whatever an earlier test (or the plugin's gpu marker) cached
    try:
        assert gpus.visible_gpus() == ("1", "3")
        home = Emulator(home=tmp_path / "home").home
        spec = ClusterSpec("gpu", "Standard_NC6s_v3", max_nodes=2)  # 1 V100 per node
        assert [autoscale.node_request(home, spec, i).gpus for i in (0, 1)] == [("1",), ("3",)]
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
        assert gpus.visible_gpus() == ("1", "3")  # cached: nvidia-smi is not asked per node
        gpus.reset()
        assert gpus.visible_gpus() == ("0", "1", "2", "3")
    finally:
        gpus.reset()  # later tests see this machine's real GPUs


def test_command_line_keeps_bindings_for_the_platform() -> None:
    assert command_line(["python", "t.py", "--data", "${{inputs.data}}", "a b"]) == \
        "python t.py --data ${{inputs.data}} 'a b'"
