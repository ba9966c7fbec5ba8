"""A run's data on its nodes, done by the host (nodes never hold a credential or a privilege):

- ro_mount of a v2 job: the data runtime's mount on each node (runs/datamounts.py), unless
  prefetch is chosen (AMLEMU_DATA_PREFETCH) or the node cannot take a mount made after it started;
- ro_mount prefetched (and v1's): the input is synced into each node's blob cache (`nodecache`); the run's mount
  (`.../mounts/<datastore>`) and `INPUT_<name>` point into the cache, which the node sees read-only;
- download: the input is copied onto the node's disk before the job starts (never refreshed);
- direct: the URI is passed through, the job reads it itself;
- rw_mount / upload outputs: a writable folder on each node, written back to the datastore when
  the job ends, whatever the ending (outputs written before a failure are kept).
"""
from __future__ import annotations

import os
import posixpath
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from amlemu.errors import AmlEmuError, BackendError
from amlemu.runs import datamounts
from amlemu.runs.contract import CACHE_ROOT, LOCAL_SOURCE, NODE_ROOT, Binding, bindings, mount_dir
from amlemu.runs.modelmount import copy_model, is_mlflow_model
from amlemu.specs import DataMode, JobSpec
from amlemu.storage.datastores import Datastores
from amlemu.storage.nodecache import WORKERS, CacheError, CachePolicy, NodeCache, Source
from amlemu.storage.urlinputs import is_url_source, open_url, reason, unreachable


def host_path(node_dir: Path, node_path: str) -> Path:
    """A path inside the node (under /mnt/azureml) as the host sees it on the node's disk."""
    return node_dir / Path(node_path).relative_to(NODE_ROOT)


class RunData:
    def __init__(self, datastores: Datastores, job: JobSpec, run_id: str, policy: CachePolicy,
                 log: Callable[[str], None]) -> None:
        self.datastores, self.run_id, self.policy, self.log = datastores, run_id, policy, log
        self.bindings = bindings(job, run_id)
        # inputs by URL: read by this machine into the node cache as a datastore is (storage/urlinputs.py)
        self._urls = {b.datastore: (b.uri, b.type) for b in self.bindings if is_url_source(b.datastore)}
        self._sources: dict[str, Source] = {}
        self._lock = threading.Lock()
        self.job = job
        self.lazy, self.settings = datamounts.plan_mounts(job, self.bindings)  # the data runtime's mounts
        self.late: set[str] = set()  # nodes that take them (prepare_nodes)

    @property
    def mounted(self) -> list[Binding]:
        return [b for b in self.bindings if not b.is_output and b.mode is DataMode.RO_MOUNT]

    def source(self, name: str) -> Source:
        with self._lock:  # nodes are prepared in parallel threads: one filesystem per datastore
            if name not in self._sources:
                if name == LOCAL_SOURCE:
                    import fsspec  # noqa: PLC0415

                    self._sources[name] = Source(name, fsspec.filesystem("file"), "/")
                elif name in self._urls:
                    self._sources[name] = Source(name, *open_url(*self._urls[name]))
                else:
                    fs, root = self.datastores.filesystem(name)
                    self._sources[name] = Source(name, fs, root)
            return self._sources[name]

    def _guard_mount(self, mount: Any, action: Callable[[], Any]) -> Any:
        return self._guarded(next(b for b in self.bindings if b.ref == mount.ref), action)

    def _guarded(self, binding: Binding, action: Callable[[], Any]) -> Any:
        """Run one data step; its error names the binding, with no secret in it."""
        try:
            return action()
        except Exception as exc:  # noqa: BLE001 - storage SDK errors are many; each one is redacted
            if binding.datastore in self._urls and not isinstance(exc, CacheError):  # a URL input: the
                # input, its URL and how to stage it instead, in one line
                raise BackendError(str(unreachable(f"{binding.ref}.path", binding.uri, reason(exc),
                                                   binding.type))) from None
            if isinstance(exc, AmlEmuError):
                raise BackendError(f"{binding.ref} ({binding.uri}): {exc}") from None
            raise BackendError(f"{binding.ref} ({binding.uri}): {self.datastores.guard(binding.datastore)(exc)}") from None

    # --- before the job ----------------------------------------------------------------------
    def prepare_node(self, node: str, node_dir: Path, cache: NodeCache) -> None:
        lazy = {m.ref for m in self.lazy} if node in self.late else set()
        for b in self.bindings:
            if b.mode is DataMode.DIRECT or b.ref in lazy:
                continue
            target = host_path(node_dir, b.node_path)
            folder = target if b.type == "uri_folder" else target.parent
            if b.is_output:
                folder.mkdir(parents=True, exist_ok=True)
            elif b.mode is DataMode.RO_MOUNT:
                report = self._guarded(b, lambda b=b: cache.sync(self.source(b.datastore), b.path, self.policy))
                self._link(node_dir, b, target, cache)
                self.log(f"{b.ref}: ro_mount of {b.uri} on {node}: {report.line()}")
            else:
                self._guarded(b, lambda b=b, f=folder: self._download(b, f))
                self.log(f"{b.ref}: downloaded {b.uri} to {node}")

    def _link(self, node_dir: Path, b: Binding, target: Path, cache: NodeCache) -> None:
        """The run's mounts/<ds> and INPUT_<name> (or the file in it) point into the node's cache
        of <ds>, each in one hop (every open resolves it: a chain of links costs read speed); an
        MLflow model's folder is a copy, which MLflow loads (modelmount.py)."""
        cached = f"{CACHE_ROOT}/{b.datastore}"
        link = host_path(node_dir, mount_dir(self.run_id, b.datastore))
        if not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(cached, link)
        target.parent.mkdir(parents=True, exist_ok=True)
        model = cache.local_path(b.datastore, b.path)
        if b.type == "uri_folder" and is_mlflow_model(model):  # MLflow refuses a link (modelmount.py)
            size = self._guarded(b, lambda: copy_model(model, target))  # a full node disk: one line naming it
            self.log(f"{b.ref}: an MLflow model: copied from the node's cache ({size} bytes)")
        else:
            os.symlink(posixpath.join(cached, b.path) if b.path else cached, target)

    def _download(self, b: Binding, folder: Path) -> None:
        source = self.source(b.datastore)
        base = source.remote(b.path)
        files = [base] if source.fs.isfile(base) else \
            [p for p, info in source.fs.find(base, detail=True).items() if info.get("type") == "file"]
        if not files:
            raise BackendError(f"nothing at {b.path or '/'} in datastore {b.datastore}")

        def fetch(remote: str) -> None:
            local = folder / (posixpath.basename(remote) if remote == base else posixpath.relpath(remote, base))
            local.parent.mkdir(parents=True, exist_ok=True)
            source.fs.get_file(remote, str(local))

        folder.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(fetch, files))

    def prepare_nodes(self, requests: list[Any], backend: Any = None, run_dir: Path | None = None) -> None:
        """Inputs into every node's cache (or disk) or mounted, output folders made; nodes in parallel.
        A node that cannot take a mount made after it started (`backend.late_mounts`) gets prefetch."""
        if not self.bindings:
            return
        if self.lazy and requests:  # its thread defaults per core: the node's, as the plan has them
            self.lazy, self.settings = datamounts.plan_mounts(self.job, self.bindings, requests[0].cpus)
        for r in requests if self.lazy and backend is not None and run_dir is not None else []:
            why = backend.late_mounts(r)
            if why is None:
                self.late.add(r.name)
            else:
                self.log(f"notice: {r.name}: ro_mount inputs prefetched, not mounted: {why}")

        def one(r: Any) -> None:
            self.prepare_node(r.name, r.node_dir, NodeCache(r.cache_dir))
            if r.name in self.late:
                datamounts.mount_node(r, self.run_id, run_dir / "system_logs" / "data_capability",  # type: ignore[operator]
                                      self.lazy, self.settings, self.source, self._guard_mount, self.log,
                                      self.datastores.home_root)
        with ThreadPoolExecutor(len(requests)) as pool:
            list(pool.map(one, requests))

    def refresh_while(self, requests: list[Any], stop: threading.Event, backend: Any) -> None:
        """With a finite TTL, mounted inputs are revalidated while the job runs (a change shows
        within TTL + TTL/2); with the default (the job's lifetime) nothing is refreshed."""
        ttl = self.policy.ttl if self.mounted else None
        if ttl is None:
            return
        while not stop.wait(max(1.0, ttl / 2)):
            for request in requests:
                try:
                    if self.refresh(request.name, NodeCache(request.cache_dir)) and request.ships_files:
                        backend.ship_in(request, None)  # its cache is a volume there (backends/shipping.py)
                except AmlEmuError as exc:
                    self.log(f"warning: {exc}")

    def refresh(self, node: str, cache: NodeCache) -> bool:
        """While the job runs: entries past the TTL are revalidated, as a mount would on the next open;
        whether any changed."""
        changed = False
        for b in [b for b in self.mounted if node not in self.late or b.ref not in {m.ref for m in self.lazy}]:
            report = self._guarded(b, lambda b=b: cache.sync(self.source(b.datastore), b.path, self.policy))
            if report.downloaded or report.removed:
                self.log(f"{b.ref}: refreshed on {node} after the TTL: {report.line()}")
                changed = True
        return changed

    # --- after the job -----------------------------------------------------------------------
    def upload_outputs(self, node_dirs: dict[str, Path]) -> None:
        """Every node's output folder goes to the datastore (a file written by two nodes: the last
        node's copy wins, as with concurrent writers on a blob mount)."""
        for b in self.bindings:
            if not b.is_output or b.mode is DataMode.DIRECT:
                continue
            for node, node_dir in node_dirs.items():
                target = host_path(node_dir, b.node_path)
                folder = target if b.type == "uri_folder" else target.parent
                if not folder.is_dir() or not any(p.is_file() for p in folder.rglob("*")):
                    continue
                local, uri = (folder, b.uri) if b.type == "uri_folder" else \
                    (target, b.uri.rsplit("/", 1)[0] + "/")
                size = self._guarded(b, lambda local=local, uri=uri: self.datastores.upload(local, uri, overwrite=True))
                self.log(f"{b.ref}: {b.mode.value} wrote {size} bytes from {node} to {b.uri}")

