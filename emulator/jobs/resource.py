"""A job as Azure ML's Job resource: the REST entity `amlemu serve` returns to azure-ai-ml, and the
dict `az ml job show` prints of that same entity. One serializer for both, so the command line and
the SDK never disagree.

- `command_properties`: a job submitted with the CLI or the Python API (its run record) -> the REST
  CommandJob properties, as Azure ML keeps a job it was sent (a job PUT through the service keeps
  its own body instead: the SDK's codeId and environmentId, as it sent them).
- `rest_resource`: the JobBase envelope (id, name, type, properties, systemData) with the services
  Azure ML adds: Studio (the studio page's job URL) and Tracking (the MLflow tracking server).
- `az_job`: that resource as az ml prints it: what azure-ai-ml's `jobs.get(name)._to_job()._to_dict()`
  makes of it (CommandJob's YAML schema, ARM ids resolved to `azureml:` names), plus the
  `resourceGroup` the az CLI adds to every resource with an id; keys sorted, as az prints them.

The caller gathers the facts (record, workspace, URLs); the files read here, by `job_properties`,
are the body a job was PUT with through the service (<home>/service/jobs/<name>.json) and the
state of the run's services (<run>/services.json, written by its supervisor: runs/servicerun.py).
"""
from __future__ import annotations

import getpass
import hashlib
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from amlemu import servicefile
from amlemu.home import Home
from amlemu.specs import RunStatus

ARM_TYPE = "Microsoft.MachineLearningServices/workspaces/jobs"
# The `amlemu ui` page's default address: the studio a job's page is on when no service runs.
UI_URL = "http://127.0.0.1:5000"
MLFLOW_MOUNT = "/mlflow"  # where the service serves MLflow's tracking server (runs/homestore.py MOUNT)
ANONYMOUS_ENV = "CliV2AnonymousEnvironment"  # az ml registers an inline environment under this name
REST_MODES = {"ro_mount": "ReadOnlyMount", "rw_mount": "ReadWriteMount", "download": "Download",
              "upload": "Upload", "direct": "Direct", "eval_mount": "EvalMount", "eval_download": "EvalDownload"}
YAML_MODES = {v.lower(): k for k, v in REST_MODES.items()}
SERVICES_RECORD = "services.json"  # a run's services as its supervisor records them (runs/servicerun.py)
REST_SERVICE_TYPES = {"jupyter_lab": "JupyterLab", "tensor_board": "TensorBoard", "ssh": "SSH", "vs_code": "VSCode",
                      "custom": "Custom"}
YAML_SERVICE_TYPES = {v: k for k, v in REST_SERVICE_TYPES.items()}
REST_DISTRIBUTION = {"mpi": "Mpi", "pytorch": "PyTorch", "tensorflow": "TensorFlow"}
CREATION_CONTEXT = {"created_at": "createdAt", "created_by": "createdBy", "created_by_type": "createdByType",
                    "last_modified_at": "lastModifiedAt", "last_modified_by": "lastModifiedBy",
                    "last_modified_by_type": "lastModifiedByType"}
_ARM_ASSET = re.compile(r"^/subscriptions/.+/(?P<kind>[^/]+)/(?P<name>[^/]+)/versions/(?P<version>[^/]+)$")


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


# --- the run record -> REST properties ------------------------------------------------------------
def _rest_data(data: Any, output: bool, uri: str | None = None) -> dict[str, Any]:
    if not isinstance(data, dict):  # a literal input: Azure ML keeps its text
        return {"jobInputType": "literal", "value": str(data)}
    mode = str(data.get("mode") or ("rw_mount" if output else "ro_mount"))
    rest: dict[str, Any] = {"jobOutputType" if output else "jobInputType": data.get("type", "uri_folder"),
                            "mode": REST_MODES.get(mode, mode)}
    if data.get("path") or uri:  # an output's folder without its trailing '/', as Azure ML gives it
        rest["uri"] = data.get("path") or str(uri).rstrip("/")
    return rest


def _environment_id(job: dict[str, Any], workspace_id: str) -> str | None:
    """A reference as written (`azureml:...`, a registry's `azureml://...`); an inline one (an
    image, a conda file, a build context) as az ml registers it: an anonymous version by content."""
    env = job.get("environment")
    if isinstance(env, str) and env.startswith("azureml"):
        return env
    definition = job.get("environment_def") or ({"image": env} if env else None)
    if not definition:
        return None
    digest = hashlib.md5(json.dumps(definition, sort_keys=True, default=str).encode(), usedforsecurity=False)
    return f"{workspace_id}/environments/{ANONYMOUS_ENV}/versions/{digest.hexdigest()}"


def _distribution(dist: dict[str, Any]) -> dict[str, Any] | None:
    kind = str(dist.get("type") or "none")
    if kind not in REST_DISTRIBUTION:
        return None
    rest: dict[str, Any] = {"distributionType": REST_DISTRIBUTION[kind]}
    if kind == "tensorflow":
        rest.update(workerCount=dist.get("worker_count"), parameterServerCount=dist.get("parameter_server_count", 0))
    else:
        rest["processCountPerInstance"] = dist.get("process_count_per_instance", 1)
    return {k: v for k, v in rest.items() if v is not None}


def command_properties(name: str, job: dict[str, Any], *, workspace_id: str, compute: str | None, experiment: str,
                       status: str, output_uris: dict[str, str]) -> dict[str, Any]:
    """REST CommandJob properties of a run record's job (jobspec_io.job_to_record). `output_uris`:
    where each named output is written (its datastore URI). No codeId: the code is a local folder,
    no registered code asset (azure-ai-ml resolves a codeId as one); amlemu shows the folder itself."""
    resources: dict[str, Any] = {"instanceCount": job.get("instance_count", 1)}
    if job.get("shm_size"):
        resources["shmSize"] = job["shm_size"]
    if job.get("instance_type"):  # serverless compute's size
        resources["instanceType"] = job["instance_type"]
    props: dict[str, Any] = {
        "jobType": "Command", "command": job.get("command", ""), "experimentName": experiment, "status": status,
        "displayName": job.get("display_name") or name,
        "computeId": f"{workspace_id}/computes/{compute}" if compute else None,
        "environmentId": _environment_id(job, workspace_id),
        "environmentVariables": dict(job.get("environment_variables") or {}),
        "inputs": {k: _rest_data(v, False) for k, v in (job.get("inputs") or {}).items()},
        "outputs": {k: _rest_data(v, True, output_uris.get(k)) for k, v in (job.get("outputs") or {}).items()},
        "resources": resources, "distribution": _distribution(job.get("distribution") or {}),
        "tags": {}, "properties": dict(job.get("properties") or {}),  # a reused pipeline step's (pipelines/reuse.py)
        "queueSettings": {"jobTier": str(job["job_tier"]).capitalize()} if job.get("job_tier") else None,
    }
    if job.get("max_run_duration_seconds"):
        props["limits"] = {"jobLimitsType": "Command", "timeout": f"PT{job['max_run_duration_seconds']}S"}
    return {k: v for k, v in props.items() if v is not None}


def saved_body(home_root: Path, name: str) -> Path:
    """Where the service keeps the REST body a job was PUT with (emulator/service/emustate.py)."""
    return servicefile.service_dir(home_root) / "jobs" / f"{name}.json"


def job_properties(name: str, job: dict[str, Any], *, home_root: Path, workspace_id: str, compute: str | None,
                   experiment: str, status: str, output_uris: dict[str, str]) -> dict[str, Any]:
    """The REST properties of a job: the body the SDK PUT through the service (its code and
    environment ids as it sent them) with the run's status, else its run record's."""
    try:
        body = json.loads(saved_body(home_root, name).read_text())
    except (OSError, ValueError):  # none (a CLI or API job), or unreadable: the record's job stands
        body = None
    if isinstance(body, dict) and isinstance(body.get("properties"), dict):
        props = {**body["properties"], "status": status}
        props["experimentName"] = props.get("experimentName") or experiment
        if compute and not props.get("computeId"):  # a v1 run's body names its compute elsewhere
            props["computeId"] = f"{workspace_id}/computes/{compute}"
    else:
        props = command_properties(name, job, workspace_id=workspace_id, compute=compute, experiment=experiment,
                                   status=status, output_uris=output_uris)
    own = job_services(Home(home_root).run_dir(name), list(job.get("services") or []), RunStatus(status).is_terminal)
    if own:
        props["services"] = {**(props.get("services") or {}), **own}
    return props


def _declared(service: dict[str, Any] | str) -> dict[str, Any]:
    if isinstance(service, str):  # a record from before services ran: "name (type)"
        name, _, kind = service.partition(" (")
        return {"name": name, "type": kind.rstrip(")")}
    return service


def job_services(run_dir: Path, declared: list[Any], run_ended: bool) -> dict[str, dict[str, Any]]:
    """Azure ML's JobService of each service the job declared (its record's), with its state as its
    run's services record has it: status (the head node's, once no node's is Starting), endpoint
    (the head node's; a jupyter_lab's with its token, while it runs), errorMessage (a service
    skipped); `endpoint.<node>` properties with nodes: all. An ended run's services are Stopped,
    their endpoints without a token, whatever the record says."""
    try:
        live = json.loads((run_dir / SERVICES_RECORD).read_text())
    except (OSError, ValueError):
        live = {}
    found: dict[str, dict[str, Any]] = {}
    for service in map(_declared, declared):
        rest: dict[str, Any] = {"jobServiceType": REST_SERVICE_TYPES.get(service["type"], service["type"])}
        if service.get("nodes") == "all":
            rest["nodes"] = {"nodesValueType": "All"}
        props = {key: service[field] for field, key in (("log_dir", "logDir"), ("ssh_public_keys", "sshPublicKeys"))
                 if service.get(field)}
        nodes = (live.get(service["name"]) or {}).get("nodes") or {}
        shown = {node: {**state, "endpoint": state["endpoint"].split("?", 1)[0] if run_ended else state["endpoint"],
                        "status": "Stopped" if run_ended and state["status"] != "Failed" else state["status"]}
                 for node, state in nodes.items()}
        if shown:
            head = next(iter(shown.values()))  # Starting until every node's has answered or failed
            starting = any(state["status"] == "Starting" for state in shown.values())
            rest.update(status="Starting" if starting else head["status"], endpoint=head["endpoint"])
            errors = [state["error"] for state in shown.values() if state.get("error")]
            if errors:
                rest["errorMessage"] = "; ".join(errors)
            if len(shown) > 1:
                props.update({f"endpoint.{node}": state["endpoint"] for node, state in shown.items()})
        if props:
            rest["properties"] = props
        found[service["name"]] = rest
    return found


def services(name: str, workspace_id: str, service_url: str | None) -> dict[str, dict[str, str]]:
    """Studio: the job's page (the service's, or `amlemu ui`'s when none runs), with the workspace
    in its query as Azure ML's (azure-ai-ml appends `&tid=` to it); Tracking: the MLflow tracking
    server (the service's, or `amlemu ui --mlflow`'s over every run)."""
    base = service_url or UI_URL
    return {"Studio": {"jobServiceType": "Studio", "endpoint": f"{base}/studio/jobs/{name}?wsid={workspace_id}"},
            "Tracking": {"jobServiceType": "Tracking",
                         "endpoint": f"{service_url}{MLFLOW_MOUNT}" if service_url else UI_URL}}


def rest_resource(name: str, props: dict[str, Any], *, workspace_id: str, created_at: float,
                  service_url: str | None) -> dict[str, Any]:
    """The JobBase resource a GET of the job answers. No `default` output: given one, azure-ai-ml's
    jobs.stream reads the logs from the artifact store's blobs rather than the run history."""
    ours = services(name, workspace_id, service_url)  # a job's own (jupyter_lab, ...) stay beside them
    props = {**props, "services": {**(props.get("services") or {}), **ours}}
    props.setdefault("resources", {"instanceCount": 1})  # Azure ML's answer has them whether sent or not
    props.setdefault("tags", {})
    props.setdefault("properties", {})
    when, who = iso(created_at), _user()
    return {"id": f"{workspace_id}/jobs/{name}", "name": name, "type": ARM_TYPE, "properties": props,
            "systemData": {"createdAt": when, "createdBy": who, "createdByType": "User",
                           "lastModifiedAt": when, "lastModifiedBy": who, "lastModifiedByType": "User"}}


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's): Azure would show an id
        return "amlemu"


# --- the REST resource -> az ml's dict ------------------------------------------------------------
def _azureml_id(value: str | None, kind: str) -> str | None:
    """azure-ai-ml's _resolve_azureml_id: a workspace asset's ARM id -> azureml:<name>:<version>
    (a compute's -> azureml:<name>); code stays an ARM id; a reference as written stays."""
    if not value:
        return None
    if kind == "computes":
        return "azureml:" + value.rstrip("/").rsplit("/", 1)[-1]
    arm = _ARM_ASSET.match(value)
    if arm and kind == "environments" and arm["kind"] == "environments":
        return f"azureml:{arm['name']}:{arm['version']}"
    return "azureml:" + value if value.startswith("/subscriptions/") else value


def _az_data(data: Any) -> Any:
    if not isinstance(data, dict):
        return data
    kind = data.get("jobInputType") or data.get("jobOutputType")
    if str(kind).lower() == "literal":
        return data.get("value")
    out = {"type": str(kind).lower(), "mode": YAML_MODES.get(str(data.get("mode", "")).lower(), data.get("mode"))}
    if data.get("uri"):
        out["path"] = data["uri"]
    return {k: v for k, v in out.items() if v is not None}


def _az_distribution(dist: dict[str, Any] | None) -> dict[str, Any] | None:
    if not dist or not dist.get("distributionType"):
        return None
    fields = {"processCountPerInstance": "process_count_per_instance", "workerCount": "worker_count",
              "parameterServerCount": "parameter_server_count"}
    return {"type": str(dist["distributionType"]).lower(),
            **{yaml: dist[rest] for rest, yaml in fields.items() if dist.get(rest) is not None}}


def _az_resources(res: dict[str, Any] | None) -> dict[str, Any]:
    res = res or {}
    fields = {"instanceCount": "instance_count", "instanceType": "instance_type", "shmSize": "shm_size",
              "dockerArgs": "docker_args"}
    return {"instance_count": 1, **{yaml: res[rest] for rest, yaml in fields.items() if res.get(rest) is not None},
            "properties": dict(res.get("properties") or {})}


def _timeout(value: Any) -> Any:
    match = re.fullmatch(r"PT(\d+)S", str(value))
    return int(match[1]) if match else value


def _az_service(rest: dict[str, Any]) -> dict[str, Any]:
    """A JobService as azure-ai-ml's JobService entities print it (Studio, Tracking: endpoint and type)."""
    kind, props = rest.get("jobServiceType"), dict(rest.get("properties") or {})
    shown = {"endpoint": rest.get("endpoint"), "type": YAML_SERVICE_TYPES.get(str(kind), kind),
             "status": rest.get("status"), "nodes": "all" if rest.get("nodes") else None,
             "error_message": rest.get("errorMessage"), "log_dir": props.pop("logDir", None),
             "ssh_public_keys": props.pop("sshPublicKeys", None), "properties": props or None}
    return {k: v for k, v in shown.items() if v is not None or k in ("endpoint", "type")}


def az_job(resource: dict[str, Any]) -> dict[str, Any]:
    """`az ml job show`'s dict of a Job resource (a command job)."""
    props, system = resource.get("properties") or {}, resource.get("systemData") or {}
    arm_id = str(resource.get("id", ""))
    group = re.search(r"/resourcegroups/([^/]+)", arm_id, re.IGNORECASE)
    data: dict[str, Any] = {
        "name": resource.get("name"), "id": "azureml:" + arm_id, "type": str(props.get("jobType", "command")).lower(),
        "display_name": props.get("displayName"), "experiment_name": props.get("experimentName"),
        "status": props.get("status"), "description": props.get("description"),
        "tags": dict(props.get("tags") or {}), "properties": dict(props.get("properties") or {}),
        "creation_context": {k: system[rest] for k, rest in CREATION_CONTEXT.items() if system.get(rest) is not None},
        "services": {k: _az_service(v) for k, v in (props.get("services") or {}).items() if isinstance(v, dict)},
        "compute": _azureml_id(props.get("computeId"), "computes"), "command": props.get("command"),
        "code": _azureml_id(props.get("codeId"), "codes"),
        "environment": _azureml_id(props.get("environmentId"), "environments"),
        "environment_variables": dict(props.get("environmentVariables") or {}),
        "inputs": {k: _az_data(v) for k, v in (props.get("inputs") or {}).items()},
        "outputs": {k: _az_data(v) for k, v in (props.get("outputs") or {}).items()},
        "resources": _az_resources(props.get("resources")),
        "distribution": _az_distribution(props.get("distribution")),
        "limits": {"timeout": _timeout(props["limits"]["timeout"])}
        if isinstance(props.get("limits"), dict) and props["limits"].get("timeout") else None,
        "resourceGroup": group[1] if group else None,
        "queue_settings": {"job_tier": str(props["queueSettings"]["jobTier"]).lower()}
        if isinstance(props.get("queueSettings"), dict) and props["queueSettings"].get("jobTier") else None,
    }
    return {k: data[k] for k in sorted(data) if data[k] is not None}
