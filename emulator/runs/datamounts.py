"""A run's v2 `ro_mount` inputs served lazily on every node by the data runtime's mount
(storage/dataruntime), as AmlCompute serves them: the listing at once, each file fetched when first
opened (or in blocks), the job's DATASET_MOUNT_* / RSLEX_* variables as the mount's settings, its
logs in the run's system_logs/data_capability/<node>/.

Where: one mount (one serving process, one cache) per input per node, made by the supervisor on
the host before the job's processes start, at the input's own folder on the node's disk
(INPUT_<name>, the path the job sees; a uri_file input's folder shows that one file). A node gets
no /dev/fuse nor capability: a process node's sandbox binds its disk recursively (the mount comes
with it), a docker node binds its disk with slave propagation (nodedisk makes the disk a shared
mount), so a mount made after the container started reaches it. Per node, not one shared by the
run's nodes: each node has its own cache, counters and logs, as each AmlCompute node runs its own
runtime. The mount's state (record, cache) is in the node's cache folder, which no node sees: a
job cannot lead the host's writes there through a link.

Prefetch stays a choice: AMLEMU_DATA_PREFETCH in the job's environment_variables (`true`: every
ro_mount input; or input names, comma-separated) fills the node cache before the job instead
(runs/mounts.py), as do v1 jobs (their datastore mounts are blobfuse's) and inputs by URL.
"""
from __future__ import annotations

import posixpath
import re
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from amlemu.backends import nodefs
from amlemu.errors import ConfigError, NotFoundError
from amlemu.runs.contract import NODE_ROOT, Binding, run_folder_id
from amlemu.specs import DataMode, JobSpec
from amlemu.storage.dataruntime import mount as drmount
from amlemu.storage.dataruntime.settings import Settings, from_env
from amlemu.storage.urlinputs import is_url_source

PREFETCH_VAR = "AMLEMU_DATA_PREFETCH"
ALL = ("true", "1", "yes", "all", "*")
NONE = ("", "false", "0", "no", "none")
STATE = "dataruntime"  # in a node's cache folder: <run folder id>/<input>/ (record, cache)


@dataclass(frozen=True)
class DataMount:
    """One input served by the data runtime's mount on each node: pure data, shown by the dry run."""

    ref: str  # inputs.<name>
    node_path: str  # the mount point inside every node
    datastore: str
    path: str  # the folder served, within the datastore
    only: str | None = None  # a uri_file input: the one file its folder shows

    @property
    def name(self) -> str:
        return self.ref.partition(".")[2]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def prefetch_choice(env: dict[str, str], inputs: list[str]) -> set[str]:
    """The ro_mount inputs AMLEMU_DATA_PREFETCH names (all of them for `true`); a name that is no
    ro_mount input of the job is one line naming the variable."""
    raw = env.get(PREFETCH_VAR, "").strip()
    if raw.lower() in NONE:
        return set()
    if raw.lower() in ALL:
        return set(inputs)
    names = {n.strip() for n in raw.split(",") if n.strip()}
    unknown = sorted(names - set(inputs))
    if unknown:
        raise ConfigError(f"environment_variables.{PREFETCH_VAR}", f"'{unknown[0]}' is not a ro_mount input of this job",
                          f"name ro_mount inputs (comma-separated; here: {', '.join(inputs) or 'none'}), or true for all")
    return names


def plan_mounts(job: JobSpec, data: tuple[Binding, ...] | list[Binding], cores: float = 0) -> tuple[
        tuple[DataMount, ...], Settings | None]:
    """The inputs the data runtime serves (v2 ro_mount inputs from a datastore or a local path,
    unless prefetch is chosen for them) and the mount's settings from the job's variables (a bad
    value: one line naming it). Pure: the dry run and the supervisor get the same."""
    candidates = [b for b in data if not b.is_output and b.mode is DataMode.RO_MOUNT]
    prefetched = prefetch_choice(job.environment_variables, [b.name for b in candidates])
    try:
        settings = from_env(job.environment_variables, max(1, int(cores)) if cores else None)
    except ConfigError as exc:  # named as the job's field, as the other variables' errors are
        raise ConfigError(f"environment_variables.{exc.field}", exc.problem, exc.fix) from None
    if job.log_layout == "v1":  # v1's datastore mounts are blobfuse's long-TTL cache (runs/mounts.py)
        return (), None
    mounts = tuple(_mount(b) for b in candidates if b.name not in prefetched and not is_url_source(b.datastore))
    return mounts, settings if mounts else None


def _mount(b: Binding) -> DataMount:
    if b.type == "uri_file":
        return DataMount(b.ref, posixpath.dirname(b.node_path), b.datastore, posixpath.dirname(b.path),
                         posixpath.basename(b.path))
    return DataMount(b.ref, b.node_path, b.datastore, b.path)


def state_dir(cache_dir: Path, run_id: str, name: str | None = None) -> Path:
    """A mount's record and cache on the host: in the node's cache folder, which no node sees."""
    folder = cache_dir / STATE / run_folder_id(run_id)
    return folder / name if name else folder


def fsname(run_id: str, node: str, name: str) -> str:
    """The mount's source in the mount table (unique: unmount finds it wherever a job moved it)."""
    return "amlemu-dataruntime:" + re.sub(r"[^A-Za-z0-9_.-]", "_", f"{run_folder_id(run_id)[:12]}:{node}:{name}")


def mount_node(request: Any, run_id: str, logs: Path, mounts: tuple[DataMount, ...], settings: Settings,
               source: Callable[[str], Any], guarded: Callable[[DataMount, Callable[[], Any]], Any],
               log: Callable[[str], None], home_root: Path | None = None) -> None:
    """Every mount of the run on one node, each at its input's folder on the node's disk (made
    fresh by the host before the job starts: no link of the job's on the way); inputs side by side,
    each served by a process the home's fork server forks (`home_root`)."""
    points = [nodefs.fresh_dir(request.node_dir, str(Path(m.node_path).relative_to(NODE_ROOT))) for m in mounts]

    def one(m: DataMount, point: Path) -> None:
        state, src = state_dir(request.cache_dir, run_id, m.name), source(m.datastore)
        guarded(m, lambda: _there(src, m))
        record = guarded(m, lambda: drmount.start_process(
            src.fs.to_json(), src.remote(m.path), point, state, state / "cache", logs / request.name, settings,
            only=m.only, fsname=fsname(run_id, request.name, m.name), home_root=home_root))
        how = "local placeholders, each file fetched at its first read" if record.held_by is not None else \
            "FUSE, files fetched when opened"
        log(f"{m.ref}: ro_mount of {m.datastore}/{m.path}{'/' + m.only if m.only else ''} on {request.name}: "
            f"the data runtime's mount (server {record.pid}; {how})")
    with ThreadPoolExecutor(len(mounts)) as pool:
        list(pool.map(one, mounts, points))


def _there(src: Any, m: DataMount) -> None:
    """The input's path is there and readable with the datastore's credential (one request): as
    on AmlCompute, a mount of a missing path fails the run before the job starts, naming the input."""
    path = posixpath.join(m.path, m.only) if m.only else m.path
    try:
        info = src.fs.info(src.remote(path)) if path else {"type": "directory"}
    except FileNotFoundError:
        info = None
    if info is None:
        raise NotFoundError("path", f"{path or '/'} in datastore {m.datastore}",
                            f"list what is there with `amlemu data ls azureml://datastores/{m.datastore}/paths/`")


def unmount_node(cache_dir: Path, run_id: str, log: Callable[[str], None]) -> None:
    """The run's mounts on one node unmounted, their servers ended, caches and records removed;
    after the job's processes are gone (a busy mount waits DATASET_UNMOUNT_TIMEOUT_SECONDS)."""
    folder = state_dir(cache_dir, run_id)
    if not folder.is_dir():
        return
    for action in drmount.plan_unmount_under(folder, "*"):
        try:
            done = action.run() if action.run else None
            if isinstance(done, str) and done:
                log(f"data runtime: {done}")
        except Exception as exc:  # noqa: BLE001 - the other mounts are still unmounted
            log(f"warning: data runtime: {action.verb} {action.subject}: {type(exc).__name__}: {exc}")
    shutil.rmtree(folder, ignore_errors=True)
