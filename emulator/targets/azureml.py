"""The `azureml` target: the same job, sent to real AmlCompute through the Azure ML SDKs.

v2 jobs (CLI YAML, `command()`, `load_job()`, the Python API's JobSpec) go through azure-ai-ml's
`MLClient.jobs.create_or_update`; v1 ScriptRunConfigs / estimators through azureml-core's
`Experiment.submit`. The workspace comes from $AZUREML_ARM_SUBSCRIPTION /
$AZUREML_ARM_RESOURCEGROUP / $AZUREML_ARM_WORKSPACE_NAME, else [tool.amlemu.azureml] in
pyproject.toml, else the config.json that MLClient.from_config / Workspace.from_config read;
the credential is DefaultAzureCredential. A dry run needs neither network nor credential.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from itertools import islice
from pathlib import Path
from typing import Any, TypeVar

from amlemu import safeyaml
from amlemu.actions import Action
from amlemu.errors import ConfigError, NotFoundError, TargetError
from amlemu.jobs import sdk1, sdk2
from amlemu.jobs.jobyaml import load_job
from amlemu.specs import ClusterSpec, JobSpec
from amlemu.storage.datastores import DatastoreSpec, redact
from amlemu.targets import project_config
from amlemu.targets.base import JobSource, Plan, Target, WorkspaceOptions
from amlemu.validate import Finding, check_job

ENV_KEYS = ("AZUREML_ARM_SUBSCRIPTION", "AZUREML_ARM_RESOURCEGROUP", "AZUREML_ARM_WORKSPACE_NAME")
WORKSPACE_FIX = ("write config.json (Azure portal: the workspace's 'Download config.json'), or set "
                 f"{', '.join('$' + k for k in ENV_KEYS)}, or subscription_id, resource_group and "
                 "workspace_name under [tool.amlemu.azureml] in pyproject.toml, or pass --subscription, -g "
                 "and -w")
CREDENTIAL_FIX = ("DefaultAzureCredential found no usable credential: run `az login`, or set AZURE_TENANT_ID, "
                  "AZURE_CLIENT_ID and AZURE_CLIENT_SECRET (a service principal), or use a managed identity")
T = TypeVar("T")


@dataclass(frozen=True)
class WorkspaceRef:
    subscription_id: str
    resource_group: str
    workspace_name: str
    source: str = ""

    @property
    def arm_path(self) -> str:
        return (f"/subscriptions/{self.subscription_id}/resourceGroups/{self.resource_group}/providers/"
                f"Microsoft.MachineLearningServices/workspaces/{self.workspace_name}")


def _config_json(start: Path) -> Path | None:
    for folder in (start.resolve(), *start.resolve().parents):
        for path in (folder / "config.json", folder / ".azureml" / "config.json"):
            if path.is_file():
                return path
    return None


def resolve_workspace(environ: Mapping[str, str], start: Path, options: WorkspaceOptions | None = None) -> WorkspaceRef:
    """The real workspace jobs go to: the command line's --subscription, -g and -w, each over the
    usual places, in order (all three given: those alone)."""
    given = (options or WorkspaceOptions()).given()
    if len(given) == len(ENV_KEYS):
        return WorkspaceRef(**given, source="command line")
    found = _resolve_workspace(environ, start)
    return replace(found, **given, source=f"{found.source} and the command line") if given else found


def _resolve_workspace(environ: Mapping[str, str], start: Path) -> WorkspaceRef:
    if all(environ.get(k) for k in ENV_KEYS):
        return WorkspaceRef(*(environ[k] for k in ENV_KEYS), source="environment")
    config, pyproject = project_config(start)
    section = config.get("azureml", {})
    keys = ("subscription_id", "resource_group", "workspace_name")
    if section:
        missing = [k for k in keys if not section.get(k)]
        if missing:
            raise ConfigError(f"{pyproject}: tool.amlemu.azureml.{missing[0]}", "missing", WORKSPACE_FIX)
        return WorkspaceRef(*(str(section[k]) for k in keys), source=str(pyproject))
    path = _config_json(start)
    if path is None:
        raise TargetError(f"azureml target: no workspace: {WORKSPACE_FIX}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(str(path), f"not valid JSON: {exc}") from None
    missing = [k for k in keys if not data.get(k)]
    if missing:
        raise ConfigError(f"{path}: {missing[0]}", "missing", WORKSPACE_FIX)
    return WorkspaceRef(*(str(data[k]) for k in keys), source=str(path))


class AzureMLTarget(Target):
    name = "azureml"

    def __init__(self, workspace: WorkspaceRef | None = None, credential: Any = None, start: Path | None = None,
                 environ: Mapping[str, str] | None = None, options: WorkspaceOptions | None = None) -> None:
        self._workspace, self._credential, self._options = workspace, credential, options
        self._start, self._environ = start or Path.cwd(), os.environ if environ is None else environ
        self._client: Any = None

    @classmethod
    def for_cli(cls, emulator: Callable[[], Any], workspace: WorkspaceOptions | None = None) -> Target:
        return cls(options=workspace)

    @property
    def workspace(self) -> WorkspaceRef:
        if self._workspace is None:
            self._workspace = resolve_workspace(self._environ, self._start, self._options)
        return self._workspace

    def client(self) -> Any:
        if self._client is None:
            sdk2.require()
            from azure.ai.ml import MLClient  # noqa: PLC0415
            from azure.identity import DefaultAzureCredential  # noqa: PLC0415

            ws = self.workspace
            self._client = MLClient(self._credential or DefaultAzureCredential(), ws.subscription_id,
                                    ws.resource_group, ws.workspace_name)
        return self._client

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one SDK call; its errors become one line (with any secret redacted)."""
        from azure.core.exceptions import (  # noqa: PLC0415
            ClientAuthenticationError,
            HttpResponseError,
            ResourceNotFoundError,
            ServiceRequestError,
        )

        try:
            return fn()
        except ClientAuthenticationError:
            raise TargetError(f"azureml target: {what}: {CREDENTIAL_FIX}") from None
        except ResourceNotFoundError as exc:
            raise NotFoundError(what, self.workspace.workspace_name, message=(
                f"azureml target: {what}: not found in workspace {self.workspace.workspace_name}: "
                f"{_first_line(exc)}")) from None
        except ServiceRequestError as exc:
            raise TargetError(f"azureml target: {what}: cannot reach Azure ML: {_first_line(exc)}") from None
        except HttpResponseError as exc:
            raise TargetError(f"azureml target: {what}: the service answered {exc.status_code}: "
                              f"{_first_line(exc)}") from None

    # --- jobs ----------------------------------------------------------------------------------
    def v2_job(self, job: JobSource, overrides: list[str] | None = None) -> Any:
        """The azure-ai-ml job entity that would be sent."""
        sdk2.require()
        if isinstance(job, (str, Path)):
            from azure.ai.ml import load_job as sdk_load_job  # noqa: PLC0415
            from azure.ai.ml.exceptions import ValidationException  # noqa: PLC0415
            from marshmallow import ValidationError  # noqa: PLC0415

            try:
                return sdk_load_job(job, params_override=[_override(o) for o in overrides or []])
            except (ValidationException, ValidationError) as exc:  # what the emulator's loader let through
                raise ConfigError(*_schema_error(exc), "see https://aka.ms/ml-cli-v2-job-command-yaml-reference") from None
        if isinstance(job, JobSpec):
            return sdk2.command_from_spec(job)
        if sdk2.is_v2(job):
            return job
        raise ConfigError("job", f"a {type(job).__name__} cannot go to the azureml target",
                          "give a job YAML path, a JobSpec, an azure.ai.ml command job or a v1 ScriptRunConfig")

    def plan_job(self, job: JobSource, overrides: list[str] | None = None) -> Plan:
        """The request that would be sent. A job Azure ML would refuse (section 4's rules: the
        emulator's own reading of the job) is refused here, before anything is sent."""
        if sdk1.is_job_config(job):
            return self._plan_v1(job)
        if isinstance(job, (str, Path)):  # the emulator's loader first: its errors name the field and the fix
            spec = load_job(job, overrides)
            findings = _refuse_errors(check_job(spec))
            entity = self.v2_job(job, overrides)
        else:
            entity = self.v2_job(job, overrides)
            spec = sdk2.job_from_v2(entity)  # the emulator's own reading: the same rules as a local run
            findings = _refuse_errors(check_job(spec))
        name, env = entity.name or "<name chosen by the service>", sdk2.anonymous_environment(entity)
        return Plan(self.name, "job", {
            "target": self.name, "sdk": "azure-ai-ml", "workspace": asdict(self.workspace),
            "code_upload": None if spec.code is None else str(spec.code), "findings": findings, **({"environment_request": {
                "method": "PUT", "path": f"{self.workspace.arm_path}/environments/{env.name}/versions/{env.version}",
                "body": env._to_rest_object().as_dict()}} if env is not None else {}),
            "request": {"method": "PUT", "path": f"{self.workspace.arm_path}/jobs/{name}",
                        "body": sdk2.rest_body(entity)}}, payload=entity)

    def _plan_v1(self, src: Any) -> Plan:
        spec = sdk1.job_from_v1(src)
        return Plan(self.name, "job", {
            "target": self.name, "sdk": "azureml-core", "workspace": asdict(self.workspace),
            "call": f"Experiment(ws, '{spec.experiment_name}').submit(config)", "code_upload": str(spec.code),
            "findings": _refuse_errors(check_job(spec)), "run_config": sdk1.run_config_dict(src)},
            payload=(src, spec.experiment_name))

    def run_job(self, plan: Plan) -> str:
        if plan.data["sdk"] == "azureml-core":
            return self._submit_v1(*plan.payload)
        created = self._call("submitting the job", lambda: self.client().jobs.create_or_update(plan.payload))
        return str(created.name)

    def _submit_v1(self, src: Any, experiment: str) -> str:
        from azureml.core import Experiment, Workspace  # noqa: PLC0415

        ws = self.workspace
        try:
            workspace = Workspace.get(ws.workspace_name, subscription_id=ws.subscription_id,
                                      resource_group=ws.resource_group)
            return str(Experiment(workspace, experiment).submit(src).id)
        except Exception as exc:  # azureml-core raises its own zoo of exception types
            raise TargetError(f"azureml target: submitting the v1 run: {_first_line(exc)}") from None

    def status(self, name: str) -> str:
        return str(self.show(name)["status"])

    def show(self, name: str) -> dict[str, Any]:
        return self._az_job(self._call(f"job {name}", lambda: self.client().jobs.get(name)))

    def _az_job(self, job: Any) -> dict[str, Any]:
        """What `az ml job show` prints of it: the CommandJob's dict (az ml makes a job of the
        command node jobs.get answers), with the resourceGroup az adds."""
        entity = job._to_job() if hasattr(job, "_to_job") else job  # noqa: SLF001 - az ml's own call
        shown = json.loads(json.dumps(entity._to_dict(), default=str))  # noqa: SLF001
        shown["status"] = str(getattr(job.status, "value", job.status))  # some versions dump the enum's name
        return {**shown, "resourceGroup": self.workspace.resource_group}

    def stream(self, name: str) -> str:
        def stream() -> None:
            try:
                self.client().jobs.stream(name)
            except Exception as exc:
                # A failed job raises after its log was streamed; its status says the rest.
                if type(exc).__name__ != "JobException":
                    raise
        self._call(f"streaming job {name}", stream)
        return self.status(name)

    def list_jobs(self, experiment: str | None = None, max_results: int | None = None,
                  parent: str | None = None) -> list[dict[str, Any]]:
        """The service lists the newest first (az ml job list takes its first max_results)."""
        def jobs() -> list[Any]:
            listed = self.client().jobs.list(**({"parent_job_name": parent} if parent else {}))
            wanted = (j for j in listed if experiment is None or j.experiment_name == experiment)
            return list(wanted if max_results is None else islice(wanted, max_results))
        return [self._az_job(j) for j in self._call("listing jobs", jobs)][::-1]  # oldest first, as every target

    def metrics(self, name: str) -> dict[str, float]:
        return {}  # Azure ML keeps them in the workspace's MLflow tracking server: see the studio

    def plan_cancel(self, name: str) -> list[Action]:
        return [Action("request", "job cancel", name, {"method": "POST", "path": f"{self.workspace.arm_path}/jobs/{name}/cancel"},
                       run=lambda: self._call(f"canceling job {name}",
                                              lambda: self.client().jobs.begin_cancel(name).result()))]

    def plan_download(self, name: str, dest: Path, output_name: str | None = None,
                      everything: bool = False) -> list[Action]:
        target = Path(dest) / name
        call = f"MLClient.jobs.download(output_name={output_name!r}, all={everything})"
        return [Action("download", "job outputs and logs", name, {"to": str(target), "call": call},
                       run=lambda: self._call(f"downloading job {name}", lambda: self.client().jobs.download(
                           name, download_path=str(target), output_name=output_name, all=everything)))]

    # --- computes --------------------------------------------------------------------------------
    def plan_compute(self, spec: ClusterSpec) -> Plan:
        if spec.machines or spec.placement != "spread":  # the emulator's alone
            raise ConfigError("--machines", "Azure ML places a compute's nodes itself", "leave --machines out")
        entity = sdk2.amlcompute(spec)
        return Plan(self.name, "compute", {
            "target": self.name, "sdk": "azure-ai-ml", "workspace": asdict(self.workspace),
            "request": {"method": "PUT", "path": f"{self.workspace.arm_path}/computes/{spec.name}",
                        "body": entity._to_rest_object().as_dict()}}, payload=entity)

    def run_compute(self, plan: Plan) -> None:
        self._call(f"creating compute {plan.payload.name}",
                   lambda: self.client().compute.begin_create_or_update(plan.payload).result())

    def show_compute(self, name: str) -> dict[str, Any]:
        return compute_data(self._call(f"compute {name}", lambda: self.client().compute.get(name)))

    def list_computes(self) -> list[dict[str, Any]]:
        return [compute_data(c) for c in self._call("listing computes", lambda: list(self.client().compute.list()))]

    def plan_delete_compute(self, name: str) -> list[Action]:
        return [Action("request", "compute delete", name, {"method": "DELETE",
                                                           "path": f"{self.workspace.arm_path}/computes/{name}"},
                       run=lambda: self._call(f"deleting compute {name}",
                                              lambda: self.client().compute.begin_delete(name).result()))]

    # --- datastores ------------------------------------------------------------------------------
    def datastore(self, name: str) -> tuple[DatastoreSpec, str | None]:
        """The workspace's blob datastore `name` as the emulator's DatastoreSpec, with its secret
        (account key or SAS) when the datastore holds one; identity-based ones get none."""
        ds = self._call(f"datastore {name}", lambda: self.client().datastores.get(name, include_secrets=True))
        return datastore_spec(ds)


def compute_data(compute: Any) -> dict[str, Any]:
    """An azure.ai.ml compute entity, in the emulator's names (show_compute); node states are
    not in the entity."""
    tier = str(getattr(compute, "tier", None) or "dedicated").lower().replace("_", "")
    return {"name": compute.name, "vm_size": getattr(compute, "size", None), "vm_priority": tier,
            "min_nodes": getattr(compute, "min_instances", None), "max_nodes": getattr(compute, "max_instances", None),
            "idle_seconds_before_scaledown": getattr(compute, "idle_time_before_scale_down", None),
            "backend": "azureml", "state": getattr(compute, "provisioning_state", None),
            "busy": None, "idle": None, "nodes": []}


def datastore_spec(ds: Any) -> tuple[DatastoreSpec, str | None]:
    """An azure.ai.ml AzureBlobDatastore -> (DatastoreSpec, secret)."""
    if type(ds).__name__ != "AzureBlobDatastore":
        raise ConfigError("datastore", f"{ds.name} is a {type(ds).__name__}; only blob datastores are synced",
                          "sync to an Azure Blob datastore")
    creds = ds.credentials
    key, sas = getattr(creds, "account_key", None), getattr(creds, "sas_token", None)
    credential, secret = ("account_key", key) if key else ("sas", sas) if sas else ("identity", None)
    suffix = ds.endpoint or "core.windows.net"
    endpoint = "" if suffix == "core.windows.net" and ds.protocol == "https" else \
        f"{ds.protocol}://{ds.account_name}.blob.{suffix}"
    return DatastoreSpec(ds.name, "azure_blob", container=ds.container_name, account=ds.account_name,
                         credential=credential, endpoint=endpoint), secret


def _refuse_errors(findings: list[Finding]) -> list[dict[str, str]]:
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        raise ConfigError(errors[0].field, f"{errors[0].problem} (Azure ML would refuse this job)", errors[0].fix)
    return [asdict(f) for f in findings]


def _override(item: str) -> dict[str, Any]:
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ConfigError("--set", f"'{item}' is not key=value", "write e.g. --set inputs.epochs=3")
    return {key: safeyaml.loads(raw, f"--set {key}") if raw else ""}


def _schema_error(exc: Exception) -> tuple[str, str]:
    """(field, problem) out of azure-ai-ml's multi-page schema error."""
    text = str(exc).replace("\\n", "\n").replace('\\"', '"')
    match = re.search(r'"([\w.]+)": \[\s*"([^"]+)"', text)
    return (match.group(1), f"{match.group(2)} (azure-ai-ml)") if match else ("job", _first_line(exc))


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "message", None) or exc).strip().splitlines()
    return redact(text[0] if text else type(exc).__name__, [])
