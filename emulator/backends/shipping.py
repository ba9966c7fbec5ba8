"""Nodes on a machine that does not share this machine's files (issue 31: an `ssh://` or `tcp://`
engine, or one added with `--files shipped`).

Such a node cannot bind this machine's folders: Docker would make each missing source an empty
folder on that machine. Its disk (/mnt/azureml), its blob cache and its job environment are Docker
volumes on its own engine instead, labelled as the node's container is. The host's node folders
stay the staging copies every step already uses, and the engine's archive API carries them across:

- before a job: the run's folder (code snapshot, env file, MLflow store, inputs downloaded) into the
  node's disk, and the cache entries new or changed since the node's last job into its cache
  volume (those removed here, removed there);
- while it runs: the node's MLflow store, copied back once a second (metrics before the end);
- after it, with no job process left: the run's folder back into the staging copy, read as the
  job's (untrusted): regular files and folders only, every name checked; links, devices and fifos
  are listed and not collected, as on this machine's nodes.

The cache and environment volumes are read-only in the node, so they are filled through a
container that is created, never started, with the volume writable (Docker's archive API works on
a stopped container's volumes). Pure parts (names, the tar members kept, which cache files
changed) are unit-tested; the rest is a few engine calls each.
"""
from __future__ import annotations

import io
import json
import os
import posixpath
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from amlemu.backends import dockerengines, nodefs
from amlemu.backends.base import CACHE_ROOT, LABEL, NODE_ROOT, NodeRequest
from amlemu.errors import BackendError

DISK, CACHE, ENV = "disk", "cache", "env"
MANIFEST = "shipped.json"  # in the node's cache folder here: what its cache volume holds
FILL_ROOT = "/fill"  # where a filler container has the volume it fills
SPOOL = 64 << 20  # a tar held in memory up to this size, then in a temporary file


def volume_name(container: str, kind: str) -> str:
    return f"{container}-{kind}"


def volumes(request: NodeRequest, container: str, environment: bool = True) -> dict[str, dict[str, str]]:
    """The node's volumes as docker binds (a name, not a path, is a volume): its disk, its cache
    (read-only, as the host's bind is) and, with `environment` (a mirror node), its job environment
    at the environment's own path."""
    found = {volume_name(container, DISK): {"bind": NODE_ROOT, "mode": "rw"},
             volume_name(container, CACHE): {"bind": CACHE_ROOT, "mode": "ro"}}
    if request.python_env and environment:
        found[volume_name(container, ENV)] = {"bind": request.python_env, "mode": "ro"}
    return found


# --- pure parts ----------------------------------------------------------------------------------
def kept(member: tarfile.TarInfo, strip: str) -> str | None:
    """The path under the destination that an archive member from a node is extracted to, or None
    for what is not taken: anything but a regular file or folder, a name that is absolute or has
    `..`, or one outside `strip` (the folder asked for, the archive's first part)."""
    name = posixpath.normpath(member.name)
    if name == strip:
        return "" if member.isdir() else None
    if not name.startswith(strip + "/") or name.startswith("/") or ".." in name.split("/"):
        return None
    if not (member.isfile() or member.isdir()):
        return None
    return name[len(strip) + 1:]


def listing(folder: Path) -> dict[str, list[int]]:
    """Every regular file under `folder`: its path, with size and modification time (ns)."""
    found: dict[str, list[int]] = {}
    for path in sorted(folder.rglob("*")) if folder.is_dir() else []:
        info = path.lstat()
        if stat.S_ISREG(info.st_mode):
            found[path.relative_to(folder).as_posix()] = [info.st_size, info.st_mtime_ns]
    return found


def changed(before: dict[str, list[int]], now: dict[str, list[int]]) -> list[str]:
    """The files of `now` that `before` lacks or had with another size or time."""
    return [path for path, facts in now.items() if before.get(path) != facts]


# --- archives ------------------------------------------------------------------------------------
def pack(root: Path, names: Iterable[str], prefix: str = "") -> BinaryIO:
    """A tar of root/<name> for each name (folders whole), named `prefix`/<name>, with every folder
    above each one; links stay links (the platform's own point into the cache), anything else
    special is left out. Returned rewound, spooled to disk past SPOOL."""
    out = tempfile.SpooledTemporaryFile(SPOOL)
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        made: set[str] = set()
        for name in names:
            parts = Path(prefix, name).parts
            for depth in range(1, len(parts)):  # the folders above, so the engine makes them
                above = "/".join(parts[:depth])
                if above not in made:
                    made.add(above)
                    folder = tarfile.TarInfo(above)
                    folder.type, folder.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(folder)
            tar.add(root / name, arcname=str(Path(prefix, name)), filter=_shippable)
    out.seek(0)
    return out  # type: ignore[return-value]


def _shippable(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return member if member.isfile() or member.isdir() or member.issym() else None


def unpack(chunks: Iterable[bytes], dest: Path, strip: str) -> list[str]:
    """A node's archive (docker get_archive's stream) extracted into `dest`, what `kept` allows
    only; returns the names left out (relative to `strip` when under it, else as the archive names
    them). Folders are made without following a link: `dest` is a fresh folder the host made."""
    skipped: list[str] = []
    with tarfile.open(fileobj=_Stream(iter(chunks)), mode="r|") as tar:
        for member in tar:
            rel = kept(member, strip)
            if rel is None:
                skipped.append(posixpath.normpath(member.name).removeprefix(strip + "/"))
            elif member.isdir():
                _folder(dest, rel)
            else:
                target = _folder(dest, posixpath.dirname(rel)) / posixpath.basename(rel)
                nodefs.remove(target)  # a folder of the same name, in an archive made to collide
                try:
                    with open(target, "wb") as out:
                        shutil.copyfileobj(tar.extractfile(member), out, 1 << 20)  # type: ignore[misc]
                except BaseException:
                    target.unlink(missing_ok=True)  # a file cut short is not collected as if whole
                    raise
                os.chmod(target, member.mode & 0o777)
                os.utime(target, ns=(int(member.mtime * 1e9),) * 2)
    return skipped


def _folder(dest: Path, rel: str) -> Path:
    """dest/rel as a real folder (made, or kept where it is one already)."""
    return dest if not rel else nodefs.inside(dest, rel) or nodefs.fresh_dir(dest, rel)


class _Stream(io.RawIOBase):
    """The engine's chunks as a file tarfile can read in stream mode."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.rest = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.rest:
            try:
                self.rest = next(self.chunks)
            except StopIteration:
                return 0
        count = min(len(buffer), len(self.rest))
        buffer[:count], self.rest = self.rest[:count], self.rest[count:]
        return count


# --- the engine ----------------------------------------------------------------------------------
def make_volumes(client: Any, request: NodeRequest, container: str, binds: dict[str, dict[str, str]],
                 labels: dict[str, str]) -> None:
    """The node's volumes among its planned `binds` (the names that are not paths) made on its engine,
    labelled as its container (the reaper finds them by label); the environment's filled from this
    machine's build."""
    for name in binds:
        if not name.startswith("/"):
            client.volumes.create(name=name, labels=labels)
    if volume_name(container, ENV) in binds:
        fill(client, container, ENV, filler_labels(request), pack(Path(request.python_env or ""), ["."]))


def fill(client: Any, container: str, kind: str, labels: dict[str, str], archive: BinaryIO) -> None:
    """`archive` into the node's `kind` volume through a filler: a container created (not started)
    with the volume writable, removed after."""
    from amlemu.backends.dockerplan import MIRROR_IMAGE  # noqa: PLC0415 - dockerplan imports this module

    filler = client.api.create_container(
        MIRROR_IMAGE, command=["/bin/true"], name=f"{container}-fill-{kind}", labels=labels,
        host_config=client.api.create_host_config(binds={volume_name(container, kind): {"bind": FILL_ROOT, "mode": "rw"}}))
    try:
        if not client.api.put_archive(filler["Id"], FILL_ROOT, archive):
            raise BackendError(f"{container}: the engine did not take the files for its {kind} volume")
    finally:
        archive.close()
        client.api.remove_container(filler["Id"], force=True)


def remove_argv(paths: list[str]) -> list[str]:
    """Removes cache files (paths relative to the volume, as listed here) in a filler that has the
    volume at FILL_ROOT."""
    return ["/usr/bin/rm", "-f", "--", *(f"{FILL_ROOT}/{p}" for p in paths if ".." not in p.split("/"))]


def remove_files(client: Any, container: str, labels: dict[str, str], paths: list[str]) -> None:
    """Files out of the node's cache volume: a filler that runs, with this machine's software at its
    paths as a mirror node has it (the volume is read-only in the node itself)."""
    from amlemu.backends.software import software_paths  # noqa: PLC0415
    from amlemu.backends.dockerplan import MIRROR_IMAGE  # noqa: PLC0415

    binds = {p: {"bind": p, "mode": "ro"} for p in software_paths()}
    binds[volume_name(container, CACHE)] = {"bind": FILL_ROOT, "mode": "rw"}
    filler = client.api.create_container(
        MIRROR_IMAGE, command=remove_argv(paths), name=f"{container}-fill-remove", labels=labels,
        host_config=client.api.create_host_config(binds=binds, network_mode="none"))
    try:
        client.api.start(filler["Id"])
        client.api.wait(filler["Id"], timeout=120)
    finally:
        client.api.remove_container(filler["Id"], force=True)


def push(client: Any, request: NodeRequest, container: str, rel: str | None, labels: dict[str, str]) -> int:
    """Before a job: the cache entries new since the node's last job into its cache volume, and the
    run's folder `rel` (if given) into its disk. The number of cache files shipped."""
    manifest = request.cache_dir / MANIFEST
    before = json.loads(manifest.read_text()) if manifest.is_file() else {}
    now = listing(request.cache_dir / "data")
    new, gone = changed(before, now), sorted(set(before) - set(now))
    if gone:  # removed from storage since: gone from the node's listing too
        remove_files(client, container, labels, gone)
    if new:
        fill(client, container, CACHE, labels, pack(request.cache_dir / "data", new))
    if new or gone:
        manifest.write_text(json.dumps(now))
    if rel is not None:
        with pack(request.node_dir, [rel]) as archive:
            if not client.api.put_archive(container, NODE_ROOT, archive):
                raise BackendError(f"node {request.name}: the engine did not take the run's folder")
    return len(new)


def pull(client: Any, request: NodeRequest, container: str, rel: str) -> list[str]:
    """After a job: the node's `rel` back into a fresh staging folder here; the names not taken."""
    import docker  # noqa: PLC0415

    try:
        chunks, _ = client.api.get_archive(container, f"{NODE_ROOT}/{rel}")
        return unpack(chunks, nodefs.fresh_dir(request.node_dir, rel), posixpath.basename(rel))
    except docker.errors.NotFound:  # the job removed its own folder
        return []
    except (docker.errors.APIError, tarfile.TarError) as exc:  # what came so far is kept
        raise BackendError(f"node {request.name}: its run's folder came back in part: {exc}") from None


def copy_file(client: Any, container: str, rel: str, dest: Path) -> bool:
    """One regular file of the node's disk into `dest` (its MLflow store while the job writes it)."""
    try:
        chunks, _ = client.api.get_archive(container, f"{NODE_ROOT}/{rel}")
        with tarfile.open(fileobj=_Stream(iter(chunks)), mode="r|") as tar:
            for member in tar:
                if member.isfile() and member.name == posixpath.basename(rel):
                    partial = dest.with_name(dest.name + ".part")
                    with open(partial, "wb") as out:
                        shutil.copyfileobj(tar.extractfile(member), out)  # type: ignore[misc]
                    partial.replace(dest)
                    return True
    except Exception:  # noqa: BLE001 - not there yet, or its machine lost: the next look, or the end, has it
        return False
    return False


def filler_labels(request: NodeRequest) -> dict[str, str]:
    """A filler's labels: the home's (the reaper's), not a node's (it is no node to list)."""
    return {LABEL: "1", f"{LABEL}.home": request.home_id, f"{LABEL}.filler": request.name}


def remove_volumes(client: Any, request: NodeRequest) -> None:
    """The node's volumes, found by its labels (a request rebuilt for a removal may not name its
    environment)."""
    import docker  # noqa: PLC0415

    for volume in client.volumes.list(filters={"label": [f"{LABEL}.home={request.home_id}", f"{LABEL}.node={request.name}"]}):
        try:
            volume.remove(force=True)
        except docker.errors.NotFound:
            pass


class Shipped:
    """The docker backend's ship_in, ship_out and copy_out (NodeBackend's) for its nodes on
    another host; its other nodes' disks are this machine's folders, as NodeBackend's are."""

    def engine(self, request: NodeRequest) -> Any: ...  # DockerBackend's
    def container_name(self, request: NodeRequest) -> str: ...  # DockerBackend's

    def ship_in(self, request: NodeRequest, rel: str | None) -> int:
        if not request.ships_files:
            return 0
        return push(self.engine(request), request, self.container_name(request), rel, filler_labels(request))

    def ship_out(self, request: NodeRequest, rel: str) -> list[str]:
        if not request.ships_files:
            return []  # a node gone, or its machine lost: its disk with it, as a lost node's on AmlCompute
        return dockerengines.find(lambda: pull(self.engine(request), request, self.container_name(request), rel),
                                  request) or []

    def copy_out(self, request: NodeRequest, rel: str, dest: Path) -> bool:
        if not request.ships_files:
            return nodefs.copy_file(request.node_dir, rel, dest)
        return copy_file(self.engine(request), self.container_name(request), rel, dest)
