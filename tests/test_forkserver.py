"""A home's fork server (emulator/forkserver.py): runs' owners forked from a process that has their
modules, known by pid and start time, refused when not the user's or not an owner, never run on
stale code, and stopped by cleanup."""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
from pathlib import Path

import psutil
import pytest

from amlemu import forkserver
from amlemu.api import Emulator
from amlemu.cluster.teardown import ours
from amlemu.specs import RunStatus
from conftest import wait_until


@pytest.fixture
def backend() -> str:
    return "process"  # the server is the same for every backend; process nodes start fastest


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # ended: the test's process has not reaped it
    except psutil.NoSuchProcess:
        return True


def _served(emu: Emulator) -> forkserver.Owner:
    """The home's server once it answers: its pid file is written before its imports, its socket
    after them (a submit before that starts its owner fresh, as it should)."""
    sock = forkserver.folder(emu.home.root) / "sock"
    return wait_until(lambda: sock.exists() and forkserver.running(emu.home.root), 60, "the home's fork server answers")


def test_owners_after_the_first_are_forked_by_the_homes_server_and_known_by_start_time(emu, cluster, make_job):
    cluster()
    assert forkserver.servers(emu.home.root) == []  # a compute alone starts nothing: a test or a dry run leaves no process
    job = make_job("print('hello from', __import__('os').environ['AZUREML_RUN_ID'])")
    first = emu.submit(job)  # no server yet: a fresh interpreter, and the server starts beside it
    assert first.wait(timeout=120) is RunStatus.COMPLETED
    server = _served(emu)
    second = emu.submit(job)
    record = emu.store.run(second.id)
    assert record.supervisor_started is not None and psutil.Process(record.supervisor_pid).ppid() == server.pid
    assert forkserver.MODULE in psutil.Process(record.supervisor_pid).cmdline()  # the server's argv, not the run's
    assert ours(record.supervisor_pid, second.id, record.supervisor_started)
    assert not ours(record.supervisor_pid, second.id, record.supervisor_started + 0.5)  # a pid reused later
    assert ours(record.supervisor_pid, second.id, record.supervisor_started + 1)  # the same, once btime moved a second
    assert second.wait(timeout=120) is RunStatus.COMPLETED
    assert f"hello from {second.id}" in second.logs(0)
    emu.cleanup()
    assert forkserver.running(emu.home.root) is None and _ended(server.pid)


def test_a_forked_supervisor_killed_is_recovered(emu, cluster, make_job):
    """Its watchdog (forked from it: the server's argv too) is known by its recorded start time."""
    cluster()
    job = make_job("import time\nprint('started', flush=True)\ntime.sleep(60)")
    emu.submit(make_job("pass")).wait(timeout=120)
    _served(emu)
    run = emu.submit(job)
    wait_until(lambda: "started" in run.logs(0), 60, "the job started")
    os.kill(run.record.supervisor_pid, signal.SIGKILL)
    wait_until(lambda: emu.store.run(run.id).status is RunStatus.FAILED, 60, "the watchdog failed the run")
    assert "supervising this run died" in emu.store.run(run.id).error


def _ask(home: Path, **request) -> dict:
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(str(forkserver.folder(home) / "sock"))
        conn.sendall(json.dumps(request).encode() + b"\n")
        return json.loads(conn.makefile().readline())


def test_the_server_forks_only_a_runs_owner_for_the_same_interpreter(emu, cluster, make_job, tmp_path):
    cluster()
    emu.submit(make_job("pass")).wait(timeout=120)
    server = _served(emu)
    base = {"argv": [str(emu.home.root), "x"], "log": str(tmp_path / "log"), "env": dict(os.environ),
            "cwd": str(tmp_path), "umask": 0o022, "executable": sys.executable}
    assert "error" in _ask(emu.home.root, **base, module="os")  # not an owner: nothing forked
    assert "error" in _ask(emu.home.root, **{**base, "executable": "/usr/bin/python3.11"}, module=forkserver.OWNERS[0])
    assert "error" in _ask(emu.home.root, **{**base, "env": {**base["env"], "PYTHONPATH": "/elsewhere"}},
                           module=forkserver.OWNERS[0])
    assert not (tmp_path / "log").exists() and forkserver.running(emu.home.root) == server  # still serving
    assert oct(os.stat(forkserver.folder(emu.home.root)).st_mode & 0o777) == "0o700"


def test_a_data_runtime_mount_is_served_by_a_fork_with_the_callers_pipes(emu, cluster, make_job, tmp_path):
    """A mount's serving process forked (its imports made once in the server, not per mount) on the
    descriptors the caller passed; a served module without them, or an owner with them, refused."""
    import fsspec

    from amlemu.actions import execute
    from amlemu.storage.dataruntime import mount as drmount
    from amlemu.storage.dataruntime.settings import Settings

    cluster()
    emu.submit(make_job("pass")).wait(timeout=120)
    server = _served(emu)
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "a.txt").write_text("through the mount")
    point, state = tmp_path / "point", tmp_path / "state"
    point.mkdir()
    record = drmount.start_process(fsspec.filesystem("file").to_json(), str(tmp_path / "store"), point, state,
                                   state / "cache", tmp_path / "logs", Settings(unmount_timeout=5),
                                   home_root=emu.home.root)
    try:
        assert (point / "a.txt").read_text() == "through the mount"
        served = psutil.Process(record.pid)
        assert served.ppid() == server.pid and forkserver.MODULE in served.cmdline()
        assert record.started == pytest.approx(served.create_time(), abs=0.05)
        base = {"argv": [], "env": dict(os.environ), "cwd": str(tmp_path), "umask": 0o022,
                "executable": sys.executable, "log": str(tmp_path / "log")}
        assert "error" in _ask(emu.home.root, **base, module=forkserver.SERVED[0])  # no descriptors
        with open(os.devnull, "rb") as null, socket.socket(socket.AF_UNIX) as conn:
            conn.connect(str(forkserver.folder(emu.home.root) / "sock"))
            socket.send_fds(conn, [json.dumps({**base, "module": forkserver.OWNERS[0]}).encode() + b"\n"],
                            [null.fileno()] * 3)
            assert "error" in json.loads(conn.makefile().readline())
        assert not (tmp_path / "log").exists()
    finally:
        execute(drmount.plan_unmount(state))
    assert not drmount.is_mounted(point) and _ended(record.pid)


def test_code_changed_on_disk_is_stale(tmp_path: Path) -> None:
    """An upgrade or an edit since the server started: it stops forking the old code."""
    module = tmp_path / "m.py"
    module.write_text("x = 1\n")
    stamp = {str(module): module.stat().st_mtime_ns}
    assert not forkserver._stale(stamp)
    os.utime(module, ns=(module.stat().st_atime_ns, module.stat().st_mtime_ns + 1_000_000))
    assert forkserver._stale(stamp)
    module.unlink()
    assert forkserver._stale(stamp)


def test_cleanup_plans_to_stop_the_server(emu, cluster, make_job):
    cluster()
    emu.submit(make_job("pass")).wait(timeout=120)
    server = _served(emu)
    stops = [a for a in emu.plan_cleanup() if a.what == "fork server"]
    assert [a.name for a in stops] == [str(server.pid)]


def test_a_cleanup_right_after_the_first_submit_stops_the_server_being_started(emu, cluster, make_job):
    """The server starts beside the home's first run; a cleanup before it has imported anything
    (before it wrote its own pid file, even) still ends it: the emu fixture finds no process left."""
    cluster()
    emu.submit(make_job("pass"))
    assert forkserver.servers(emu.home.root) != []
    emu.cleanup()
    assert forkserver.servers(emu.home.root) == []
