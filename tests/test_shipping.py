"""Nodes on another host (backends/shipping.py): their disk, cache and environment are volumes on
their own engine, filled before a job and read back after it through the engine, and what comes
back from a node is read as the job's: regular files and folders only, under the folder asked for.

The pure parts as data; then a node made on this machine's engine as another host's would be (its
request says its files are shipped), through a job's whole round trip: nothing of this machine's
node folders is bound into it, what it made comes back, links and fifos do not, and its volumes go
with it."""
from __future__ import annotations

import io
import os
import tarfile
from dataclasses import replace
from pathlib import Path

import docker
import pytest
from conftest import assert_nothing_left

from amlemu.api import Emulator
from amlemu.backends import shipping
from amlemu.backends.base import LABEL, NodeRequest
from amlemu.backends.docker import DockerBackend
from amlemu.cluster import autoscale
from amlemu.errors import BackendError
from amlemu.runs.contract import job_rel
from amlemu.specs import ClusterSpec


def _member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", link: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname, info.mode = kind, len(data), link, 0o640
    return info, data


def _archive(*members: tuple[tarfile.TarInfo, bytes]) -> list[bytes]:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    raw = out.getvalue()
    return [raw[i:i + 700] for i in range(0, len(raw), 700)]  # as the engine streams it: in chunks


def test_only_regular_files_and_folders_under_the_folder_asked_for_come_back(tmp_path: Path) -> None:
    dest = tmp_path / "run"
    dest.mkdir()
    skipped = shipping.unpack(_archive(
        _member("abc", tarfile.DIRTYPE), _member("abc/exe/wd/outputs/model.txt", data=b"weights"),
        _member("abc/exe/wd/logs/../../../../escape.txt", data=b"no"),
        _member("/etc/cron.d/job", data=b"no"), _member("other/file.txt", data=b"no"),
        _member("abc/exe/wd/outputs/root", tarfile.SYMTYPE, link="/"),
        _member("abc/exe/wd/outputs/hard", tarfile.LNKTYPE, link="abc/exe/wd/outputs/model.txt"),
        _member("abc/exe/wd/outputs/fifo", tarfile.FIFOTYPE), _member("abc/dev", tarfile.CHRTYPE),
    ), dest, "abc")
    assert (dest / "exe/wd/outputs/model.txt").read_bytes() == b"weights"
    assert oct((dest / "exe/wd/outputs/model.txt").stat().st_mode & 0o777) == oct(0o640)
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) == [
        "exe", "exe/wd", "exe/wd/outputs", "exe/wd/outputs/model.txt"]
    assert not (tmp_path / "escape.txt").exists()
    assert sorted(skipped) == sorted(["/etc/cron.d/job", "other/file.txt", "exe/wd/outputs/root",
                                      "exe/wd/outputs/hard", "exe/wd/outputs/fifo", "dev", "escape.txt"])


def test_a_folder_the_archive_names_twice_does_not_lead_the_host_out(tmp_path: Path) -> None:
    """A file first, then a folder of the same name and files in it; a link planted by hand in the
    staging folder is replaced, never followed."""
    dest, outside = tmp_path / "run", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    (dest / "exe").symlink_to(outside)
    shipping.unpack(_archive(_member("abc/exe", data=b"x"), _member("abc/exe", tarfile.DIRTYPE),
                             _member("abc/exe/f.txt", data=b"in")), dest, "abc")
    assert (dest / "exe" / "f.txt").read_bytes() == b"in" and not (dest / "exe").is_symlink()
    assert list(outside.iterdir()) == []


def test_a_run_folder_cut_short_keeps_what_came_and_says_so(tmp_path: Path) -> None:
    """The engine's stream ends mid-file (its machine gone, its engine failing): one line naming the
    node, and the files that came whole are kept for collection."""
    raw = b"".join(_archive(_member("abc", tarfile.DIRTYPE), _member("abc/outputs/a.txt", data=b"a" * 100),
                            _member("abc/outputs/b.txt", data=b"b" * 5000)))

    class Api:
        @staticmethod
        def get_archive(container: str, path: str) -> tuple[list[bytes], dict]:
            assert (container, path) == ("amlemu-h-c1-node-1", "/mnt/azureml/cr/j/abc")
            return [raw[:2048]], {}

    class Client:
        api = Api()

    request = NodeRequest("h", "c1", 1, 1.0, 1 << 30, 1.0, tmp_path / "node", tmp_path / "cache", ships_files=True)
    (tmp_path / "node").mkdir()
    with pytest.raises(BackendError, match="^node c1-node-1: its run's folder came back in part: "):
        shipping.pull(Client(), request, "amlemu-h-c1-node-1", "cr/j/abc")
    assert (tmp_path / "node/cr/j/abc/outputs/a.txt").read_bytes() == b"a" * 100
    assert not (tmp_path / "node/cr/j/abc/outputs/b.txt").exists()  # cut short: not taken as whole


def test_the_cache_ships_only_what_is_new_or_changed(tmp_path: Path) -> None:
    cache = tmp_path / "data"
    (cache / "ds" / "a").mkdir(parents=True)
    (cache / "ds" / "a" / "1.bin").write_bytes(b"1")
    (cache / "ds" / "2.bin").write_bytes(b"22")
    (cache / "ds" / "link").symlink_to("/etc/passwd")
    first = shipping.listing(cache)
    assert sorted(first) == ["ds/2.bin", "ds/a/1.bin"]  # regular files only
    assert shipping.changed({}, first) == ["ds/2.bin", "ds/a/1.bin"]
    (cache / "ds" / "2.bin").write_bytes(b"333")
    (cache / "ds" / "3.bin").write_bytes(b"3")
    assert sorted(shipping.changed(first, shipping.listing(cache))) == ["ds/2.bin", "ds/3.bin"]


def test_a_packed_folder_keeps_its_links_as_links_and_names_every_folder_above(tmp_path: Path) -> None:
    root = tmp_path / "disk"
    (root / "cr/j/abc/exe/wd").mkdir(parents=True)
    (root / "cr/j/abc/exe/wd/train.py").write_text("print(1)")
    (root / "cr/j/abc/mounts").mkdir()
    (root / "cr/j/abc/mounts/ds").symlink_to("/mnt/amlemu/cache/ds")
    os.mkfifo(root / "cr/j/abc/fifo")
    with shipping.pack(root, ["cr/j/abc"]) as archive, tarfile.open(fileobj=archive) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert list(members)[:2] == ["cr", "cr/j"]
    assert members["cr/j/abc/mounts/ds"].issym() and members["cr/j/abc/mounts/ds"].linkname == "/mnt/amlemu/cache/ds"
    assert members["cr/j/abc/exe/wd/train.py"].isfile() and "cr/j/abc/fifo" not in members


# --- for real, on this machine's engine ----------------------------------------------------------
def _request(emu: Emulator, python_env: Path) -> NodeRequest:
    spec = ClusterSpec("s1", "STANDARD_D2_V2", max_nodes=1)
    return replace(autoscale.node_request(emu.home, spec, 0, host_gpus=()), ships_files=True, python_env=str(python_env))


def _sh(container: docker.models.containers.Container, script: str) -> str:
    code, out = container.exec_run(["/bin/sh", "-c", script])
    assert code == 0, out.decode()
    return out.decode()


@pytest.mark.slow
def test_a_shipped_nodes_job_folder_goes_there_and_comes_back(tmp_path: Path) -> None:
    emu = Emulator(home=tmp_path / "home", backend="docker")
    environment = tmp_path / "envs" / "e1"  # a job environment built here: shipped whole, at its own path
    (environment / "bin").mkdir(parents=True)
    (environment / "bin" / "python").symlink_to("/usr/bin/python3")
    (environment / "marker.txt").write_text("env e1")
    backend, request, client = DockerBackend(emu.home), _request(emu, environment), docker.from_env()
    run_id, name = "ship_run_1", f"amlemu-{emu.home.id}-s1-node-0"
    rel = job_rel(run_id)
    try:
        backend.create_node(request)
        node = client.containers.get(name)
        binds = {m["Destination"]: m for m in node.attrs["Mounts"]}
        assert binds["/mnt/azureml"]["Type"] == binds["/mnt/amlemu/cache"]["Type"] == "volume"
        assert binds["/mnt/amlemu/cache"]["RW"] is False and binds[str(environment)]["Type"] == "volume"
        assert _sh(node, f"cat {environment}/marker.txt; readlink {environment}/bin/python") == "env e1/usr/bin/python3\n"
        assert client.containers.list(all=True, filters={"label": f"{LABEL}.filler"}) == []  # its filler went
        assert not any(str(request.node_dir) in m.get("Source", "") or str(request.cache_dir) in m.get("Source", "")
                       for m in node.attrs["Mounts"])
        # the run's folder and the cache, staged here as for any node
        job = request.node_dir / rel
        (job / "exe/wd").mkdir(parents=True)
        (job / "exe/wd/train.py").write_text("print('hi')")
        (job / "amlemu-env.sh").write_text("export SECRET=1\n")
        (job / "amlemu-env.sh").chmod(0o600)
        (request.cache_dir / "data/ds").mkdir(parents=True)
        (request.cache_dir / "data/ds/in.txt").write_text("input")
        (job / "mounts").mkdir()
        (job / "mounts/ds").symlink_to("/mnt/amlemu/cache/ds")
        assert backend.ship_in(request, rel) == 1
        assert backend.ship_in(request, rel) == 0  # the cache entry is there already
        (request.cache_dir / "data/ds/gone.txt").write_text("soon gone")
        assert backend.ship_in(request, None) == 1
        (request.cache_dir / "data/ds/gone.txt").unlink()  # removed from storage: from the node's listing too
        assert backend.ship_in(request, None) == 0
        assert _sh(node, "ls /mnt/amlemu/cache/ds").split() == ["in.txt"]
        there = f"/mnt/azureml/{rel}"
        assert _sh(node, f"cat {there}/exe/wd/train.py {there}/mounts/ds/in.txt") == "print('hi')input"
        assert _sh(node, f"stat -c %a {there}/amlemu-env.sh").strip() == "600"
        assert "Read-only file system" in node.exec_run(["/bin/sh", "-c", "echo x > /mnt/amlemu/cache/ds/in.txt"]).output.decode()
        # the job writes outputs, a link out and a fifo; its store is read while it runs
        _sh(node, f"mkdir -p {there}/exe/wd/outputs {there}/tracking && echo 42 > {there}/exe/wd/outputs/answer.txt && "
                  f"ln -s / {there}/exe/wd/outputs/root && mkfifo {there}/exe/wd/outputs/pipe && "
                  f"echo db > {there}/tracking/mlflow.db")
        live = tmp_path / "live.db"
        assert backend.copy_out(request, f"{rel}/tracking/mlflow.db", live) and live.read_text() == "db\n"
        skipped = backend.ship_out(request, rel)
        assert sorted(skipped) == ["exe/wd/outputs/pipe", "exe/wd/outputs/root", "mounts/ds"]
        assert (job / "exe/wd/outputs/answer.txt").read_text() == "42\n" and not os.path.lexists(job / "mounts/ds")
        backend.reset_node(request)  # after the run: its disk there is emptied as the staging copy is here
        assert _sh(node, "ls -A /mnt/azureml").strip() == ""
        backend.remove_node(request)
        label = {"label": [f"{LABEL}.home={emu.home.id}"]}
        assert client.volumes.list(filters=label) == [] and client.containers.list(all=True, filters=label) == []
    finally:
        emu.cleanup()  # the cluster's network and guard too, whatever failed
        emu.store.close()
    assert_nothing_left(emu, "docker")
