"""An SDK v1 run configuration (the dict the SDK sends on submit) -> JobSpec -> CLI v2 job YAML.

Pure: no azureml import here (emulator/sdk1.py reads the SDK objects). Errors name the v1 field
(`arguments[1]`, `run_config.data_references.<name>`, `distributed_job_config`) and the fix.
"""
from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from amlemu import skus
from amlemu.errors import ConfigError
from amlemu.jobs.envyaml import environment_from_dict
from amlemu.names import check_experiment_name, default_experiment_name
from amlemu.specs import DataInput, DataMode, Distribution, DistributionType, JobSpec

V1_DEFAULT_TIMEOUT = 2592000  # RunConfiguration.max_run_duration_seconds: 30 days means "not set"
DATAREF_RE = re.compile(r"\$AZUREML_DATAREFERENCE_(\w+)")
DATASET_PREFIXES = ("DatasetConsumptionConfig:", "DatasetOutputConfig:")
GUID_RE = re.compile(r"^[0-9a-f]{32}$")  # the name the SDK gives a DataReference when none is given
NOT_AMLCOMPUTE = ("", "local", "amlcompute")  # amlcompute: v1's run-based cluster (vm_size, no target)
SCHEMA = "https://azuremlschemas.azureedge.net/latest/commandJob.schema.json"
REGISTER_FIX = ("pass str(ref) in the arguments and register it: "
                "src.run_config.data_references = {ref.data_reference_name: ref.to_config()}")


def job_from_run_config(rc: dict[str, Any], source_directory: str | Path, *, compute: str | None = None,
                        experiment_name: str | None = None) -> JobSpec:
    """The job a v1 submission describes. `rc` is _serialize_to_dict(get_run_config_from_script_run(src))."""
    code = Path(source_directory).expanduser().resolve()
    if not code.is_dir():
        raise ConfigError("source_directory", f"{code} is not a folder", "point it at the job's source folder")
    command, inputs, outputs = _command(rc, code)
    instance_count, distribution = _distribution(rc)
    target = compute or str(rc.get("target") or "")
    if target.removeprefix("azureml:") in NOT_AMLCOMPUTE:
        raise ConfigError("compute_target", f"'{target}' is not an AmlCompute cluster",
                          "pass compute_target=<cluster name> (or --compute NAME)")
    timeout = rc.get("maxRunDurationSeconds")
    environment = _environment(rc.get("environment") or {})
    return JobSpec(
        command=command,
        code=code,
        compute=target.removeprefix("azureml:"),
        experiment_name=check_experiment_name(experiment_name) if experiment_name else default_experiment_name(code.name),
        instance_count=instance_count,
        distribution=distribution,
        environment=environment,
        # An image is an inline environment, as its YAML (`environment: {image: ...}`) loads.
        environment_def=environment_from_dict({"image": environment}, base_dir=code)
        if environment and not environment.startswith("azureml:") else None,
        environment_variables=_environment_variables(rc),
        inputs=inputs,
        outputs=outputs,
        max_run_duration_seconds=None if timeout in (None, V1_DEFAULT_TIMEOUT) else int(timeout),
    )


# --- command and data ----------------------------------------------------------------------------
def _command(rc: dict[str, Any], code: Path) -> tuple[str, dict[str, Any], dict[str, DataInput]]:
    script, arguments, command = rc.get("script"), list(rc.get("arguments") or []), rc.get("command")
    configs = dict(rc.get("dataReferences") or {})
    # A multi-node estimator shares its code through a datastore (source_directory_data_store, the
    # workspace's blob store by default): every emulated node gets the snapshot, so that reference
    # is the code itself, not data.
    configs.pop(str(rc.get("sourceDirectoryDataStore") or ""), None)
    refs = _Refs(configs)
    if command and (script or arguments):
        raise ConfigError("command", "is given together with script/arguments, which Azure ML refuses",
                          "give either script= and arguments=, or command= alone")
    if isinstance(command, str) and command.strip():
        text = refs.bind(command, "command")
    elif isinstance(command, list) and command:
        text = " ".join(_word(item, f"command[{i}]", command[i - 1] if i else None, refs)
                        for i, item in enumerate(command))
    elif script:
        if not (code / script).is_file():
            raise ConfigError("script", f"{script} not found in source_directory {code}",
                              "give the script's path relative to source_directory")
        words = [_word(arg, f"arguments[{i}]", arguments[i - 1] if i else None, refs)
                 for i, arg in enumerate(arguments)]
        text = " ".join(["python", shlex.quote(script), *words])
    else:
        raise ConfigError("script", "neither script nor command is set", "give script= (and arguments=) or command=")
    refs.check_all_used()
    return text, refs.inputs, refs.outputs


def _word(value: Any, field: str, previous: Any, refs: _Refs) -> str:
    """One argv word, shell-quoted, with each data reference replaced by its ${{...}} binding."""
    if not isinstance(value, (str, int, float, bool)) and value is not None:
        if type(value).__name__ == "DataReference":
            # requests' json= cannot serialize it: the v1 submission itself fails with a TypeError.
            raise ConfigError(field, "a DataReference object cannot be submitted (the SDK cannot serialize it)",
                              REGISTER_FIX)
        raise ConfigError(field, f"a {type(value).__name__} is not converted",
                          "pass a string, a number or str(datastore.path('<path>').as_mount())")
    text = str(value)
    if text.startswith(DATASET_PREFIXES):
        raise ConfigError(field, f"datasets ({text.partition(':')[0]}) are not converted",
                          "pass a datastore path instead: str(datastore.path('<path>').as_mount()), registered in "
                          "src.run_config.data_references")
    pieces, last = [], 0
    for match in DATAREF_RE.finditer(text):
        pieces += [shlex.quote(text[last:match.start()]) if text[last:match.start()] else "",
                   refs.binding(match.group(1), field, _hint(previous, text[:match.start()]))]
        last = match.end()
    if last == 0:
        return shlex.quote(text)
    return "".join(pieces) + (shlex.quote(text[last:]) if text[last:] else "")


class _Refs:
    """run_config.data_references, turned into v2 inputs/outputs as the arguments use them."""

    def __init__(self, configs: dict[str, Any]) -> None:
        self.configs, self.inputs, self.outputs = configs, {}, {}
        self.names: dict[str, str] = {}  # data reference name -> 'inputs.x' / 'outputs.x'

    def bind(self, command: str, field: str) -> str:
        """A command string: each reference becomes a binding named after the option before it."""
        def sub(match: re.Match[str]) -> str:
            before = command[:match.start()]
            words = before.split()
            previous = words[-1] if words and before[-1:].isspace() else None
            return self.binding(match.group(1), field, _hint(previous, "" if previous else _tail(before)))
        return DATAREF_RE.sub(sub, command)

    def binding(self, ref: str, field: str, hint: str | None) -> str:
        if ref not in self.names:
            config = self.configs.get(ref)
            if config is None:
                raise ConfigError(field, f"$AZUREML_DATAREFERENCE_{ref} is not in run_config.data_references, "
                                  "so Azure ML would pass the text unchanged", REGISTER_FIX)
            self.names[ref] = self._add(ref, config, hint)
        return "${{" + self.names[ref] + "}}"

    def _add(self, ref: str, config: dict[str, Any], hint: str | None) -> str:
        field = f"run_config.data_references.{ref}"
        store, path = config.get("dataStoreName"), str(config.get("pathOnDataStore") or "").strip("/")
        if not store:
            raise ConfigError(f"{field}.data_store_name", "missing", "create the reference with datastore.path(...)")
        mode = str(config.get("mode") or "mount").lower()
        modes = {"mount": ("inputs", DataMode.RO_MOUNT), "download": ("inputs", DataMode.DOWNLOAD),
                 "upload": ("outputs", DataMode.UPLOAD)}
        if mode not in modes:
            raise ConfigError(f"{field}.mode", f"'{mode}' is not converted", "use as_mount(), as_download() or as_upload()")
        kind, data_mode = modes[mode]
        name = _unique(_input_name(ref, hint, path), self.inputs.keys() | self.outputs.keys())
        getattr(self, kind)[name] = DataInput("uri_folder", f"azureml://datastores/{store}/paths/{path}", data_mode)
        return f"{kind}.{name}"

    def check_all_used(self) -> None:
        unused = sorted(set(self.configs) - set(self.names))
        if unused:
            raise ConfigError(f"run_config.data_references.{unused[0]}", "is not used in the arguments: the "
                              "emulator (like a v2 job) passes data paths only on the command line",
                              "pass str(ref) as the argument where the script reads the path")


def _tail(before: str) -> str:
    return before.split()[-1] if before.split() else ""


def _hint(previous: Any, before: str) -> str | None:
    """The option a data path is given to: `--data-dir REF` or `--data-dir=REF`."""
    if before.endswith("="):
        return before[:-1]
    if not before and isinstance(previous, str) and previous.startswith("-"):
        return previous
    return None


def _input_name(ref: str, hint: str | None, path: str) -> str:
    # v2 input names are identifiers; the SDK's default reference names are GUIDs (may start with a digit).
    for candidate in ([] if GUID_RE.match(ref) else [ref]) + [hint or "", path.rsplit("/", 1)[-1], "data"]:
        name = re.sub(r"\W+", "_", candidate.lstrip("-")).strip("_").lower()
        if name and not name[0].isdigit():
            return name
    return "data"


def _unique(name: str, taken: set[str]) -> str:
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}_{n}"
    return candidate


# --- distribution, environment -------------------------------------------------------------------
def _distribution(rc: dict[str, Any]) -> tuple[int, Distribution]:
    nodes = int(rc.get("nodeCount") or 1)
    framework = str(rc.get("framework") or "Python").lower()
    communicator = str(rc.get("communicator") or "None").lower()
    if communicator in ("intelmpi", "openmpi", "mpi"):
        per_node = int((rc.get("mpi") or {}).get("processCountPerNode") or 1)
        return nodes, Distribution(DistributionType.MPI, per_node)
    if framework == "pytorch":
        total = int((rc.get("pytorch") or {}).get("processCount") or nodes)
        if total % nodes:
            raise ConfigError("distributed_job_config.process_count", f"{total} processes do not divide over "
                              f"{nodes} nodes", "make process_count a multiple of node_count")
        return nodes, Distribution(DistributionType.PYTORCH, total // nodes)
    if framework == "tensorflow" and communicator == "parameterserver":  # TensorflowConfiguration
        tf = rc.get("tensorflow") or {}
        return nodes, Distribution(DistributionType.TENSORFLOW, worker_count=int(tf.get("workerCount") or nodes),
                                   parameter_server_count=int(tf.get("parameterServerCount") or 0))
    if framework == "python" and communicator == "none":
        if nodes > 1:
            raise ConfigError("node_count", f"{nodes} nodes without a distributed_job_config",
                              "pass distributed_job_config=MpiConfiguration(...) or PyTorchConfiguration(...)")
        return nodes, Distribution()
    raise ConfigError("distributed_job_config", f"{rc.get('framework')}/{rc.get('communicator')} is not emulated",
                      "use MpiConfiguration, PyTorchConfiguration or TensorflowConfiguration")


def _environment(env: dict[str, Any]) -> str | None:
    docker = env.get("docker") or {}
    if docker.get("baseDockerfile") or docker.get("buildContext"):
        raise ConfigError("environment.docker.base_dockerfile", "image builds are not emulated",
                          "build and push the image, then set environment.docker.base_image to it")
    image = docker.get("baseImage")
    if image:
        registry = str((docker.get("baseImageRegistry") or {}).get("address") or "").rstrip("/")
        # The estimators keep the registry apart (viennaprivate.azurecr.io + pytorch:1.4-gpu).
        return f"{registry}/{image}" if registry and not image.startswith(registry + "/") else image
    if env.get("name"):
        version = env.get("version")
        return f"azureml:{env['name']}:{version}" if version else f"azureml:{env['name']}@latest"
    return None


def _environment_variables(rc: dict[str, Any]) -> dict[str, str]:
    # Environment.environment_variables is v1's deprecated place; RunConfiguration's are the runtime ones.
    merged = {**((rc.get("environment") or {}).get("environmentVariables") or {}),
              **(rc.get("environmentVariables") or {})}
    return {str(k): str(v) for k, v in merged.items()}


# --- JobSpec -> CLI v2 YAML ----------------------------------------------------------------------
def _data(value: DataInput) -> dict[str, str]:
    return {"type": value.type, **({"path": value.path} if value.path else {}), "mode": value.mode.value}


def job_yaml_dict(job: JobSpec, relative_to: Path | None = None) -> dict[str, Any]:
    """The CLI v2 command job for `job`; `code` is relative to `relative_to` (the YAML's folder) when given."""
    data: dict[str, Any] = {"$schema": SCHEMA, "type": "command", "experiment_name": job.experiment_name}
    if job.display_name:
        data["display_name"] = job.display_name
    if job.code is not None:  # no code: none in the YAML either (an empty working folder)
        code = os.path.relpath(job.code, relative_to.resolve()) if relative_to else str(job.code)
        data["code"] = Path(code).as_posix()
    elif job.code_git:
        data["code"] = job.code_git
    data["command"] = job.command
    if job.inputs:
        data["inputs"] = {k: _data(v) if isinstance(v, DataInput) else v for k, v in job.inputs.items()}
    if job.outputs:
        data["outputs"] = {k: _data(v) for k, v in job.outputs.items()}
    if job.environment:
        data["environment"] = job.environment if job.environment.startswith("azureml:") else {"image": job.environment}
    if job.environment_variables:
        data["environment_variables"] = dict(job.environment_variables)
    if job.compute != skus.SERVERLESS:  # serverless: no compute, as Azure ML's examples write it
        data["compute"] = job.compute if job.compute == skus.LOCAL else f"azureml:{job.compute}"
    dist = job.distribution
    if dist.type is DistributionType.TENSORFLOW:
        data["distribution"] = {"type": dist.type.value, "parameter_server_count": dist.parameter_server_count,
                                **({"worker_count": dist.worker_count} if dist.worker_count else {})}
    elif dist.type is not DistributionType.NONE:
        data["distribution"] = {"type": dist.type.value, "process_count_per_instance": dist.process_count_per_instance}
    data["resources"] = {"instance_count": job.instance_count}
    if job.shm_size:
        data["resources"]["shm_size"] = job.shm_size
    if job.instance_type:
        data["resources"]["instance_type"] = job.instance_type
    if job.job_tier:
        data["queue_settings"] = {"job_tier": job.job_tier}
    if job.max_run_duration_seconds:
        data["limits"] = {"timeout": job.max_run_duration_seconds}
    return data


def job_yaml(job: JobSpec, relative_to: Path | None = None, header: str = "") -> str:
    body = yaml.safe_dump(job_yaml_dict(job, relative_to), sort_keys=False, width=120)
    return "".join(f"# {line}\n" for line in header.splitlines()) + body
