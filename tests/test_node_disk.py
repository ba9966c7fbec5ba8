"""A node's disk cannot fill the home, a state database error never decides a run, state files are
written whole, and a dead supervisor's run is claimed once (robustness, issue 25)."""
from __future__ import annotations

import os
import re
import shutil
import sqlite3
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import wait_until

from amlemu import statefile
from amlemu.api import Emulator
from amlemu.backends import nodedisk
from amlemu.cluster.store import Store
from amlemu.errors import BackendError, ConfigError
from amlemu.home import Home
from amlemu.jobs.jobspec_io import job_to_record
from amlemu.jobs.jobyaml import load_job
from amlemu.runs.supervisor import Supervisor
from amlemu.specs import RunStatus

MIB = 1 << 20
# Writes a little output, then fills its node's disk (outside ./outputs) until ENOSPC, and exits 3.
FILLS_ITS_DISK = """
import os, sys
with open("outputs/kept.txt", "w") as out:
    out.write("written before the disk filled")
written = 0
try:
    with open("../filler.bin", "wb") as out:
        while True:
            out.write(b"x" * (1 << 20))
            out.flush()
            os.fsync(out.fileno())
            written += 1 << 20
except OSError as exc:
    print(f"wrote {written} bytes, then: {exc}", flush=True)
    sys.exit(3)
"""


def _loops_of(home: Path) -> list[str]:
    """The loop devices backed by this home's images (kept outside the home: nodedisk.IMAGE_ROOT)."""
    listed = subprocess.run(["losetup", "--list", "--noheadings", "--output", "BACK-FILE"], capture_output=True,
                            text=True, check=True).stdout
    return [line for line in listed.splitlines() if str(nodedisk.IMAGE_ROOT / Home(home).id) in line]


def test_a_job_that_fills_its_node_disk_fails_alone_keeping_its_exit_code(
        emu: Emulator, cluster, make_job, monkeypatch: pytest.MonkeyPatch) -> None:
    """64 MiB node disks (the setting; the VM size's is 100 GiB): the job gets ENOSPC in its own
    log after writing less than its disk, its own exit code and reason are the run's, what it wrote
    to ./outputs is kept, and removing the nodes leaves no mount or loop device behind."""
    assert os.geteuid() == 0, "node disks are file systems of their own only as root: run the suite as root"
    monkeypatch.setenv(nodedisk.SETTING, "0.0625")  # the supervisor inherits it from the submitter
    cluster()
    run = emu.submit(make_job(FILLS_ITS_DISK, nodes=1, distribution="none"))
    assert run.wait(timeout=180) is RunStatus.FAILED
    assert run.record.exit_code == 3
    assert run.record.error.startswith("the job exited with code 3"), run.record.error
    assert "No space left on device" in run.record.error
    written = int(re.search(r"wrote (\d+) bytes", run.logs(0)).group(1))
    assert 20 * MIB < written < 64 * MIB  # it filled its own disk, no more
    assert (run.outputs / "kept.txt").read_text() == "written before the disk filled"
    lifecycle = (run.dir / "system_logs" / "lifecycle.txt").read_text()
    assert f"a node's local disk is 0.0625 GiB (the VM size's is 100 GiB), capped by {nodedisk.SETTING}=0.0625" \
        in lifecycle
    assert not (run.dir / "filler.bin").exists()
    emu.cleanup()
    assert nodedisk.mounted_under(emu.home.root) == [] and _loops_of(emu.home.root) == []
    assert not (nodedisk.IMAGE_ROOT / emu.home.id).exists()  # the images went with their disks


@pytest.mark.parametrize("backend", ["docker"], indirect=True)
def test_cleanup_unmounts_a_node_disk_it_has_no_record_of(emu: Emulator) -> None:
    """A node disk left mounted (its node's record lost) is found in the mount table and removed."""
    node_dir = emu.home.node_dir("c9", "c9-node-0")
    nodedisk.attach(node_dir, 40 * MIB)
    assert os.path.ismount(node_dir) and _loops_of(emu.home.root)
    assert node_dir in nodedisk.every_home_disk()  # what `cleanup --all-homes` finds (not run here: others' homes)
    plan = emu.plan_cleanup()
    assert [(a.verb, a.what, a.name) for a in plan if a.what == "node disk"] == [("unmount", "node disk", str(node_dir))]
    emu.cleanup()
    assert nodedisk.mounted_under(emu.home.root) == [] and _loops_of(emu.home.root) == []
    assert not nodedisk.image_path(node_dir).exists()


def test_node_disk_size_follows_the_vm_size_the_setting_and_free_space(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    gib = nodedisk.GIB
    monkeypatch.delenv(nodedisk.SETTING, raising=False)
    monkeypatch.setattr(nodedisk, "limited", lambda: True)
    monkeypatch.setattr(nodedisk.shutil, "disk_usage", lambda _: SimpleNamespace(free=1000 * gib))
    assert nodedisk.size(14 * gib) == (10 * gib, "a node's local disk is 10 GiB (the VM size's is 14 GiB), "
                                                 f"capped by {nodedisk.SETTING}=10")
    monkeypatch.setenv(nodedisk.SETTING, "100")
    assert nodedisk.size(14 * gib) == (14 * gib, None)  # the VM size's own
    monkeypatch.setattr(nodedisk.shutil, "disk_usage", lambda _: SimpleNamespace(free=8 * gib))
    size, notice = nodedisk.size(14 * gib)
    assert size == 4 * gib and notice.endswith(f"capped by half the free space where node disks are kept ({nodedisk.IMAGE_ROOT})")
    monkeypatch.setenv(nodedisk.SETTING, "0")
    assert nodedisk.size(14 * gib)[0] is None
    for bad in ("ten", "-1", "nan", "inf"):
        monkeypatch.setenv(nodedisk.SETTING, bad)
        with pytest.raises(ConfigError, match=nodedisk.SETTING):
            nodedisk.size(14 * gib)
    monkeypatch.setattr(nodedisk, "limited", lambda: False)
    monkeypatch.setenv(nodedisk.SETTING, "10")
    size, notice = nodedisk.size(14 * gib)
    assert size is None and "no size limit" in notice


def test_a_state_file_is_replaced_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state" / "plan.json"
    statefile.write_json(path, {"v": 1})
    real_replace = os.replace

    def killed_mid_write(src, dst):  # type: ignore[no-untyped-def]
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(statefile.os, "replace", killed_mid_write)
    with pytest.raises(OSError):
        statefile.write_json(path, {"v": 2})
    assert path.read_text() == '{"v": 1}' and sorted(p.name for p in path.parent.iterdir()) == ["plan.json"]
    monkeypatch.setattr(statefile.os, "replace", real_replace)
    statefile.write_text(path, "secret", owner_only=True)
    assert path.read_text() == "secret" and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_dead_supervisors_run_is_claimed_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "amlemu.db")
    store.add_run("r1", "e", "c1", {})
    store.update_run("r1", supervisor_pid=111)
    assert store.claim_run("r1", 111, 222) and not store.claim_run("r1", 111, 333)
    store.set_status("r1", RunStatus.FAILED, "done")
    assert not store.claim_run("r1", 222, 333)  # an ended run is nobody's to recover
    store.close()


@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_a_state_database_error_never_replaces_the_jobs_outcome(emu: Emulator, cluster, make_job,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The store refuses Finalizing and the first two tries of the final status ("database or disk
    is full"): the run still ends Failed with the job's own exit code and reason, outputs kept."""
    cluster()
    job = load_job(make_job("open('outputs/kept.txt', 'w').write('kept')\nraise SystemExit(3)\n",
                            distribution="none"))
    run_id = "db_full_1"
    shutil.copytree(job.code, emu.home.run_dir(run_id) / "snapshot")
    emu.store.add_run(run_id, job.experiment_name, "c1", job_to_record(job))
    emu.store.set_status(run_id, RunStatus.QUEUED)
    refusals = {RunStatus.FINALIZING: 1, RunStatus.FAILED: 2}
    real = Store.set_status

    def full_disk(self, run, status, *args, **kwargs):  # type: ignore[no-untyped-def]
        if refusals.get(status, 0) > 0 and kwargs.get("db") is None:
            refusals[status] -= 1
            raise sqlite3.OperationalError("database or disk is full")
        return real(self, run, status, *args, **kwargs)
    monkeypatch.setattr(Store, "set_status", full_disk)
    Supervisor(emu.home, run_id).run()  # in this process: the patched store is the one it writes
    run = emu.run(run_id)
    assert run.status is RunStatus.FAILED and refusals == {RunStatus.FINALIZING: 0, RunStatus.FAILED: 0}
    assert run.record.exit_code == 3 and run.record.error.startswith("the job exited with code 3"), run.record.error
    assert (run.outputs / "kept.txt").read_text() == "kept"
    lifecycle = (run.dir / "system_logs" / "lifecycle.txt").read_text()
    assert lifecycle.count("the state database refused status") == 3
    wait_until(lambda: emu.store.nodes("c1") == [], 30, "the idle node was scaled down")


def test_a_disk_another_detach_unmounted_meanwhile_is_not_an_error(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A scale-down and a compute deletion can both remove a node: the second finds the disk
    mounted, then its umount fails because the first has unmounted it. That is done, not a failure."""
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    seen = iter([True])  # mounted when first looked at; gone (another detach) from then on
    monkeypatch.setattr(nodedisk.os.path, "ismount", lambda _path: next(seen, False))
    nodedisk.detach(node_dir)  # `umount` itself answers "not mounted"
    monkeypatch.setattr(nodedisk.os.path, "ismount", lambda _path: True)
    with pytest.raises(BackendError, match=r"a node's disk: `umount --lazy .*` failed"):  # still mounted: an error
        nodedisk.detach(node_dir)


def test_whether_disks_are_limited_is_not_kept_from_another_user(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worked out once per user: an answer found while a test posed as another user (or ran with
    another PATH) once made a session's dry runs disagree with what their supervisors launched."""
    assert nodedisk.limited()  # root here, with loop devices (the suite's machine)
    with monkeypatch.context() as posing:
        posing.setattr(nodedisk.os, "geteuid", lambda: 1000)
        assert not nodedisk.limited()
    assert nodedisk.limited()
