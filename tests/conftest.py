"""Shared fixtures: the real MNIST prepared by the setup, a fast deterministic subset of it, the trainer."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click
import psutil
import pytest

from amlemu.api import Emulator
from amlemu.backends import BACKENDS, backend_class, cpugroup, hostguard, netns
from amlemu.home import default_cache
from amlemu.lazydeps import defer_rfc3987_syntax
from amlemu.runs.contract import job_rel
from amlemu.specs import ClusterSpec
from amlemu.storage.azurite import SHARED_ENV, Azurite
from pytest_amlemu import mnist
from rigfixture import second_engine  # noqa: F401 - the second Docker engine (issue 31), a session fixture

# Before a test module imports azure-ai-ml (or anything that imports jsonschema): every xdist worker
# collects every module, and jsonschema's eager import of rfc3987_syntax costs over a second of CPU.
defer_rfc3987_syntax()

REPO = Path(__file__).resolve().parents[1]
TRAINER_DIR = REPO / "trainer"
# Tests that train with torch run one after another on one xdist worker (`--dist loadgroup`): two
# trainings at once on a small machine spin on each other's cores and take longer than in turn.
# (Two lanes were tried: the suite is bound by CPU, not by this lane, and took longer.)
TRAINING = pytest.mark.xdist_group("training")
# Tests that import azureml.train (its estimators) in the test process share one worker: the import
# costs ~8 s of CPU (the package reads its script validator's package lists twice), paid once a worker.
AZUREML_TRAIN = pytest.mark.xdist_group("azureml-train")
# Proof-sized runs (the full MNIST's 95%, 100 jobs under faults): `make test-full`; `make test`
# (CI) runs the same tests on less data or fewer jobs, so every behaviour is still checked there.
FULL = pytest.mark.full
# Seconds a job may take to start, or a waiting job to get on: a deadline, not a wait. On CI's 2
# cores under 4 workers a start took over 60 s while the examples trained beside it (seconds alone).
STARTUP = 180


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The trainings and the tests marked `long` start first: under xdist none of them then begins
    near the end, with the other workers idle."""
    items.sort(key=lambda item: not (item.get_closest_marker("xdist_group") or item.get_closest_marker("long")))


@pytest.fixture(scope="session")
def mnist_root() -> Path:
    """The complete real MNIST (60k/10k), verified against the original files' checksums."""
    return mnist.prepare().root


@pytest.fixture(scope="session")
def mnist_subset(mnist_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 2,000 training and 500 test images of the real MNIST: for tests that need speed."""
    dest = tmp_path_factory.mktemp("mnist-subset")
    return mnist.write_subset(mnist.MnistLayout(mnist_root), dest, train=2000, test=500).root


@pytest.fixture(scope="session")
def trainer_module():
    """trainer/train.py imported the way a node runs it (its own folder on sys.path)."""
    sys.path.insert(0, str(TRAINER_DIR))
    try:
        import train  # noqa: PLC0415
        yield train
    finally:
        sys.path.remove(str(TRAINER_DIR))


# --- the emulated cluster -------------------------------------------------------------------------
@pytest.fixture(params=list(BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    """Every cluster test runs on both backends. A missing engine fails the docker half: it never skips."""
    ok, why = backend_class(request.param).available()
    assert ok, f"backend {request.param} is not usable here: {why}"
    return request.param


@pytest.fixture(scope="session")
def _homes():
    """Every test home's id; at the end of the session nothing labelled with one may exist, even
    what appeared after its test's own check (a late container from a process being killed)."""
    homes: set[str] = set()
    yield homes
    import docker  # noqa: PLC0415

    client = docker.from_env()
    late = [f"{kind} {item.name}" for kind, items in (("container", client.containers.list(all=True)),
                                                      ("network", client.networks.list()))
            for item in items if (item.attrs.get("Labels") or item.attrs.get("Config", {}).get("Labels") or {})
            .get("amlemu.home") in homes]
    for home in homes:
        for container in client.containers.list(all=True, filters={"label": f"amlemu.home={home}"}):
            container.remove(force=True)
        for network in client.networks.list(filters={"label": f"amlemu.home={home}"}):
            network.remove()
    assert late == [], f"left behind by the test session: {late}"


@pytest.fixture(scope="session", autouse=True)
def _one_azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One Azurite per test worker for every home (AMLEMU_AZURITE_DIR; each home its own container,
    as each workspace has), started on first use: a start costs ~3 CPU-s, and ~50 homes used one.
    Tests of Azurite's own start, stop and logs take `own_azurite`. Set in os.environ on purpose:
    the CLI, supervisors and services that tests start inherit it."""
    home = tmp_path_factory.mktemp("azurite-home")
    os.environ[SHARED_ENV] = str(home / "azurite")
    try:
        yield
    finally:
        del os.environ[SHARED_ENV]
        Azurite(home, default_cache(), env={}).stop()  # the server's own home: the one that stops it


@pytest.fixture
def own_azurite(monkeypatch: pytest.MonkeyPatch) -> None:
    """Homes made in this test start (and their cleanup stops) an Azurite of their own."""
    monkeypatch.delenv(SHARED_ENV)


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """An empty home for tests that drive the CLI or the service; its cleanup stops what they started."""
    from amlemu import servicefile  # noqa: PLC0415

    from click.testing import CliRunner  # noqa: PLC0415

    from amlemu.cli import cli  # noqa: PLC0415

    root = tmp_path / "home"
    root.mkdir()
    yield root
    # `amlemu cleanup --yes`, in this process: the same command, without a fresh interpreter's ~1 CPU-s
    # of imports after each of the ~60 tests that take a home.
    CliRunner().invoke(cli, ["--home", str(root), "cleanup", "--yes"])
    assert servicefile.read_state(root) is None


@pytest.fixture
def emu(tmp_path: Path, backend: str, _homes: set[str], request: pytest.FixtureRequest):
    """An emulator with its own home; afterwards nothing it made may remain."""
    emulator = Emulator(home=tmp_path / "home", backend=backend)
    _homes.add(emulator.home.id)
    yield emulator
    try:
        if getattr(request.node, "failed_call", False):
            post_mortem(emulator, tmp_path / "post-mortem")
    finally:
        emulator.cleanup()
    assert_nothing_left(emulator, backend)


def assert_nothing_left(emulator: Emulator, backend: str) -> None:
    """After its cleanup, nothing an emulator's home made remains: containers, networks, mounted
    node disks, network namespaces, processes."""
    if backend == "docker":
        import docker  # noqa: PLC0415

        client = docker.from_env()
        label = {"label": f"amlemu.home={emulator.home.id}"}
        assert client.containers.list(all=True, filters=label) == [], "the test left containers behind"
        assert client.networks.list(filters=label) == [], "the test left networks behind"
        assert client.volumes.list(filters=label) == [], "the test left volumes behind"
        assert hostguard.rules(hostguard.comment(emulator.home.id)) == [], "the test left firewall rules behind"
        assert cpugroup.groups(emulator.home.id) == [], "the test left CPU groups behind"
    # Node disks are mounted in the home; process clusters' network namespaces under netns.RUNTIME_ROOT.
    marks = (str(emulator.home.root), str(netns.RUNTIME_ROOT / emulator.home.id))
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if any(m in line for m in marks)]
    assert mounts == [], f"the test left node disks or network namespaces mounted: {mounts}"
    leftovers = [(p.pid, p.info["status"], " ".join(p.info["cmdline"] or [])[:200])
                 for p in psutil.process_iter(["cmdline", "status"])
                 if any(str(emulator.home.root) in part for part in (p.info["cmdline"] or []))]
    assert leftovers == [], f"the test left processes behind: {leftovers}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # type: ignore[no-untyped-def]
    report = yield
    if report.when == "call" and report.failed:
        item.failed_call = True  # type: ignore[attr-defined] # read by the emu fixture's teardown
    return report


def post_mortem(emulator: Emulator, dest: Path) -> None:
    """A failed test's runs, before cleanup removes them: each live supervisor first writes its
    threads' stacks into its log (SIGUSR1), then the runs' folders are copied (pytest keeps the
    last sessions' tmp_path)."""
    dumps = []
    for record in emulator.store.runs():
        pid, log = record.supervisor_pid, emulator.home.run_dir(record.id) / "system_logs" / "supervisor.txt"
        with contextlib.suppress(psutil.Error, OSError):
            if not record.status.is_terminal and pid and str(emulator.home.root) in psutil.Process(pid).cmdline():
                dumps.append((log, log.stat().st_size if log.exists() else 0))
                os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(not log.exists() or log.stat().st_size == size for log, size in dumps):
        time.sleep(0.1)
    dest.mkdir(parents=True, exist_ok=True)
    if (emulator.home.root / "runs").is_dir():
        shutil.copytree(emulator.home.root / "runs", dest / "runs", symlinks=True, dirs_exist_ok=True)
    shutil.copy2(emulator.home.db, dest / emulator.home.db.name)  # statuses and their times
    print(f"post-mortem of the failed test's runs: {dest}")
    for record in emulator.store.runs():  # CI shows only the output: each run's end, in brief
        print(f"run {record.id}: {record.status.value} exit={record.exit_code} error={record.error!r}")
        run_dir = emulator.home.run_dir(record.id)
        for log in [run_dir / "system_logs" / "supervisor.txt", *sorted(run_dir.glob("user_logs/std_log*.txt"))[:1]]:
            with contextlib.suppress(OSError):
                tail = log.read_text(errors="replace").splitlines()[-12:]
                print(f"  {log.relative_to(run_dir)}:", *(f"    {line[:300]}" for line in tail), sep="\n")


class JobFactory:
    """Writes a job (its code folder and CLI v2 YAML) the way a user keeps one in a repository."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __call__(self, script: str, *, nodes: int = 1, per_node: int = 1, distribution: str = "mpi",
                 compute: str = "c1", extra: str = "", name: str | None = None, args: str = "") -> Path:
        name = name or f"job_{uuid.uuid4().hex[:8]}"
        folder = self.root / name
        (folder / "src").mkdir(parents=True)
        (folder / "src" / f"{name}.py").write_text(textwrap.dedent(script))
        lines = ["code: src", f"command: python {name}.py {args}".rstrip(), f"compute: azureml:{compute}",
                 f"experiment_name: {name}", "resources:", f"  instance_count: {nodes}"]
        if distribution != "none":
            lines += ["distribution:", f"  type: {distribution}", f"  process_count_per_instance: {per_node}"]
        (folder / "job.yml").write_text("\n".join(lines) + "\n" + textwrap.dedent(extra))
        return folder / "job.yml"


def copy_home(source: Path, dest: Path) -> None:
    """Copy a home whose database another connection may hold open: the files but the database's, then the
    database through SQLite's backup (a copy by bytes races its -wal/-shm files, which the last connection
    to close checkpoints and deletes)."""
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("amlemu.db", "amlemu.db-*"))
    with contextlib.closing(sqlite3.connect(source / "amlemu.db")) as src, \
            contextlib.closing(sqlite3.connect(dest / "amlemu.db")) as dst:
        src.backup(dst)


@pytest.fixture
def make_job(tmp_path: Path) -> JobFactory:
    return JobFactory(tmp_path / "jobs")


@pytest.fixture
def cluster(emu: Emulator):
    """A 2-node dedicated cluster named c1 that scales down as soon as a node is idle."""
    def create(max_nodes: int = 2, **kwargs) -> ClusterSpec:
        spec = ClusterSpec("c1", "STANDARD_D2_V2", max_nodes=max_nodes,
                           **{"idle_seconds_before_scaledown": 0, **kwargs})
        emu.create_compute(spec)
        return spec
    return create


def wait_until(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    """Poll a condition with a deadline (no fixed sleeps); fail naming what did not happen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"within {timeout} s: {what}")


# A job that blocks until the host drops a file into its folder on every node (nodes see no shared
# folder of the host): print "started", wait, print "released". `release(emu, run)` lets it go.
BLOCK = """
import os, time
print("started", flush=True)
release = os.path.join(os.environ["AZUREML_CR_EXECUTION_WORKING_DIR_PATH"], "..", "..", "release")
while not os.path.exists(release):
    time.sleep(0.05)
print("released", flush=True)
"""


def failing_rank_script(rank_var: str) -> str:
    """Every rank writes an output and waits; rank 1 fails with exit code 3 after a second."""
    return f"""
import os, sys, time
rank = int(os.environ["{rank_var}"])
os.makedirs("outputs", exist_ok=True)
open(f"outputs/before-{{rank}}.txt", "w").write("kept")
if rank == 1:
    time.sleep(1)
    print("ValueError: rank one gives up", flush=True)
    sys.exit(3)
time.sleep(120)
"""


# SDK v1 user code: find-or-create a 2-node CPU cluster, then a ScriptRunConfig over MPI, 2 x 1.
V1_CLUSTER_AND_MPI_JOB = '''
from azureml.core import Experiment, ScriptRunConfig, Workspace
from azureml.core.compute import AmlCompute, ComputeTarget
from azureml.core.runconfig import MpiConfiguration

ws = Workspace.from_config()
target = ComputeTarget.create(ws, "cpucluster", AmlCompute.provisioning_configuration(vm_size="STANDARD_D2_V2",
                                                                                      max_nodes=2))
target.wait_for_completion()
def mpi_job(script):
    return ScriptRunConfig(source_directory=sys.argv[1], script=script, compute_target=target,
                           distributed_job_config=MpiConfiguration(process_count_per_node=1, node_count=2))
'''


def release(emu: Emulator, run, timeout: float = STARTUP) -> None:  # type: ignore[no-untyped-def]
    """Let a BLOCK-style job go on, once its folders exist on its nodes (they are laid out as it
    starts: a job released while queued would never see the file)."""
    def folders() -> list:  # type: ignore[type-arg]
        record = run.record
        found = [emu.home.node_dir(record.cluster, node) / job_rel(run.id) for node in record.nodes]
        return found if found and all((f / "exe").is_dir() for f in found) else []
    for folder in wait_until(folders, timeout, f"run {run.id} is laid out on its nodes"):
        (folder / "release").touch()


class Script:
    """The submit script running, its output read as it comes (a pipe left unread would stall it)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.out: list[str] = []
        self.err: list[str] = []
        self.readers = [threading.Thread(target=lambda s=s, b=b: b.extend(iter(s.readline, "")), daemon=True)
                        for s, b in ((proc.stdout, self.out), (proc.stderr, self.err))]
        for reader in self.readers:
            reader.start()

    def stdout_so_far(self) -> str:
        assert self.proc.poll() is None or self.out, "the script ended before printing anything"
        return "".join(self.out)

    def finish(self, timeout: float) -> subprocess.CompletedProcess[str]:
        code = self.proc.wait(timeout=timeout)
        for reader in self.readers:
            reader.join(timeout=10)
        return subprocess.CompletedProcess(self.proc.args, code, "".join(self.out), "".join(self.err))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def commands(group: click.Group, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    """Every leaf command of a click tree, with its path ("job create")."""
    for name, command in group.commands.items():
        path = f"{prefix} {name}".strip()
        if isinstance(command, click.Group):
            yield from commands(command, path)
        else:
            yield path, command


def job_processes(marker: str) -> list[int]:
    """Processes (on this machine or in any container: both are in /proc) running a job's script."""
    return [p.pid for p in psutil.process_iter(["cmdline"]) if any(marker in part for part in (p.info["cmdline"] or []))]


def service_cli(home: Path, cwd: Path, *args: str, backend: str = "docker"):  # type: ignore[no-untyped-def]
    """`amlemu --home HOME ARGS` on `backend` nodes, as a user runs it in the project folder; it must succeed."""
    import os  # noqa: PLC0415
    done = subprocess.run([sys.executable, "-m", "amlemu", "--home", str(home), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=180, env={**os.environ, "AMLEMU_BACKEND": backend})
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def stop_service_home(home: Path) -> None:
    """`amlemu cleanup` of a home whose service a test started; then nothing the service started is
    left: the service itself, its jobs' supervisors, the nodes."""

    import docker  # noqa: PLC0415
    from click.testing import CliRunner  # noqa: PLC0415

    from amlemu import servicefile  # noqa: PLC0415
    from amlemu.cli import cli  # noqa: PLC0415
    from amlemu.home import Home  # noqa: PLC0415

    running = servicefile.read_state(home)
    CliRunner().invoke(cli, ["--home", str(home), "cleanup", "--yes"])  # in this process: no interpreter's imports
    assert running is None or not psutil.pid_exists(running.pid), "the service outlived amlemu cleanup"
    assert servicefile.read_state(home) is None
    left = docker.from_env().containers.list(all=True, filters={"label": f"amlemu.home={Home.at(home).id}"})
    assert left == [], f"containers left: {[c.name for c in left]}"


@contextmanager
def served(home: Path, cwd: Path, backend: str = "docker", config: bool = True) -> Iterator[dict[str, str]]:
    """The home's service as a user starts it: `amlemu env`'s variables (it starts the service), and
    with `config` the config.json `amlemu workspace config` writes in `cwd`; stopped and cleaned after."""
    try:
        env = json.loads(service_cli(home, cwd, "env", "--format", "json", "--port", "0", backend=backend).stdout)
        if config:
            service_cli(home, cwd, "workspace", "config", backend=backend)
        yield env
    finally:
        stop_service_home(home)


def import_base_image(client) -> str:  # type: ignore[no-untyped-def]
    """A tiny base image made locally (no registry is reachable): a root with one file. The
    caller removes it."""
    import io  # noqa: PLC0415
    import tarfile  # noqa: PLC0415

    base = f"amlemu-tests/base:{uuid.uuid4().hex[:12]}"
    rootfs = io.BytesIO()
    with tarfile.open(fileobj=rootfs, mode="w") as tar:
        info = tarfile.TarInfo("etc/os-release")
        info.size = len(b"ID=amlemu-test\n")
        tar.addfile(info, io.BytesIO(b"ID=amlemu-test\n"))
    repository, tag = base.split(":")
    client.api.import_image_from_data(rootfs.getvalue(), repository=repository, tag=tag)
    return base
