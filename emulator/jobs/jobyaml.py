"""Azure ML CLI v2 command-job YAML -> JobSpec, with errors that name the field.

The same file goes to `az ml job create -f job.yml`; fields the emulator does not use but Azure
accepts are accepted, fields Azure would reject are rejected here too.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from amlemu import safeyaml, skus
from amlemu.errors import ConfigError
from amlemu.jobs.envyaml import environment_from_dict
from amlemu.jobs.gitcode import is_git, parse_git_code
from amlemu.names import (
    check_display_name,
    check_environment_variables,
    check_experiment_name,
    check_image_reference,
    check_job_name,
    cwd_experiment_name,
)
from amlemu.specs import INPUT_MODES, OUTPUT_MODES, DataInput, DataMode, Distribution, DistributionType, JobSpec, ServiceSpec
from amlemu.storage.assets import MODEL_TYPES, is_asset_ref
from amlemu.storage.datastores import parse_uri
from amlemu.storage.nodecache import policy_from_env
from amlemu.storage.urlinputs import is_url, parse_url

KNOWN_FIELDS = {
    "$schema", "type", "name", "display_name", "experiment_name", "description", "tags", "properties",
    "code", "command", "environment", "compute", "distribution", "resources", "environment_variables",
    "inputs", "outputs", "limits", "services", "identity", "queue_settings",
}
DISTRIBUTION_FIELDS = {"type", "process_count_per_instance", "worker_count", "parameter_server_count"}
TENSORFLOW_FIELDS = {"worker_count", "parameter_server_count"}  # az ml's TensorFlowDistribution, only there
RESOURCE_FIELDS = {"instance_count", "instance_type", "shm_size", "docker_args", "properties"}
QUEUE_FIELDS = {"job_tier", "priority"}  # az ml's QueueSettings
BINDING_RE = re.compile(r"\$\{\{\s*([a-zA-Z_][\w.]*)\s*\}\}")
INPUT_FIELDS = {"type", "path", "mode", "description", "optional"}
FOLDER_TYPES = ("mltable", *MODEL_TYPES)
OUTPUT_FIELDS = {"type", "path", "mode", "description", "name", "version"}


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`az ml job create --set a.b.c=value`: set (or add) a nested field before validation."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError("--set", f"'{item}' is not key=value", "write e.g. --set inputs.data.path=./data")
        node = data
        *parents, last = key.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {key}", f"{part} holds a value, not fields")
            node = child
        node[last] = safeyaml.loads(raw, f"--set {key}") if raw else ""
    return data


def load_job(path: str | Path, overrides: list[str] | None = None) -> JobSpec:
    path = Path(path)
    data = safeyaml.load_file(path, "-f", "job YAML")
    if overrides:
        data = apply_overrides(data if isinstance(data, dict) else {}, overrides)
    return job_from_dict(data, base_dir=path.parent)


def _mapping(value: Any, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(field, f"must be a mapping, got {type(value).__name__}")
    return value


def _check_fields(data: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where}{unknown[0]}", "unknown field", f"known fields: {', '.join(sorted(known))}")


def _int(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(field, f"must be an integer, got {value!r}")
    return value


def check_bindings(command: str, inputs: dict[str, Any], outputs: dict[str, Any] | None = None) -> None:
    """Every ${{...}} in the command must name a defined input or output."""
    defined = {"inputs": inputs, "outputs": outputs or {}}
    for match in BINDING_RE.finditer(command):
        ref = match.group(1)
        kind, _, name = ref.partition(".")
        if name not in defined.get(kind, {}):
            known = [f"{k}.{n}" for k, names in defined.items() for n in names]
            raise ConfigError("command", f"${{{{{ref}}}}} refers to nothing",
                              f"define it under inputs or outputs (known: {', '.join(known) or 'none'})")


def substitute_bindings(command: str, values: dict[str, str]) -> str:
    """Replace ${{inputs.x}} / ${{outputs.y}} by values keyed 'inputs.x' / 'outputs.y'."""
    return BINDING_RE.sub(lambda m: values[m.group(1)], command)


def _mode(value: dict[str, Any], field: str, allowed: tuple[DataMode, ...], default: DataMode) -> DataMode:
    mode = str(value.get("mode", default.value))
    names = ", ".join(m.value for m in allowed)
    try:
        parsed = DataMode(mode)
    except ValueError:
        raise ConfigError(f"{field}.mode", f"'{mode}' is not a data mode", f"use one of: {names}") from None
    if parsed not in allowed:
        raise ConfigError(f"{field}.mode", f"{mode} is not allowed here", f"use one of: {names}")
    return parsed


def binding_type(kind: str, field: str) -> str:
    """How a typed input or output is bound: uri_file as a file; uri_folder, mltable and the model
    types (custom_model, mlflow_model, triton_model) as a folder, as Azure ML mounts them."""
    if kind in ("uri_file", "uri_folder"):
        return kind
    if kind in FOLDER_TYPES:
        return "uri_folder"
    raise ConfigError(field, f"'{kind}' is not supported", f"use one of: uri_file, uri_folder, {', '.join(FOLDER_TYPES)}")


def _data_input(name: str, value: dict[str, Any], base_dir: Path) -> DataInput:
    field = f"inputs.{name}"
    _check_fields(value, INPUT_FIELDS, f"{field}.")
    path = value.get("path")
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{field}.path", "missing", "give a local path or an azureml://datastores/... URI")
    kind = binding_type(str(value.get("type", "uri_folder")), f"{field}.type")
    mode = _mode(value, field, INPUT_MODES, DataMode.RO_MOUNT)
    if is_asset_ref(path):  # a data/model asset or a job's output: resolved against the workspace at submit
        return DataInput(kind, path.strip(), mode)
    if path.startswith("azureml://"):
        try:
            parse_uri(path)
        except ConfigError as exc:
            raise ConfigError(f"{field}.path", exc.problem, exc.fix) from None
        return DataInput(kind, path.strip(), mode)
    if is_url(path):  # read by the host at run time (storage/urlinputs.py); a URL is read-only: no rw_mount
        parse_url(path, f"{field}.path")
        return DataInput(kind, path.strip(), mode)
    if path.startswith(("azureml:", "https:", "http:", "wasbs:", "abfss:")):
        raise ConfigError(f"{field}.path", f"{path}: only azureml://datastores/<ds>/paths/<p> URIs, assets "
                          "(azureml:<name>:<version> or @latest), azureml://jobs/<job>/outputs/<name> and local "
                          "paths are emulated", "register the storage as a datastore (`amlemu datastore create`)")
    if mode is DataMode.DIRECT:
        raise ConfigError(f"{field}.mode", "direct passes a storage URI to the job; a local path has none",
                          "use ro_mount or download, or upload the data to a datastore")
    local = (base_dir / Path(path).expanduser()).resolve()
    if not (local.is_dir() if kind == "uri_folder" else local.is_file()):
        raise ConfigError(f"{field}.path", f"{local} is not an existing {'folder' if kind == 'uri_folder' else 'file'}")
    return DataInput(kind, str(local), mode)


def _data_output(name: str, value: dict[str, Any]) -> DataInput:
    field = f"outputs.{name}"
    _check_fields(value, OUTPUT_FIELDS, f"{field}.")
    path = str(value.get("path") or "")
    if path:
        if not path.startswith("azureml://"):
            raise ConfigError(f"{field}.path", f"'{path}' is not a datastore URI",
                              "write azureml://datastores/<ds>/paths/<path>, or leave it out for the default")
        try:
            parse_uri(path)
        except ConfigError as exc:
            raise ConfigError(f"{field}.path", exc.problem, exc.fix) from None
    return DataInput(binding_type(str(value.get("type", "uri_folder")), f"{field}.type"), path.strip(),
                     _mode(value, field, OUTPUT_MODES, DataMode.RW_MOUNT))


def script_of(command: str) -> str | None:
    """The script a `python [opts] script.py ...` command runs, to check that it exists."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if not words or not Path(words[0]).name.startswith("python"):
        return None
    for word in words[1:]:
        if word in ("-m", "-c"):
            return None
        if not word.startswith("-"):
            return word
    return None


def _code_dir(code: Any, base_dir: Path) -> Path | None:
    """The job's code folder; None when it has none (Azure ML runs the command in an empty folder)."""
    if code is None or is_git(code):  # a repository: cloned at submit (jobs/gitcode.py)
        return None
    if isinstance(code, bool) or not isinstance(code, (str, int, float)):
        raise ConfigError("code", f"a {type(code).__name__} is not a folder path", "point code at the job's "
                          "source folder, or leave code out to run the command in an empty folder")
    code_dir = (base_dir / str(code)).resolve()
    if not code_dir.is_dir():
        raise ConfigError("code", f"{code_dir} is not a folder", "point code at the job's source folder")
    return code_dir


def _compute(compute: Any) -> str:
    """A cluster's name, `serverless` (also when there is none: Azure ML's default) or `local`."""
    if compute is None or (isinstance(compute, str) and not compute.strip()):
        return skus.SERVERLESS
    if not isinstance(compute, str):
        raise ConfigError("compute", f"{compute!r:.60} is not a compute name",
                          "write compute: azureml:<cluster name>, or leave it out for serverless compute")
    name = compute.strip().removeprefix("azureml:")
    return name.lower() if name.lower() in (skus.SERVERLESS, skus.LOCAL) else name


def _queue_settings(data: dict[str, Any]) -> str | None:
    settings = _mapping(data.get("queue_settings"), "queue_settings")
    _check_fields(settings, QUEUE_FIELDS, "queue_settings.")
    tier = settings.get("job_tier")
    return None if tier is None else skus.job_tier(tier)


def _check_script(command: str, inputs: dict[str, Any], outputs: dict[str, Any], code_dir: Path | None) -> None:
    """The script the command runs is in the code folder (a job with no code has none to run)."""
    placeholders = {f"{kind}.{n}": "DATA" for kind, names in (("inputs", inputs), ("outputs", outputs)) for n in names}
    script = script_of(substitute_bindings(command, placeholders))
    if script and code_dir is None and not Path(script).is_absolute():
        raise ConfigError("command", f"script {script} not found: the job has no code, so it runs in an empty "
                          "folder", "set code: to the folder that holds the script")
    if script and code_dir is not None and not (code_dir / script).is_file():
        raise ConfigError("command", f"script {script} not found in code folder {code_dir}",
                          "fix the script path (it is relative to code)")


def _distribution(dist_data: dict[str, Any]) -> Distribution:
    _check_fields(dist_data, DISTRIBUTION_FIELDS, "distribution.")
    dist_type = str(dist_data.get("type", "none")).lower()
    try:
        kind = DistributionType(dist_type)
    except ValueError:
        raise ConfigError("distribution.type", f"'{dist_type}' is not supported",
                          "use mpi, pytorch or tensorflow (ray is not emulated)") from None
    misplaced = sorted((set(dist_data) & TENSORFLOW_FIELDS) if kind is not DistributionType.TENSORFLOW else
                       (set(dist_data) & {"process_count_per_instance"}))
    if misplaced:
        raise ConfigError(f"distribution.{misplaced[0]}", f"is not a field of a {kind.value} distribution",
                          "tensorflow takes worker_count and parameter_server_count, mpi and pytorch "
                          "process_count_per_instance")
    per_node = _int(dist_data.get("process_count_per_instance", 1), "distribution.process_count_per_instance")
    workers = dist_data.get("worker_count")
    return Distribution(kind, per_node, None if workers is None else _int(workers, "distribution.worker_count"),
                        _int(dist_data.get("parameter_server_count", 0), "distribution.parameter_server_count"))


def _environment(environment: Any, base_dir: Path) -> tuple[Any, dict[str, Any] | None]:
    """(the environment as the job names it, its inline definition if it has one)."""
    if isinstance(environment, dict):
        definition = environment_from_dict(environment, base_dir=base_dir, where="environment.")
        return definition.get("image") or definition.get("name"), definition
    if isinstance(environment, str) and environment.strip() and not environment.startswith("azureml:"):
        check_image_reference(environment, "environment")  # an image by reference: the engine's grammar
    return environment, None


def job_from_dict(data: Any, *, base_dir: Path) -> JobSpec:
    if not isinstance(data, dict):
        raise ConfigError("job", "the YAML must be a mapping of job fields")
    if data.get("type") == "sweep":
        raise ConfigError("type", "a sweep job where a command job is expected", "submit it with `amlemu job "
                          "create -f` or Emulator.submit, which read sweeps (emulator/sweeps/)")
    if data.get("type", "command") != "command":  # before the fields: a pipeline's `jobs` is no typo
        raise ConfigError("type", f"'{data['type']}' jobs are not supported", "use type: command")
    _check_fields(data, KNOWN_FIELDS, "")
    command = data.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ConfigError("command", "missing", "give the command that starts the job")

    code_dir = _code_dir(data.get("code"), base_dir)
    code_git = parse_git_code(str(data["code"])).url if is_git(data.get("code")) else None

    compute = _compute(data.get("compute"))

    inputs: dict[str, Any] = {}
    for name, value in _mapping(data.get("inputs"), "inputs").items():
        inputs[name] = _data_input(name, value, base_dir) if isinstance(value, dict) else value
    outputs = {name: _data_output(name, _mapping(value, f"outputs.{name}"))
               for name, value in _mapping(data.get("outputs"), "outputs").items()}
    check_bindings(command, inputs, outputs)
    if code_git is None:  # a repository's script is looked for once it is cloned
        _check_script(command, inputs, outputs, code_dir)
    distribution = _distribution(_mapping(data.get("distribution"), "distribution"))

    resources = _mapping(data.get("resources"), "resources")
    _check_fields(resources, RESOURCE_FIELDS, "resources.")
    instance_count = _int(resources.get("instance_count", 1), "resources.instance_count")

    env_vars = check_environment_variables(_mapping(data.get("environment_variables"), "environment_variables"))
    policy_from_env(env_vars)  # the data runtime's knobs: a bad value fails here, not on the node
    limits = _mapping(data.get("limits"), "limits")
    timeout = limits.get("timeout")
    environment, environment_def = _environment(data.get("environment"), base_dir)

    return JobSpec(
        name=check_job_name(data.get("name")),
        command=command,
        code=code_dir,
        code_git=code_git,
        compute=compute,
        experiment_name=(cwd_experiment_name() if data.get("experiment_name") is None
                         else check_experiment_name(data["experiment_name"])),
        instance_count=instance_count,
        distribution=distribution,
        environment=str(environment) if environment else None,
        environment_variables=env_vars,
        inputs=inputs,
        outputs=outputs,
        display_name=check_display_name(data.get("display_name")),
        max_run_duration_seconds=None if timeout is None else _int(timeout, "limits.timeout"),
        shm_size=None if resources.get("shm_size") is None else str(resources["shm_size"]),
        environment_def=environment_def,
        instance_type=None if resources.get("instance_type") is None else str(resources["instance_type"]),
        job_tier=_queue_settings(data),
        services=_services(_mapping(data.get("services"), "services")),
    )


def _services(services: dict[str, Any]) -> tuple[ServiceSpec, ...]:
    """`services:`: each a mapping with its type (jupyter_lab, ssh, tensor_board, vs_code, custom),
    as azure-ai-ml's schema has them, with its nodes, log_dir and ssh_public_keys."""
    found = []
    for name, value in services.items():
        service = _mapping(value, f"services.{name}")
        kind = service.get("type")
        if not isinstance(kind, str) or not kind.strip():
            raise ConfigError(f"services.{name}.type", "missing", "give the service's type: jupyter_lab, ssh, "
                              "tensor_board or vs_code")
        text = {key: None if service.get(key) is None else str(service[key])
                for key in ("nodes", "log_dir", "ssh_public_keys")}
        found.append(ServiceSpec(str(name), kind, **text))
    return tuple(found)
