"""Every verb that changes something has --dry-run: it prints the actions it would take, as data,
and changes nothing. Table-driven over the mutating verbs, on one home with real state: process
and Docker nodes up, a run queued (its supervisor stood in for by a process that names it) and one
ended, a local datastore and an Azurite one (Azurite running), a node's cached file. Before and
after each dry run: the files (sizes, mtimes) under the test's folder, the database's rows, the
Docker objects of the home and the processes that name it must be the same. The command tree
itself is walked too, so a mutating verb added later without a dry run fails here."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner
from conftest import commands
from test_hostile_input import corrupt_db

from amlemu.actions import execute
from amlemu.api import Emulator
from amlemu.backends import nodedisk
from amlemu.cli import cli
from amlemu.machines import registry as machine_registry
from amlemu.machines.registry import Machine
from amlemu.specs import ClusterSpec, RunStatus
from amlemu.storage.assets import asset_from_dict
from amlemu.storage.azurite import SHARED_ENV
from amlemu.storage.datastores import DatastoreSpec
from amlemu.targets.azureml import WorkspaceRef

SAS = "sv=2031-01-01&sig=DRYRUNNOTREAL"
# The tests share the module's world (a home with nodes on both backends and its own Azurite: seconds
# of CPU to make and remove): on one xdist worker it is made once, not once a worker.
pytestmark = pytest.mark.xdist_group("dry-runs")
# Verbs that change nothing, each with why; every other verb must have --dry-run.
READ_ONLY = {
    "workspace show": "prints", "compute list": "prints", "compute show": "prints", "job list": "prints",
    "job show": "prints", "job stream": "follows a log", "job validate": "checks a YAML",
    "job convert": "prints a YAML (-o writes it where the user says, as a shell redirect would)",
    "datastore list": "prints", "datastore show": "prints", "data ls": "prints",
    "environment list": "prints", "environment show": "prints", "component list": "prints",
    "component show": "prints",
    "data list": "prints", "data show": "prints", "model list": "prints", "model show": "prints",
    "machine list": "prints",
    "ui": "serves MLflow's UI over copies of the runs until Ctrl-C (a view, not a change)",
    "serve": "serves the workspace's Azure ML API until Ctrl-C (--stop: stops it); what a client changes "
             "through it goes through the same plans as the verbs above",
    "env": "prints variables; starts the service as `serve` would when it is not running (--no-start: never)",
}


@dataclass(frozen=True)
class World:
    root: Path  # everything the dry runs could touch lies under it, the home included
    emu: Emulator
    sleeper: subprocess.Popen  # type: ignore[type-arg]

    @property
    def home(self) -> Path:
        return self.emu.home.root

    def container(self, cluster: str) -> str:
        return f"amlemu-{self.emu.home.id}-{cluster}-node-0"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, _homes: set[str]) -> Iterator[World]:
    root = tmp_path_factory.mktemp("dry")
    own_azurite = pytest.MonkeyPatch()  # cleanup's plan stops the home's own Azurite and removes its data
    own_azurite.delenv(SHARED_ENV)
    emu = Emulator(root / "home", backend="process")
    _homes.add(emu.home.id)
    sleeper = None
    try:
        emu.create_compute(ClusterSpec("c1", "STANDARD_D2_V2", min_nodes=1, max_nodes=2))
        emu.create_compute(ClusterSpec("low", "STANDARD_D2_V2", vm_priority="lowpriority", min_nodes=1, max_nodes=1))
        emu.create_compute(ClusterSpec("dk", "STANDARD_D2_V2", min_nodes=1, max_nodes=1), backend="docker")
        emu.create_compute(ClusterSpec("busy", "STANDARD_D2_V2", max_nodes=1))  # where the runs are
        execute(machine_registry.plan_add(emu.store, Machine("spare", "unix:///run/spare.sock", cores=2, memory_bytes=1 << 30)))
        for folder, files in (("ds/x", {"a.txt": "abc", "b.txt": "bee"}), ("up", {"a.txt": "xyz", "new.txt": "new!"}),
                              ("cloud/x", {"a.txt": "abc"}), ("jobs/src", {"t.py": "print(1)\n"})):
            (root / folder).mkdir(parents=True)
            for name, text in files.items():
                (root / folder / name).write_text(text)
        (root / "jobs" / "job.yml").write_text("code: src\ncommand: python t.py\ncompute: azureml:c1\n")
        (root / "jobs" / "env.yml").write_text("name: dry-env\nimage: base:1\n")
        (root / "jobs" / "comp.yml").write_text("name: dry_comp\ntype: command\ncode: src\ncommand: python t.py\n"
                                                "environment: azureml:dry-env@latest\n")
        emu.datastores.create(DatastoreSpec("localds", "local", folder=str(root / "ds")))
        emu.assets.create(asset_from_dict("data", {"name": "dryset", "version": "1", "type": "uri_folder",
                                                   "path": "azureml://datastores/localds/paths/x"}, base_dir=root))
        emu.datastores.create(DatastoreSpec("blobby", "azurite", container="blobby"))
        emu.datastores.upload(root / "ds" / "x", "azureml://datastores/blobby/paths/x")  # starts Azurite
        emu.datastores.create(DatastoreSpec("sasblob", "azure_blob", container="data", account="acct",
                                            credential="sas", endpoint="http://127.0.0.1:9"), SAS)
        cached = emu.home.cache_dir("c1", "c1-node-0") / "data" / "localds" / "x" / "a.txt"
        cached.parent.mkdir(parents=True)
        cached.write_text("abc")
        emu.store.add_run("queued_run", "exp", "busy", {"note": "stands for a queued job"})
        emu.store.set_status("queued_run", RunStatus.QUEUED, "submitted")
        # Its supervisor, stood in for by a process that names the run, as `ours` checks.
        # Its home in the argv too: other xdist workers' worlds have a "queued_run" of their own.
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "queued_run",
                                    str(emu.home.root)], start_new_session=True)
        emu.store.update_run("queued_run", supervisor_pid=sleeper.pid)
        emu.store.add_run("ended_run", "exp", "busy", {"note": "stands for an ended job"})
        emu.store.set_status("ended_run", RunStatus.FAILED, "it failed", error="it failed")
        (emu.home.run_dir("ended_run") / "outputs").mkdir(parents=True)
        (emu.home.run_dir("ended_run") / "outputs" / "model.txt").write_text("weights")
        yield World(root, emu, sleeper)
    finally:
        if sleeper is not None:
            sleeper.kill()
            sleeper.wait()
        emu.cleanup()
        own_azurite.undo()


def snapshot(world: World) -> dict[str, Any]:
    """What a dry run must leave as it found it."""
    import docker  # noqa: PLC0415

    # Azurite's own data folder is left out: it saves its metadata on a timer of its own (its
    # blobs, what the dry run must not change, are compared below).
    azurite = world.home / "azurite" / "data"
    files = {str(p.relative_to(world.root)): (p.lstat().st_size, p.lstat().st_mtime_ns)
             for p in sorted(world.root.rglob("*"))
             if not p.name.startswith("amlemu.db") and not p.is_relative_to(azurite)}
    with sqlite3.connect(f"file:{world.home / 'amlemu.db'}?mode=ro", uri=True) as db:
        rows = list(db.iterdump())
    client, label = docker.from_env(), {"label": f"amlemu.home={world.emu.home.id}"}
    containers = sorted((c.name, c.status, tuple(sorted(c.attrs["NetworkSettings"]["Networks"])),
                         c.attrs["HostConfig"]["CpuQuota"]) for c in client.containers.list(all=True, filters=label))
    networks = sorted(n.name for n in client.networks.list(filters=label))
    processes = sorted((p.pid, tuple(p.info["cmdline"] or ())) for p in psutil.process_iter(["cmdline"])
                       if any(str(world.home) in part for part in (p.info["cmdline"] or [])))
    blobs = world.emu.datastores.ls("azureml://datastores/blobby/paths/")  # Azurite runs: nothing is started
    return {"files": files, "rows": rows, "containers": containers, "networks": networks,
            "processes": processes, "blobs": blobs}


def has(**fields: Any) -> Callable[[dict[str, Any], World], bool]:
    """The dry run lists an action with these fields ({root}, {home}, {id} filled in)."""
    def check(doc: dict[str, Any], world: World) -> bool:
        want = {k: fill(v, world) if isinstance(v, str) else v for k, v in fields.items()}
        return any(all(a.get(k) == v for k, v in want.items()) for a in doc["actions"])
    return check


def fill(text: str, world: World) -> str:
    return text.replace("{root}", str(world.root)).replace("{home}", str(world.home)).replace("{id}", world.emu.home.id)


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    checks: tuple[Callable[[dict[str, Any], World], bool], ...]


def c(id: str, *argv: str, checks: tuple = ()) -> Case:  # noqa: A002 - reads as the table's column
    return Case(id, argv, checks)


UP = "azureml://datastores/localds/paths/x"
CASES = [
    c("compute-delete-process", "compute", "delete", "c1", checks=(
        has(action="remove", what="process node", name="c1-node-0"),
        has(action="remove", what="cluster folders", name="c1"), has(action="delete", what="compute record", name="c1"))),
    c("compute-delete-docker", "compute", "delete", "dk", checks=(
        has(action="remove", what="container", name="amlemu-{id}-dk-node-0"),
        has(action="remove", what="network", name="amlemu-{id}-dk"),
        has(action="remove", what="folder", name="{home}/nodes/dk"))),
    c("compute-create", "compute", "create", "--name", "c9", "--min-instances", "1", "--backend", "process", checks=(
        lambda doc, w: doc["compute"]["name"] == "c9" and [n["hostname"] for n in doc["nodes_now"]] == ["c9-node-0"],)),
    c("compute-preempt", "compute", "preempt", "low", checks=(
        has(action="preempt", what="node", name="low-node-0", compute="low", then="the idle node is removed"),)),
    c("compute-preemption-policy", "compute", "preemption-policy", "low", "--rate-per-node-hour", "2", "--seed", "7",
      checks=(has(action="set", what="preemption policy", name="low", rate_per_node_hour=2.0, seed=7, was=None),)),
    c("job-create", "job", "create", "-f", "{root}/jobs/job.yml", checks=(
        lambda doc, w: doc["run_id"] == "<run id>" and [n["hostname"] for n in doc["nodes"]] == ["c1-node-0"],)),
    c("job-cancel", "job", "cancel", "queued_run", checks=(
        has(action="set status", what="run", name="queued_run", **{"from": "Queued", "to": "CancelRequested"}),)),
    c("job-cancel-ended", "job", "cancel", "ended_run", checks=(
        has(action="leave", what="run", name="ended_run", status="Failed"),)),
    c("job-download", "job", "download", "ended_run", "--download-path", "{root}/dl", checks=(
        has(action="copy", what="run files", name="ended_run", to="{root}/dl/ended_run"),
        lambda doc, w: doc["actions"][0]["from"] == [str(w.home / "runs" / "ended_run" / "outputs")])),
    c("cleanup", "cleanup", checks=(
        lambda doc, w: has(action="stop", what="process group", name=str(w.sleeper.pid), run="queued_run")(doc, w),
        has(action="remove", what="process node", name="c1-node-0"),
        has(action="remove", what="container", name="amlemu-{id}-dk-node-0"),
        has(action="remove", what="network", name="amlemu-{id}-dk"),
        has(action="stop", what="Azurite server", always=True), has(action="forget", what="runs and computes", runs=2),
        has(action="remove", what="folder", name="{home}/runs"))),
    c("cleanup-all", "cleanup", "--all", checks=(
        has(action="remove", what="folder", name="{home}/secrets", holds="secrets"),
        has(action="remove", what="folder", name="{home}/azurite", holds="Azurite's data"),
        has(action="forget", what="workspace settings and datastore records", datastores=3))),
    c("cleanup-all-homes", "cleanup", "--all-homes", checks=(
        has(action="remove", what="container", name="amlemu-{id}-dk-node-0", home="{id}"),)),
    c("cleanup-reset-state", "cleanup", "--reset-state", "--all", checks=(
        has(action="move aside", what="state database", name="{home}/amlemu.db"),
        lambda doc, w: not has(what="workspace settings and datastore records")(doc, w))),
    c("data-create", "data", "create", "-n", "newset", "--type", "uri_folder", "--path",
      "azureml://datastores/localds/paths/x", checks=(has(action="register", what="data asset", name="newset"),)),
    c("model-create", "model", "create", "-n", "newmodel", "--type", "custom_model", "--path", "{root}/up", checks=(
        has(action="register", what="model asset", name="newmodel", upload="{root}/up"),)),
    c("data-archive", "data", "archive", "-n", "dryset", "-v", "1", checks=(
        has(action="archive", what="data asset", name="dryset:1"),)),
    c("environment-create", "environment", "create", "-f", "{root}/jobs/env.yml", checks=(
        has(action="register", what="environment", name="dry-env"),)),
    c("component-create", "component", "create", "-f", "{root}/jobs/comp.yml", checks=(
        has(action="register", what="component", name="dry_comp", version="1"),)),
    c("datastore-create-local", "datastore", "create", "--name", "newds", "--type", "local", "--path", "{root}/newds",
      checks=(has(action="create", what="folder", name="{root}/newds"), has(action="add", what="datastore", name="newds"))),
    c("datastore-create-secret", "datastore", "create", "--name", "newblob", "--type", "azure_blob", "--account-name",
      "acct", "--container-name", "data", "--sas-token-env", "DRY_SAS", checks=(
        has(action="write", what="secret", name="{home}/secrets/newblob"),
        lambda doc, w: SAS not in json.dumps(doc))),
    c("data-upload", "data", "upload", "{root}/up", UP, checks=(
        has(action="skip", what="file", name="{root}/up/a.txt", to=f"{UP}/a.txt", size=3),
        has(action="copy", what="file", name="{root}/up/new.txt", to=f"{UP}/new.txt", size=4))),
    c("data-upload-azurite", "data", "upload", "{root}/ds/x", "azureml://datastores/blobby/paths/x", checks=(
        has(action="skip", what="file", name="{root}/ds/x/b.txt", size=3),)),
    c("data-upload-default-datastore", "data", "upload", "{root}/up", "azureml://datastores/workspaceblobstore/paths/y",
      checks=(has(action="add", what="datastore", name="workspaceblobstore"),
              # the workspace's own container, as Azure ML names it: azureml-blobstore-<a guid of the home>
              lambda doc, w: has(action="create", what="container", name="azureml-blobstore-"
                                 f"{uuid.uuid5(uuid.NAMESPACE_URL, f'amlemu-home:{w.home}')}")(doc, w),
              has(action="copy", what="file", name="{root}/up/new.txt", size=4))),
    c("data-download", "data", "download", UP, "{root}/dl", checks=(
        has(action="copy", what="file", name=f"{UP}/a.txt", to="{root}/dl/a.txt", size=3),)),
    c("data-download-azurite", "data", "download", "azureml://datastores/blobby/paths/x/b.txt", "{root}/dl", checks=(
        has(action="copy", what="file", name="azureml://datastores/blobby/paths/x/b.txt", to="{root}/dl/b.txt"),)),
    c("data-sync", "data", "sync", UP, checks=(
        has(action="skip", what="file", name="a.txt", to="acct/{root}/cloud/x/a.txt"),
        has(action="copy", what="file", name="b.txt", size=3))),
    c("fault-kill-node", "fault", "kill-node", "c1", "0", checks=(has(action="kill", what="node", name="c1-node-0"),)),
    c("fault-partition", "fault", "partition", "dk", "0", checks=(has(action="partition", what="node", name="dk-node-0"),)),
    c("fault-slow", "fault", "slow", "dk", "0", "--cpus", "0.5", checks=(
        has(action="slow", what="node", name="dk-node-0", fault="throttled to 0.5 CPU(s)", then="the idle node stays"),)),
    c("fault-data-error", "fault", "data-error", "c1", "0", f"{UP}/a.txt", checks=(
        has(action="data-error", what="cached file", name="{home}/caches/c1/c1-node-0/data/localds/x/a.txt"),)),
    c("machine-add", "machine", "add", "same", "unix:///var/run/docker.sock", checks=(
        has(action="add", what="machine", name="same", address="unix:///var/run/docker.sock"),)),
    c("machine-remove", "machine", "remove", "spare", checks=(
        has(action="remove", what="machine", name="spare", address="unix:///run/spare.sock"),)),
    c("workspace-set", "workspace", "set", "--name", "other-ws", "--location", "local", checks=(
        lambda doc, w: doc["actions"] == [{"action": "set", "what": "workspace field", "name": "workspace_name",
                                           "from": "amlemu-ws", "to": "other-ws"}],)),
    c("workspace-config", "workspace", "config", "--path", "{root}/config.json", checks=(
        has(action="write", what="file", name="{root}/config.json"),)),
]


class LocalWorkspace:
    """`data sync`'s real workspace, whose datastore is a folder here (the cloud cannot run here)."""

    def __init__(self, root: Path) -> None:
        self.root, self.workspace = root, WorkspaceRef("s", "g", "w")

    def datastore(self, name: str) -> tuple[DatastoreSpec, str | None]:
        return DatastoreSpec(name, "local", account="acct", folder=str(self.root / "cloud")), None


def invoke(world: World, *argv: str) -> Any:
    return CliRunner().invoke(cli, ["--home", str(world.home), *(fill(a, world) for a in argv)],
                              env={"DRY_SAS": SAS, "AMLEMU_TARGET": ""})


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_a_dry_run_lists_its_actions_and_changes_nothing(case: Case, world: World, monkeypatch) -> None:
    monkeypatch.chdir(world.root)  # no project's pyproject.toml chooses a target
    monkeypatch.setattr("amlemu.cli.sync.AzureMLTarget", lambda **_: LocalWorkspace(world.root))
    before = snapshot(world)
    result = invoke(world, *case.argv, "--dry-run", "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    for check in case.checks:
        assert check(doc, world), json.dumps(doc, indent=1)
    assert snapshot(world) == before, "the dry run changed something"


def test_every_verb_of_the_table_is_covered() -> None:
    covered = {" ".join(arg for arg in case.argv[:2] if not arg.startswith("-")) for case in CASES}
    missing = {path for path in mutating_verbs() if path not in covered}
    assert missing == set(), f"add a dry-run case for: {sorted(missing)}"


def test_the_human_form_is_a_line_per_action(world: World) -> None:
    result = invoke(world, "compute", "delete", "dk", "--dry-run")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "dry run: 6 action(s), none taken"
    assert f"  remove container {world.container('dk')} (node dk-node-0)" in lines
    assert f"  remove folder {nodedisk.images_dir(world.emu.home.root, 'dk')}" in lines  # its node disk's image's folder
    assert f"  remove network amlemu-{world.emu.home.id}-dk" in lines


def test_a_refused_verb_is_refused_by_its_dry_run_too(world: World) -> None:
    """What the real verb refuses (a process node cannot be cut off), its dry run refuses the same way."""
    before = snapshot(world)
    for argv, message in ((("fault", "partition", "c1", "0"), "a network partition is not emulated on process nodes"),
                          (("compute", "preempt", "c1"), "compute c1 is dedicated"),
                          (("job", "cancel", "nope"), "job 'nope' not found")):
        result = invoke(world, *argv, "--dry-run")
        assert result.exit_code == 1 and message in result.stderr, result.output
    assert snapshot(world) == before


def test_cleanup_dry_run_without_a_readable_database(tmp_path: Path, monkeypatch) -> None:
    """A corrupt database: the dry run lists what cleanup would still do (supervisors found by
    their command line, nodes by their folders), then says the way out, as cleanup does."""
    monkeypatch.chdir(tmp_path)
    emu = Emulator(tmp_path / "home", backend="process")
    emu.create_compute(ClusterSpec("c1", "STANDARD_D2_V2", min_nodes=1, max_nodes=1))
    home = emu.home.root
    emu.store.close()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "amlemu.runs.supervisor",
                                str(home), "some_run"], start_new_session=True)
    try:
        corrupt_db(home, tmp_path)
        files = {p: p.stat().st_mtime_ns for p in home.rglob("*")}
        broken = CliRunner().invoke(cli, ["--home", str(home), "cleanup", "--dry-run", "-o", "json"])
        assert broken.exit_code == 1 and "amlemu cleanup --reset-state" in broken.stderr, broken.output
        actions = json.loads(broken.stdout)["actions"]
        assert {"action": "stop", "what": "process group", "name": str(sleeper.pid), "run": "some_run",
                "role": "supervisor"} in actions
        assert any(a["what"] == "process node" and a["name"] == "c1-node-0" for a in actions)
        fixed = CliRunner().invoke(cli, ["--home", str(home), "cleanup", "--reset-state", "--dry-run"])
        assert fixed.exit_code == 0 and "move aside state database" in fixed.stdout, fixed.output
        assert sleeper.poll() is None and {p: p.stat().st_mtime_ns for p in home.rglob("*")} == files
    finally:
        sleeper.kill()
        sleeper.wait()
        CliRunner().invoke(cli, ["--home", str(home), "cleanup", "--reset-state", "--yes"])


# --- the command tree ------------------------------------------------------------------------------


def mutating_verbs() -> list[str]:
    return [path for path, _ in commands(cli) if path not in READ_ONLY]


def test_every_mutating_verb_has_a_dry_run_and_json() -> None:
    """A verb added later without --dry-run (or -o json for it) fails here, unless it is read-only
    and says so in READ_ONLY."""
    tree = dict(commands(cli))
    assert set(READ_ONLY) <= set(tree), f"READ_ONLY names verbs that are gone: {set(READ_ONLY) - set(tree)}"
    for path in mutating_verbs():
        options = {opt for param in tree[path].params for opt in param.opts}
        assert "--dry-run" in options, f"`amlemu {path}` changes something and has no --dry-run"
        assert "--output" in options, f"`amlemu {path}` has no -o/--output for its dry run's JSON"
