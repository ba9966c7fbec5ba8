"""scripts/gpu_check.sh and its helper scripts/gpu_check.py, as far as a machine without a GPU can
check them: the script stops at once, installing nothing; the helper's pure parts."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

_spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
gc = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gc  # its dataclass looks its module up there
_spec.loader.exec_module(gc)

SCRIPT = REPO / "scripts" / "gpu_check.sh"


@pytest.mark.parametrize("smi", [None, "echo 'NVIDIA-SMI has failed' >&2; exit 9", "exit 0"])
def test_without_a_gpu_it_stops_at_once_with_one_line_and_installs_nothing(tmp_path: Path, smi: str | None) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if smi is not None:
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\n{smi}\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    path = f"{bin_dir}:" + ":".join(p for p in os.environ["PATH"].split(":") if not Path(p, "nvidia-smi").exists())
    env = {**os.environ, "PATH": path, "AMLEMU_CACHE": str(tmp_path / "cache"), "AMLEMU_VENV": str(tmp_path / "venv")}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith("gpu-check: no NVIDIA GPU here") and "nothing installed" in done.stderr
    assert not (tmp_path / "cache").exists() and not (tmp_path / "venv").exists()


def test_node_layouts_say_what_one_gpu_cannot_show() -> None:
    assert gc.node_layouts(2) == [gc.Layout(2, train=True)]
    one = gc.node_layouts(1)
    assert [(layout.nodes, layout.train) for layout in one] == [(2, False), (1, True)]
    assert "shared" in one[0].note


def test_probe_problems_name_each_rank_that_sees_another_gpu_or_several() -> None:
    ok = [{"rank": 0, "count": 1, "uuids": ["aaaa-1"]}, {"rank": 1, "count": 1, "uuids": ["bbbb-2"]}]
    assert gc.probe_problems(ok, ["GPU-AAAA-1", "GPU-bbbb-2"]) == []
    assert gc.probe_problems(ok, ["GPU-aaaa-1", "GPU-aaaa-1"]) == ["rank 1 sees GPU bbbb-2, not its own GPU-aaaa-1"]
    assert gc.probe_problems([{**ok[0], "count": 2, "uuids": ["x", "y"]}], ["x", "y"]) == [
        "rank 0 sees 2 GPUs, not its 1", "rank 1 wrote no report"]


def test_nccl_evidence_from_the_timeline_or_nccls_log() -> None:
    timeline = json.dumps([{"name": "NEGOTIATE_ALLREDUCE", "ph": "B", "pid": 1},
                           {"name": "NCCL_ALLREDUCE", "ph": "B", "pid": 1}, {"ph": "E", "pid": 1}])
    assert gc.nccl_evidence(timeline[:-1] + ",", "") == ["timeline NCCL_ALLREDUCE"]  # unterminated, as written live
    log = "host:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 1 cudaDev 0 busId 1000 - Init COMPLETE\n"
    assert gc.nccl_evidence("", log) == ["NCCL communicator initialised"]
    assert gc.nccl_evidence('[{"name": "MPI_ALLREDUCE", "ph": "B"}]', "") == []
    assert gc.timeline_ops("not json") == set()


def test_the_probe_and_allreduce_scripts_compile() -> None:
    compile(gc.PROBE, "probe.py", "exec")
    compile(gc.ALLREDUCE, "allreduce.py", "exec")
    assert gc.main(["nothing"]) == 2


def test_the_seed_job_runs_as_it_is_where_this_machine_has_its_pins_else_in_this_machines_environment(
        tmp_path: Path) -> None:
    """A GPU image brings its own python and CUDA torch (the lent machines: 3.12, 2.11) and no package
    index: the check then trains the seed's job in the emulator's own environment, and says so."""
    pins = gc.env_pins((REPO / "trainer" / "environment.yml").read_text())
    assert {"python": "3.11", "torch": "2.14.1", "torchvision": "0.29.1"}.items() <= pins.items()
    same = {"python": "3.11", "torch": "2.14.1", "torchvision": "0.29.1"}
    assert gc.seed_job(tmp_path, same) == (REPO / "trainer" / "job.yml", "")
    job, said = gc.seed_job(tmp_path, {**same, "python": "3.12", "torch": "2.11.0"})
    assert said == "in this machine's environment: python 3.12 (not 3.11), torch 2.11.0 (not 2.14.1)"
    written = yaml.safe_load(job.read_text())
    original = yaml.safe_load((REPO / "trainer" / "job.yml").read_text())
    assert "environment" not in written and written["code"] == str(REPO / "trainer")
    assert {k: v for k, v in written.items() if k not in ("code",)} == \
        {k: v for k, v in original.items() if k not in ("code", "environment")}


def _deb(folder: Path, package: str, files: dict[str, str]) -> Path:
    (folder / package / "DEBIAN").mkdir(parents=True)
    (folder / package / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@example.com>\nDescription: test\n")
    for path, text in files.items():
        (folder / package / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / package / path).write_text(text)
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(folder / package),
                    str(folder / "bundle" / "debs" / f"{package}.deb")], check=True, capture_output=True)
    return folder / "bundle" / "debs" / f"{package}.deb"


def test_the_offline_setup_unpacks_only_missing_packages_and_keeps_the_usrmerge_links(tmp_path: Path) -> None:
    """A Debian 12 package holds ./bin/...: unpacked with dpkg-deb -x on the lent GPU machine, it
    replaced the image's /bin link with a folder, and /bin/sh was gone. A package whose files the
    machine has stays packed: the image's own copy is kept."""
    (tmp_path / "bundle" / "debs").mkdir(parents=True)
    _deb(tmp_path, "newtool", {"bin/newtool": "new", "usr/share/doc/newtool/copyright": "c"})
    _deb(tmp_path, "oldtool", {"usr/bin/oldtool": "debian's"})
    rootfs = tmp_path / "rootfs"
    (rootfs / "usr" / "bin").mkdir(parents=True)
    (rootfs / "bin").symlink_to("usr/bin")
    (rootfs / "usr" / "bin" / "sh").write_text("the image's shell")
    (rootfs / "usr" / "bin" / "oldtool").write_text("the image's")
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_offline_setup.sh"), str(tmp_path / "bundle"), "debs"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "AMLEMU_GPU_ROOTFS": str(rootfs), "AMLEMU_VENV": str(tmp_path / "venv"),
                               "AMLEMU_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr
    assert "unpacked: newtool" in done.stdout and "already there: oldtool" in done.stdout
    assert (rootfs / "bin").is_symlink() and (rootfs / "usr" / "bin" / "newtool").read_text() == "new"
    assert (rootfs / "bin" / "sh").read_text() == "the image's shell"
    assert (rootfs / "usr" / "bin" / "oldtool").read_text() == "the image's"
