"""A job is untrusted code (a pull request's, in CI): on both backends, nothing it declares or does
runs on the host, reaches another run, the submitter's environment or the Docker engine, or
outlives the run. Each attempt is made by a real job; the job reports what it saw."""
from __future__ import annotations

import json
import os
import stat
import sys
import uuid
from pathlib import Path

import pytest
from conftest import job_processes, wait_until

from amlemu.api import Emulator
from amlemu.runs.contract import run_folder_id
from amlemu.specs import RunStatus

pytestmark = pytest.mark.slow

# The hostile job: argv = a host folder it should not reach, another run's record on the host,
# a pid of the host, a marker for its daemon. It reports every attempt in outputs/report.json.
HOSTILE = """
import json, os, subprocess, sys
host_dir, other_run, host_pid, marker = sys.argv[1:5]
report = {}

def attempt(name, action):
    try:
        action()
        report[name] = "succeeded"
    except Exception as exc:
        report[name] = f"{type(exc).__name__}: {exc}"

def write(path):
    with open(path, "w") as fh:
        fh.write("pwned")

report["docker_sockets"] = [p for p in ("/var/run/docker.sock", "/run/docker.sock") if os.path.exists(p)]
attempt("write_host_dir", lambda: write(os.path.join(host_dir, "pwned.txt")))
attempt("write_other_run", lambda: write(os.path.join(other_run, "outputs", "pwned.txt")))
attempt("write_runs_mount", lambda: write("/mnt/amlemu/runs/pwned.txt"))
attempt("kill_host_process", lambda: os.kill(int(host_pid), 0))
attempt("mount", lambda: subprocess.run(["mount", "-t", "tmpfs", "x", "/mnt"], check=True, capture_output=True))
attempt("write_software", lambda: write(os.path.join(os.path.dirname(sys.executable), "pwned")))
attempt("write_sys", lambda: write("/sys/kernel/mm/transparent_hugepage/enabled"))  # this machine's kernel
# The processes its node keeps for the next job (a docker node's init): traced, or their environment read.
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def trace_init():
    if libc.ptrace(16, 1, None, None) != 0:  # PTRACE_ATTACH
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    os.waitpid(1, 0)
    libc.ptrace(17, 1, None, None)  # PTRACE_DETACH
attempt("trace_init", trace_init)
attempt("read_init_environ", lambda: open("/proc/1/environ", "rb").read())
report["path_seen_by_job"] = os.environ.get("PATH", "")
report["environ"] = dict(os.environ)
environs = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                environs.append(fh.read().decode(errors="replace"))
        except OSError:
            pass
report["proc_environ"] = environs
report["pids_visible"] = len([p for p in os.listdir("/proc") if p.isdigit()])
# Links that would lead the host's copy of ./outputs out of the run, and a fifo that would block it.
os.makedirs("outputs", exist_ok=True)
os.symlink(os.path.join(host_dir, "host-secret.txt"), "outputs/leak.txt")
os.symlink(host_dir, "outputs/leakdir")
os.mkfifo("outputs/fifo")
os.makedirs("logs", exist_ok=True)
os.symlink("/etc", "logs/etc")
# Something left for the next run on this node: on its disk and in its scratch space.
write("/mnt/azureml/left-by-previous-run")
write("/tmp/left-by-previous-run")
# A daemon that would outlive the job (sh here is dash, which has no `exec -a`).
subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(600)  # {marker}"], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
# One that passes for a process the node keeps (its idle `sleep infinity`), orphaned to the node's init
# at once, that would read the next job's processes if it were kept.
subprocess.run(["/bin/sh", "-c", f"{sys.executable} -c 'import time; time.sleep(600)  # {marker}' /bin/sleep infinity &"],
               start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
with open("outputs/report.json", "w") as fh:
    json.dump(report, fh)
print("hostile job done", flush=True)
"""

NEXT = """
import os
print("leftovers:", [p for p in ("/mnt/azureml/left-by-previous-run", "/tmp/left-by-previous-run")
                     if os.path.exists(p)], flush=True)
"""

# A `docker` and an `unshare` in the job's code folder, put first on PATH by the job's variables:
# the host side of the launch must never run them.
FAKE_TOOL = "#!/bin/sh\necho pwned > {marker}\nexec /usr/bin/{tool} \"$@\"\n"


def _hostile_job(make_job, tmp_path: Path, args: str, planted: Path) -> Path:
    job = make_job(HOSTILE, nodes=1, args=args, extra=(
        "environment_variables:\n"
        f"  PATH: ./bin:{Path(sys.prefix, 'bin')}:/usr/local/bin:/usr/bin:/bin\n"
        f"  LD_PRELOAD: {tmp_path}/nonexistent-preload.so\n"
        "  DOCKER_HOST: tcp://127.0.0.1:9\n"))
    bin_dir = job.parent / "src" / "bin"
    bin_dir.mkdir()
    for tool in ("docker", "unshare"):
        fake = bin_dir / tool
        fake.write_text(FAKE_TOOL.format(marker=planted, tool=tool))
        fake.chmod(0o755)
    return job


def test_a_hostile_job_reaches_nothing_outside_its_run(emu: Emulator, cluster, make_job, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    cluster(max_nodes=1, idle_seconds_before_scaledown=120)
    secret = f"submitter-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("AMLEMU_TEST_SUBMITTER_SECRET", secret)  # in the submitting process only
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    (host_dir / "host-secret.txt").write_text(secret)
    other = emu.submit(make_job("print('victim', flush=True)\n", nodes=1))
    assert other.wait(timeout=120) is RunStatus.COMPLETED, other.record.error
    before = sorted(p.relative_to(other.dir) for p in other.dir.rglob("*"))
    planted = tmp_path / "planted-tool-ran"
    marker = f"amlemu-daemon-{uuid.uuid4().hex[:8]}"
    args = f"{host_dir} {other.dir} {os.getpid()} {marker}"
    run = emu.submit(_hostile_job(make_job, tmp_path, args, planted))
    assert run.wait(timeout=120) is RunStatus.COMPLETED, run.record.error
    report = json.loads((run.outputs / "report.json").read_text())

    assert not planted.exists(), "a tool from the job's code folder ran on the host"
    assert report["path_seen_by_job"].startswith("./bin:")  # the job's own variables reach its node
    assert report["docker_sockets"] == []
    for name in ("write_host_dir", "write_other_run", "write_runs_mount", "kill_host_process", "mount",
                 "write_software", "write_sys"):
        assert report[name] != "succeeded", f"{name}: {report[name]}"
    if backend == "docker":  # its init and sleep outlive the job (a process node's namespace dies with its run)
        assert report["trace_init"].startswith("PermissionError"), report["trace_init"]
        assert report["read_init_environ"].startswith("PermissionError"), report["read_init_environ"]
    assert not (host_dir / "pwned.txt").exists()
    assert sorted(p.relative_to(other.dir) for p in other.dir.rglob("*")) == before
    seen = json.dumps({k: report[k] for k in ("environ", "proc_environ")})
    assert secret not in seen and "AMLEMU_TEST_SUBMITTER_SECRET" not in seen
    # No host file came back through the job's links; a fifo did not block the collection.
    collected = {str(p.relative_to(run.dir)) for p in run.dir.rglob("*")}
    assert {"outputs/leak.txt", "outputs/leakdir", "outputs/fifo", "logs/etc"}.isdisjoint(collected)
    for path in run.dir.rglob("*"):
        assert stat.S_ISDIR(path.lstat().st_mode) or stat.S_ISREG(path.lstat().st_mode), path
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert "outputs/leak.txt" in (run.dir / "system_logs" / "lifecycle.txt").read_text()
    # The daemon it started ended with the run.
    wait_until(lambda: not job_processes(marker), 10, "the job's daemon is gone")

    nxt = emu.submit(make_job(NEXT, nodes=1))  # the same node (max 1, not yet scaled down)
    assert nxt.wait(timeout=120) is RunStatus.COMPLETED, nxt.record.error
    assert nxt.record.nodes == run.record.nodes
    assert "leftovers: []" in nxt.logs(0)


def test_a_node_sees_its_own_disk_and_cache_and_none_of_the_workspace(emu: Emulator, cluster, make_job) -> None:
    cluster(max_nodes=1)
    run = emu.submit(make_job(
        "import os, sys\n"
        "print('mnt:', sorted(os.listdir('/mnt')), sorted(os.listdir('/mnt/amlemu')), flush=True)\n"
        "print('home visible:', os.path.exists(sys.argv[1]), flush=True)\n"
        "print('disk:', sorted(os.listdir('/mnt/azureml')), sorted(os.listdir('/mnt/azureml/cr/j')), flush=True)\n",
        nodes=1, args=str(emu.home.root)))
    assert run.wait(timeout=120) is RunStatus.COMPLETED, run.record.error
    log = run.logs(0)
    assert "mnt: ['amlemu', 'azureml'] ['cache']" in log
    assert "home visible: False" in log
    assert f"disk: ['cr'] ['{run_folder_id(run.id)}']" in log  # a 32-hex id, as on AmlCompute
