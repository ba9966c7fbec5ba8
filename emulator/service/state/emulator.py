"""The service's workspace backed by the real emulator (amlemu.api.Emulator on the service's home):
computes are emulator clusters, a job PUT is the emulator's own validation and submit, statuses
and logs are the store's and the run folder's.

Each request thread gets its own Emulator (its own SQLite connection: the store's transactions
must not interleave across threads). Long-running operations (compute create, delete) run on a
small pool and are "InProgress" until the emulator has finished.
"""
from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from amlemu import safeyaml, servicefile, skus, statefile, validate
from amlemu.api import Emulator
from amlemu.envs import curated
from amlemu.errors import AmlEmuError, ConfigError, NotFoundError, name_taken
from amlemu.jobs import resource
from amlemu.jobs.jobyaml import job_from_dict
from amlemu.runs import runhistory
from amlemu.runs.runlogs import log_files
from amlemu.runs import runfiles
from amlemu.service.state import (
    ACCOUNT,
    DiskBlobs,
    Registry,
    RunView,
    ServiceError,
    Workspace,
    bad_request,
    not_found,
)
from amlemu.service.state import jobrest, pipelinestate, runblobs, sweepstate
from amlemu.service.state.computerest import NODE_STATES, cluster_from_rest, compute_props
from amlemu.service.state.v1 import EmulatorV1
from amlemu.specs import ClusterSpec, JobSpec

class EmulatorState:
    """State (emulator/service/state.py) over an emulator home."""

    def __init__(self, emulator: Emulator, log: Callable[[str], None] = lambda line: None) -> None:
        self.home = emulator.home
        self.backend = emulator.default_backend
        self.log = log
        folder = servicefile.service_dir(self.home.root)
        folder.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._local.emu = emulator
        self.registry = Registry(self.workspace, folder / "registry.json", log)
        self.blobs = DiskBlobs(folder / "blobs")
        self.jobs_dir = folder / "jobs"  # each job's REST body as it was PUT
        self.jobs_dir.mkdir(exist_ok=True)
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="amlemu-operation")
        self._ops: dict[str, Future[Any]] = {}
        self._creating: dict[str, Future[Any]] = {}
        self._lock = threading.Lock()
        self.v1 = EmulatorV1(self, folder)
        self.sweeps, self.pipelines = sweepstate.SweepState(self), pipelinestate.PipelineState(self)  # and components

    @property
    def workspace(self) -> Workspace:
        """Read each time: `amlemu workspace set` renames it while the service runs."""
        ws = self.emu.workspace()
        current = Workspace(ws["subscription_id"], ws["resource_group"], ws["workspace_name"], ws["location"])
        if getattr(self, "registry", None) is not None:
            self.registry.workspace = current
        return current

    @property
    def emu(self) -> Emulator:
        emu = getattr(self._local, "emu", None)
        if emu is None:
            emu = self._local.emu = Emulator(self.home.root, backend=self.backend)
        return emu

    @property
    def assets(self) -> Any:
        return self.emu.assets

    # --- long-running operations -------------------------------------------------------------
    def _start(self, fn: Callable[[], Any], compute: str | None = None) -> str:
        op_id = uuid.uuid4().hex
        future = self._pool.submit(fn)
        with self._lock:
            self._ops[op_id] = future
            if compute:
                self._creating[compute] = future
        return op_id

    def _done(self) -> str:
        future: Future[Any] = Future()
        future.set_result(None)
        op_id = uuid.uuid4().hex
        self._ops[op_id] = future
        return op_id

    def operation(self, op_id: str) -> tuple[str, str | None]:
        future = self._ops.get(op_id)
        if future is None:
            raise not_found(f"operation {op_id}")
        if not future.done():
            return "InProgress", None
        exc = future.exception()
        if exc is not None:
            self.log(f"operation {op_id} failed: {type(exc).__name__}: {exc}")
            return "Failed", str(exc) if isinstance(exc, AmlEmuError) else f"{type(exc).__name__}: {exc}"
        return "Succeeded", None

    # --- jobs --------------------------------------------------------------------------------
    def _code_dir(self, name: str, version: str) -> Path:
        try:
            uri = str(self.registry.get("codes", name, version)["properties"].get("codeUri", ""))
        except ServiceError:
            raise bad_request("code", f"code: version {version} of code {name} was not registered; "
                              "upload it first (the SDK does, in create_or_update)") from None
        marker = f"/{ACCOUNT}/"
        if marker not in uri:
            raise bad_request("code", f"code: {uri} is not a snapshot uploaded to this service")
        container, _, prefix = uri.split(marker, 1)[1].partition("/")
        return self.blobs.path(container, prefix)

    def _environment(self, env_id: str) -> str | dict[str, Any]:
        """What the job's YAML names: a curated `azureml:` name, an image, or a registered version's
        definition (its image and conda file: the nodes get those packages, as on Azure ML)."""
        if env_id.startswith("azureml://registries/"):
            return env_id  # a registry's environment: resolved, or refused naming the known ones, as the CLI does
        ref = jobrest.environment_ref(env_id)
        if ref is None:
            return env_id  # an image reference
        name, version = ref
        if self.registry.is_curated(name):
            return f"azureml:{name}"  # the nodes' own image stands in for a curated one
        versions = self.registry.versions("environments", name)
        if version is not None:
            versions = [v for v in versions if v["name"] == version]
        if not versions and curated.lookup(name) is not None:
            return f"azureml:{name}"  # a curated name without its AzureML- prefix
        if not versions:
            raise bad_request("environment", f"environment {env_id} was not found in workspace "
                              f"{self.workspace.workspace_name}")
        props = versions[0]["properties"]
        image, conda = props.get("image"), props.get("condaFile")
        if image and conda:
            return {"image": str(image), "conda_file": safeyaml.loads(str(conda), "environment condaFile")}
        return str(image) if image else f"azureml:{name}:{versions[0]['name']}"

    def _body_path(self, name: str) -> Path:
        if "/" in name or name.startswith("."):
            raise bad_request("name", f"name: '{name}' is not a job name")
        return self.jobs_dir / f"{name}.json"

    def put_job(self, name: str, body: Any) -> dict[str, Any]:
        jobrest.job_type(body)
        if self.emu.store.run_exists(name):
            saved = self._body_path(name)
            if saved.exists() and json.loads(saved.read_text()).get("properties", {}).get("command") == \
                    body["properties"].get("command"):
                return self.get_job(name)  # a re-PUT of the same job (the SDK retries): it stands
            raise bad_request("name", str(name_taken(name)))
        try:
            data = jobrest.to_yaml(name, body, self._code_dir, self._environment)
            spec = job_from_dict(data, base_dir=Path(data.get("code") or os.devnull))  # no code: no folder
        except ConfigError as exc:
            raise jobrest.config_error(exc) from None
        self.submit_spec(spec, body)
        return self.get_job(name)

    def submit_spec(self, spec: JobSpec, body: dict[str, Any]) -> None:
        """The emulator's checks and submit, for a v2 PUT and a v1 startrun alike; `body` is kept
        as the job's REST body."""
        name = str(spec.name)
        # The job alone here; the workspace's rules are submit's (amlemu/workspacerules.py), checked once.
        errors = [f for f in validate.check_job(spec) if f.severity == "error"]
        if errors:
            raise bad_request(errors[0].field, f"{errors[0].field}: {errors[0].problem}; {errors[0].fix}")
        statefile.write_json(self._body_path(name), body)
        try:
            self.emu.submit(spec)
        except ConfigError as exc:
            self._body_path(name).unlink(missing_ok=True)
            raise jobrest.config_error(exc) from None
        except AmlEmuError as exc:
            self._body_path(name).unlink(missing_ok=True)
            raise bad_request("job", str(exc)) from None
        self.log(f"job {name} submitted to compute {spec.compute}")

    def _props(self, name: str) -> dict[str, Any]:
        try:
            record = self.emu.store.run(name)
        except NotFoundError:
            raise not_found(f"job {name}") from None
        self._body_path(name)  # a name that is no path
        # The one serializer (jobs/resource.py): the body the SDK PUT, else the run record's job.
        return resource.job_properties(name, record.job, home_root=self.home.root, workspace_id=self.workspace.id,
                                       compute=skus.rest_compute(record.cluster), experiment=record.experiment,
                                       status=record.status.value, output_uris=runblobs.run_outputs(self.emu, name))

    def job_created(self, name: str) -> float:
        """When the job was submitted: its resource's systemData.createdAt."""
        try:
            return self.emu.store.run(name).created_at
        except NotFoundError:
            raise not_found(f"job {name}") from None

    def get_job(self, name: str) -> dict[str, Any]:
        return self._props(name)

    def list_jobs(self) -> list[tuple[str, dict[str, Any]]]:
        return [(r.id, self._props(r.id)) for r in self.emu.store.runs() if r.parent is None]  # not trials

    def cancel_job(self, name: str) -> str:
        self._props(name)
        self.emu.cancel(name)
        return self._done()

    def run_details(self, name: str) -> RunView:
        self._props(name)
        self.emu.reconcile()
        record = self.emu.store.run(name)
        events = self.emu.store.events(name)
        files = log_files(self.home.run_dir(name)) + list(self.pipelines.log_aliases(record.job))  # its driver's
        started = next((ts for ts, status, _ in events if status.value == "Running"), None)
        error = record.error
        if record.status.value == "Failed" and record.exit_code is not None and "exit" not in (error or ""):
            error = f"{error or 'the job failed'} (exit code {record.exit_code})"
        failed = record.status.value == "Failed"
        return RunView(record.status.value, skus.shown_compute(record.cluster), files, error if failed else None,
                       started, events[-1][0] if record.status.is_terminal and events else None)

    def run_active(self, name: str) -> bool:
        """A run's own token (AZUREML_RUN_TOKEN) is good while the run has not ended."""
        try:
            return not self.emu.store.run(name).status.is_terminal
        except NotFoundError:
            return False

    def read_log(self, name: str, path: str) -> bytes:
        """A file of the run's record (a signed log URL's): never through a link, never a private
        one (the launch plans, an owner-only file: runfiles.open_in_run)."""
        run_dir = self.home.run_dir(name)
        found = runfiles.open_in_run(run_dir, self.pipelines.log_path(name, path), runblobs.RUN_FOLDERS) or \
            runfiles.open_in_run(run_dir, f"{runhistory.ARTIFACTS}/{path}", runblobs.RUN_FOLDERS)  # an upload's name
        if found is None:
            raise not_found(f"log {path} of job {name}")
        with found:
            return found.read()

    # --- computes ----------------------------------------------------------------------------
    def _compute_props(self, name: str) -> dict[str, Any]:
        try:
            cluster = self.emu.compute(name)
        except NotFoundError:
            raise not_found(f"compute {name}") from None
        creating = self._creating.get(name)
        return compute_props(cluster.spec, cluster.backend, self.emu.store.nodes(name), self.workspace.location,
                             creating=creating is not None and not creating.done())

    def put_compute(self, name: str, body: Any) -> tuple[dict[str, Any], str]:
        spec = cluster_from_rest(name, body)
        try:
            existing = self.emu.compute(name).spec
        except NotFoundError:
            existing = None
        if existing is not None:
            op = self._update(existing, spec)
            return self._compute_props(name), op
        self.emu.plan_compute(spec)  # refused here, before the reply, as the CLI refuses it
        op = self._start(lambda: self.emu.create_compute(spec), compute=name)
        return {**self._compute_props_or_creating(name, spec)}, op

    def _compute_props_or_creating(self, name: str, spec: ClusterSpec) -> dict[str, Any]:
        try:
            return self._compute_props(name)
        except ServiceError:  # not recorded yet: the operation has only just started
            return {"computeType": "AmlCompute", "provisioningState": "Creating",
                    "properties": {"vmSize": spec.vm_size, "scaleSettings": {
                        "minNodeCount": spec.min_nodes, "maxNodeCount": spec.max_nodes}}}

    def get_compute(self, name: str) -> dict[str, Any]:
        return self._compute_props(name)

    def list_computes(self) -> list[tuple[str, dict[str, Any]]]:
        # Serverless and local pools are no computes of the workspace, as on Azure ML (their jobs show them).
        return [(c.spec.name, self._compute_props(c.spec.name)) for c in self.emu.computes()
                if not skus.is_pool(c.spec.name)]

    def delete_compute(self, name: str) -> str:
        self._compute_props(name)
        try:
            self.emu.plan_delete_compute(name)  # active jobs: refused now, not in the operation
        except AmlEmuError as exc:
            raise bad_request("name", str(exc)) from None
        return self._start(lambda: self.emu.delete_compute(name))

    def _update(self, existing: ClusterSpec, spec: ClusterSpec) -> str:
        """A PUT of an existing compute (compute.begin_update): its scale settings may change,
        as AmlCompute allows; its size and priority may not. A raised minimum is reached as jobs
        make nodes (nodes are made for jobs only); idle nodes above a lowered maximum go as they
        idle out."""
        for field in ("vm_size", "vm_priority"):
            if getattr(existing, field) != getattr(spec, field):
                raise bad_request(field, f"{field}: compute {spec.name} is {getattr(existing, field)}; a compute's "
                                  "size and priority cannot change: delete it and create it again")
        if existing != spec:
            self.emu.store.update_cluster(spec)
            self.log(f"compute {spec.name}: scale settings now {spec.min_nodes}-{spec.max_nodes} nodes")
        return self._done()

    def list_nodes(self, name: str) -> list[dict[str, Any]]:
        self._compute_props(name)
        return [{"nodeId": n.name, "privateIpAddress": n.address, "publicIpAddress": None, "port": 50000,
                 "nodeState": NODE_STATES.get(n.state, n.state), "runId": n.run_id}
                for n in self.emu.store.nodes(name)]

    # --- datastores and what jobs.download reads ----------------------------------------------
    def list_datastores(self) -> list[tuple[str, dict[str, Any]]]:
        """The emulator's datastores, each a container of its own name on the service's blob
        endpoint (accountName None: the routes name the service), and the artifact store."""
        kinds = [(spec.name, spec.kind) for spec in self.emu.datastores.list()]
        return [(name, {
            "datastoreType": "AzureBlob", "accountName": None,
            "containerName": runblobs.ARTIFACT_CONTAINER if kind == "artifacts" else name,
            "endpoint": "core.windows.net", "protocol": "https", "credentials": {"credentialsType": "None"},
            "isDefault": name == "workspaceblobstore", "serviceDataAccessAuthIdentity": "None",
            "description": f"amlemu {kind} datastore", "tags": {"amlemu.kind": kind}, "properties": {}})
            for name, kind in [*kinds, (runblobs.ARTIFACT_STORE, "artifacts")]]

    def run_outputs(self, name: str) -> dict[str, str]:
        self._props(name)
        return {**runblobs.run_outputs(self.emu, name), **self.pipelines.output_uris(name)}  # a pipeline's: steps'

    def list_blobs(self, container: str, prefix: str) -> list[tuple[str, int]]:
        return runblobs.list_blobs(self.emu, container, prefix)

    def read_blob(self, container: str, blob: str) -> bytes:
        return runblobs.read_blob(self.emu, container, blob)

    def write_blob(self, container: str, blob: str, data: bytes) -> None:
        runblobs.write_blob(self.emu, container, blob, data)

    def datastore_secrets(self, name: str) -> dict[str, Any]:
        if name not in {n for n, _ in self.list_datastores()}:
            raise not_found(f"datastore {name}")
        return {"secretsType": "None"}  # the service never hands a datastore's secret out
