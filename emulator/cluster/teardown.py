"""Taking things down, planned first: deleting a compute, cleaning a home up (with or without a
readable state database), setting a broken database aside, forgetting the workspace's data.

Each plan_* reads the state and returns the Actions (emulator/actions.py) that its verb carries
out with `execute`: `amlemu compute delete|cleanup --dry-run` print exactly these.
"""
from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import time
from pathlib import Path

import psutil

from amlemu import procinfo, servicefile
from amlemu.actions import Action
from amlemu.backends import BACKENDS, backend_class, get_backend, nodedisk
from amlemu.cluster import autoscale, spanning
from amlemu.cluster.store import Store
from amlemu.errors import StateError
from amlemu.home import AGENT_CONFIG_VARIABLE, Home
from amlemu import forkserver
from amlemu.storage.azurite import Azurite
from amlemu.storage.dataruntime import mount as drmount

# What a cleanup empties in the home; the home's MLflow store (mlflow: the runs' MLflow data, live
# from the service or copied by `amlemu ui --mlflow`) goes with the runs; mlflow-ui: older homes' copy; rank-memory:
# the memory per rank measured in the runs (runs/memwatch.py); forkserver: the fork server's socket and log.
# (The images of the nodes' disks are kept outside the home and go with their disks: backends/nodedisk.py.)
RUN_FOLDERS = ("nodes", "caches", "process-nodes", "runs", "mlflow", "mlflow-ui", "rank-memory", "forkserver")
# What the Azure ML service (`amlemu serve`) keeps for the runs: the code it was sent, the jobs'
# REST bodies and the registry naming them; they go with the runs (its CA and secrets stay).
SERVICE_RUN_DATA = ("service/blobs", "service/blob-metadata", "service/jobs", "service/registry.json")
# What `cleanup --all` forgets besides the records: (folder, what it holds).
DATA_FOLDERS = (("azurite", "Azurite's data"), ("datastores", "datastore folders"), ("secrets", "secrets"),
                ("service", "the Azure ML service's CA, secrets and log"))


def ours(pid: int, run_id: str, started: float | None = None) -> bool:
    """Is `pid` still the live supervisor or launch of this run? (Never act on a reused pid.)
    `started`: the start time recorded with the pid (an owner forked by the home's fork server
    carries the server's argv, emulator/forkserver.py): then that process, whatever its argv."""
    if started is not None:
        return procinfo.alive(pid, started)
    try:
        proc = psutil.Process(pid)
        # The id as a whole word of the argv (an argument, a path component): a job may be named
        # `a`, which a bare substring test would find in almost any process reusing the pid.
        word = re.compile(rf"(?<![\w-]){re.escape(run_id)}(?![\w-])")
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if any(word.search(part) for part in procinfo.argv(proc)):
            return True
        # mpirun's argv names the run's folder by a hash, as Azure ML's does; its environment names
        # the run's launch agent configuration (runs/agent.py), which a process reusing the pid would not have.
        return bool(word.search(proc.environ().get(AGENT_CONFIG_VARIABLE, "")))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _kill_group(pid: int, wait: float = 30.0) -> bool | None:
    """SIGKILL the group, then wait until none of its members runs: one in a system call (a
    supervisor's `umount` flushing a node disk) dies only when the call returns, and a cleanup
    that returned meanwhile would leave it behind."""
    members = _group(pid)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False  # gone meanwhile: nothing was done
    deadline = time.monotonic() + wait
    for proc in members:
        with contextlib.suppress(psutil.NoSuchProcess):
            while proc.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
                time.sleep(0.02)
    return None


def _group(pgid: int) -> list[psutil.Process]:
    """The live processes of process group `pgid`."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(ProcessLookupError, psutil.Error):
            if os.getpgid(proc.pid) == pgid:
                found.append(proc)
    return found


def _remove_folder(path: Path) -> Action:
    if path.is_file():
        return Action("remove", "file", str(path), run=functools.partial(path.unlink, missing_ok=True))
    return Action("remove", "folder", str(path), run=functools.partial(_remove_tree, path))


def _remove_tree(path: Path) -> None:
    """Never through a mount: node disks under it are detached first, a node made after the plan
    was read included (a supervisor stopped while it created one)."""
    nodedisk.detach_all(path)
    shutil.rmtree(path, ignore_errors=True)


def plan_delete_compute(home: Home, store: Store, name: str) -> list[Action]:
    """Its nodes, what the cluster holds on its backend (a network), its records and folders."""
    cluster = store.cluster(name)
    active = [r.id for r in store.runs(cluster=name) if not r.status.is_terminal]
    if active:
        raise StateError(f"compute '{name}' has active job(s) {', '.join(active)}; cancel them first")
    backend = get_backend(cluster.backend, home)
    nodes = store.nodes(name)
    plan = [a for node in nodes
            for a in backend.plan_remove_node(autoscale.node_request(home, cluster.spec, node.idx))]
    plan += backend.plan_remove_cluster(name)
    plan.append(Action("delete", "compute record", name, {"node_records": len(nodes)},
                       run=lambda: store.delete_cluster(name)))
    listed = {folder for a in plan for folder in a.detail.get("folders", [])}
    disks = [a for a in plan_release_disks(home.root / "nodes" / name)
             if a.name not in {str(autoscale.node_request(home, cluster.spec, n.idx, host_gpus=()).node_dir)
                                 for n in nodes}]  # the others go with their nodes
    folders = [home.root / sub / name for sub in ("nodes", "caches")] + [nodedisk.images_dir(home.root, name)]
    return plan + disks + [_remove_folder(f) for f in folders if f.exists() and str(f) not in listed]


def plan_reap_nodes(home: Home, all_homes: bool) -> list[Action]:
    """Every node and network of the home (of every home: all_homes), on every usable backend;
    then every node disk still mounted in the home (a node whose record was lost)."""
    return drmount.plan_unmount_under(home.root / "caches") + [  # data runtime mounts first: they are in node disks
        a for name in BACKENDS if backend_class(name).available()[0]
        for a in get_backend(name, home).plan_reap(all_homes)] + plan_release_disks(home.root / "nodes", all_homes)


def plan_release_disks(folder: Path, all_homes: bool = False) -> list[Action]:
    """The node disks mounted under `folder` (all_homes: every home's), unmounted (their loop
    devices freed) and their images removed."""
    points = nodedisk.every_home_disk() if all_homes else nodedisk.mounted_under(folder)
    return [Action("unmount", "node disk", str(point), {"image": str(nodedisk.image_path(point))},
                   run=functools.partial(nodedisk.detach, point), always=True) for point in points]


def plan_stop_azurite(azurite: Azurite) -> list[Action]:
    """The home's storage server, which never outlives a cleanup, even a failed one (a shared one
    is not the home's: AMLEMU_AZURITE_DIR)."""
    running = None if azurite.shared else azurite.running()
    return [Action("stop", "Azurite server", "", {"port": running.port}, run=azurite.stop, always=True)] \
        if running else []


def plan_stop_forkserver(home: Home) -> list[Action]:
    """The home's fork server (emulator/forkserver.py), by its recorded pid and start time."""
    found = forkserver.servers(home.root)  # one just started too, before its pid file
    return [Action("stop", "fork server", ",".join(str(s.pid) for s in found), {"pids": [s.pid for s in found]},
                   run=functools.partial(forkserver.stop, home.root), always=True)] if found else []


def plan_stop_service(home: Home) -> list[Action]:
    """The home's Azure ML service (`amlemu serve`), which never outlives a cleanup either."""
    running = servicefile.read_state(home.root)
    return [Action("stop", "Azure ML service", running.url, {"pid": running.pid},
                   run=functools.partial(servicefile.stop, home.root), always=True)] if running else []


def plan_cleanup(home: Home, store: Store, azurite: Azurite, all_homes: bool = False) -> list[Action]:
    """Stop every run and server, remove every node, network, run and cluster of the home. The
    workspace and its datastores' records and data stay, as a blob container would."""
    plan = [Action("stop", "process group", str(pid), {"run": record.id, "role": role},
                   run=functools.partial(_kill_group, pid))
            for record in store.runs()
            for role, pid, started in (("supervisor", record.supervisor_pid, record.supervisor_started),
                                       ("launch", record.launch_pid, None))
            if pid and ours(pid, record.id, started)]
    # The service and the fork server first: they would otherwise start runs while the nodes go.
    plan = (plan_stop_service(home) + plan_stop_forkserver(home) + plan + spanning.plan_forget_lost(home, store)
            + plan_reap_nodes(home, all_homes) + spanning.plan_reap(home, store)  # the swarm: around the nodes
            + plan_stop_azurite(azurite))
    plan.append(Action("forget", "runs and computes", "", {"runs": len(store.runs()), "computes": len(store.clusters())},
                       run=lambda: store.reset(keep_data=True)))
    return plan + [_remove_folder(home.root / sub) for sub in RUN_FOLDERS + SERVICE_RUN_DATA
                   if (home.root / sub).exists()]


def plan_reap_without_state(home: Home, all_homes: bool, cache: Path) -> list[Action]:
    """What cleanup can do when the state database cannot be read: supervisors found by their
    command line (`python -m amlemu.runs.supervisor <home> <run id>`, each leading its own process
    group: exactly that, never a looser match), nodes and networks found as reap finds them
    (Docker labels, process nodes' folders, on every engine the home recorded), the swarm amlemu
    made for them, and Azurite."""
    groups: dict[int, str] = {}  # a supervisor's group; its watchdog (same command line) is in it
    for p in psutil.process_iter(["pid", "cmdline"]):  # the fork server, and the owners it forked (their argv is its)
        if {"amlemu.runs.supervisor", forkserver.MODULE} & set(p.info["cmdline"] or []) \
                and str(home.root) in p.info["cmdline"] and p.info["pid"] != os.getpid():
            with contextlib.suppress(ProcessLookupError):
                groups.setdefault(os.getpgid(p.info["pid"]), p.info["cmdline"][-1])
    supervisors = [Action("stop", "process group", str(pgid), {"run": run, "role": "supervisor"},
                          run=functools.partial(_kill_group, pgid)) for pgid, run in sorted(groups.items())]
    return (plan_stop_service(home) + supervisors + spanning.plan_forget_lost(home, None)
            + plan_reap_nodes(home, all_homes) + spanning.plan_reap(home, None)  # other machines: as the home recorded them
            + plan_stop_azurite(Azurite(home.root, cache)))


def plan_move_state_aside(home: Home, store: Store | None) -> list[Action]:
    """amlemu.db (and its -wal/-shm, which belong to it) -> amlemu.db.broken-<time>: kept for a
    post-mortem, out of the way of the fresh database the next command creates."""
    target = home.db.with_name(f"{home.db.name}.broken-{time.strftime('%Y%m%d-%H%M%S')}")

    def move() -> str:
        if store is not None:
            store.close()
        for suffix in ("", "-wal", "-shm"):
            source = Path(f"{home.db}{suffix}")
            if source.exists():
                source.rename(f"{target}{suffix}")
        return f"state database (moved to {target})"
    return [Action("move aside", "state database", str(home.db), {"to": str(target)}, run=move)]


def plan_forget_data(home: Home, store: Store | None) -> list[Action]:
    """`cleanup --all`, after a cleanup plan (which stops Azurite): the workspace's settings,
    datastore records, secrets, and the data the emulator holds for its datastores (Azurite's,
    and local datastores' folders inside the home). A local datastore's folder outside the home
    is the user's own and stays. No store: the database was set aside, only the folders go."""
    specs = store.datastores() if store is not None else []
    plan = [Action("remove", "folder", str(folder), {"holds": f"data of datastore {spec['name']}"},
                   run=functools.partial(shutil.rmtree, folder, ignore_errors=True))
            for spec in specs if spec.get("kind") == "local"
            for folder in [Path(spec.get("folder") or "/nonexistent")]
            if folder.is_relative_to(home.root) and folder.exists()
            and not any(folder.is_relative_to(home.root / sub) for sub, _ in DATA_FOLDERS)]
    plan += [Action("remove", "folder", str(home.root / sub), {"holds": what},
                    run=functools.partial(shutil.rmtree, home.root / sub, ignore_errors=True))
             for sub, what in DATA_FOLDERS if (home.root / sub).exists()]
    if store is not None:
        plan.append(Action("forget", "workspace settings and datastore records", "", {"datastores": len(specs)},
                           run=lambda: store.reset(keep_data=False)))
    return plan
