"""The Azure ML SDK v1 (azureml-core / azureml-train-core, the seed article's API) -> the emulator.

Reads a ScriptRunConfig or a (deprecated) azureml.train estimator exactly as `Experiment.submit`
would send it: the merged RunConfiguration, serialized by the SDK itself (emulator/jobs/convert.py maps
that dict). Also builds the offline SDK objects the seed's code needs (a Workspace, an AmlCompute
target) so it runs without the service. azureml is imported only inside functions: the emulator
works without the `sdk1` extra, and says how to install it when a function needs it.
"""
from __future__ import annotations

import contextlib
import logging
import runpy
import sys
import traceback
import warnings
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from amlemu.errors import ConfigError
from amlemu.jobs.convert import job_from_run_config, job_yaml
from amlemu.specs import ClusterSpec, JobSpec, Priority

SCRIPT_RUN_CONFIG = "azureml.core.script_run_config.ScriptRunConfig"
ESTIMATOR = "azureml.train.estimator._mml_base_estimator.MMLBaseEstimator"
PROVISIONING = "azureml.core.compute.amlcompute.AmlComputeProvisioningConfiguration"
V1_DEFAULT_VM_SIZE = "Standard_NC6"  # provisioning_configuration's documented default
V1_DEFAULT_IDLE = 1800


def require_sdk() -> None:
    try:
        import azureml.core  # noqa: F401, PLC0415
    except ImportError:
        raise ConfigError("azureml-core", "the Azure ML SDK v1 is not installed",
                          "pip install 'amlemu[sdk1]'") from None


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence the SDK's deprecation warnings and log lines for the duration, and only those."""
    root, azureml = logging.getLogger(), logging.getLogger("azureml")
    saved = azureml.level
    # The SDK calls logging.warning(): on a root logger without handlers that runs basicConfig() for
    # good. A NullHandler prevents it; the filter drops records logged on the root logger itself only.
    guard = logging.NullHandler()

    def drop(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR

    root.addHandler(guard)
    root.addFilter(drop)
    azureml.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        azureml.setLevel(saved)
        root.removeFilter(drop)
        root.removeHandler(guard)


def _class_names(obj: object) -> set[str]:
    return {f"{c.__module__}.{c.__qualname__}" for c in type(obj).__mro__}


def is_job_config(obj: object) -> bool:
    """A ScriptRunConfig or an azureml.train estimator (what Experiment.submit takes)."""
    return bool(_class_names(obj) & {SCRIPT_RUN_CONFIG, ESTIMATOR})


def is_v1(obj: object) -> bool:
    """An SDK v1 job or cluster configuration; by class name, so azureml need not be installed."""
    return is_job_config(obj) or PROVISIONING in _class_names(obj)


# --- jobs ----------------------------------------------------------------------------------------
def _script_run_config(src: Any) -> Any:
    names = _class_names(src)
    if SCRIPT_RUN_CONFIG in names:
        return src
    if ESTIMATOR in names:
        # What Experiment.submit(estimator) submits (MMLBaseEstimator._submit): a ScriptRunConfig over
        # estimator.run_config, whose script_params are already arguments and data_references.
        with quiet():
            return src._get_script_run_config()
    raise ConfigError("src", f"a {type(src).__name__} is not a v1 job configuration",
                      "give an azureml.core.ScriptRunConfig or an azureml.train estimator")


def _read(src: Any) -> tuple[dict[str, Any], str]:
    require_sdk()
    from azureml.core._serialization_utils import _serialize_to_dict  # noqa: PLC0415
    from azureml.core.script_run_config import get_run_config_from_script_run  # noqa: PLC0415

    config = _script_run_config(src)
    with quiet():
        return _serialize_to_dict(get_run_config_from_script_run(config)), config.source_directory


def run_config_dict(src: Any) -> dict[str, Any]:
    """The serialized RunConfiguration the SDK sends (definition.json's "Configuration"): a v1 dry run."""
    return _read(src)[0]


def job_from_v1(src: Any, *, compute: str | None = None, experiment_name: str | None = None) -> JobSpec:
    """The job `Experiment(ws, experiment_name).submit(src)` would run. v1 takes the experiment name
    from Experiment(), not from the config: without one, the source folder's name is used."""
    rc, source_directory = _read(src)
    return job_from_run_config(rc, source_directory, compute=compute, experiment_name=experiment_name)


def yaml_from_v1(src: Any, *, compute: str | None = None, experiment_name: str | None = None,
                 relative_to: Path | None = None) -> str:
    """The CLI v2 job YAML for `src`; `code` is written relative to `relative_to` (the YAML's folder)."""
    job = job_from_v1(src, compute=compute, experiment_name=experiment_name)
    kind = "ScriptRunConfig" if SCRIPT_RUN_CONFIG in _class_names(src) else f"{type(src).__name__} estimator"
    return job_yaml(job, relative_to, header=f"Converted by `amlemu job convert` from an SDK v1 {kind}.")


# --- clusters and the offline workspace -----------------------------------------------------------
def cluster_from_v1(config: Any, name: str) -> ClusterSpec:
    """AmlCompute.provisioning_configuration(...) -> the cluster `ComputeTarget.create(ws, name, config)` makes."""
    if PROVISIONING not in _class_names(config):
        raise ConfigError("provisioning_configuration", f"a {type(config).__name__} is not an AmlCompute "
                          "provisioning configuration", "give AmlCompute.provisioning_configuration(...)")
    scale = config.scale_settings
    if scale.maximum_node_count is None:  # the SDK refuses it too, unless the object was edited after
        raise ConfigError("max_nodes", "not set", "pass max_nodes= to provisioning_configuration")
    idle = scale.idle_seconds_before_scaledown
    return ClusterSpec(name=name, vm_size=config.vm_size or V1_DEFAULT_VM_SIZE,
                       vm_priority=Priority.parse(config.vm_priority or "dedicated"),
                       min_nodes=scale.minimum_node_count or 0, max_nodes=scale.maximum_node_count,
                       idle_seconds_before_scaledown=V1_DEFAULT_IDLE if idle is None else idle)


@cache
def _offline_auth_class() -> type:
    from azureml.core.authentication import AbstractAuthentication  # noqa: PLC0415

    class OfflineAuthentication(AbstractAuthentication):  # type: ignore[misc]
        """Builds SDK objects; any call that would reach Azure says so instead of sending a fake token."""

        def __init__(self) -> None:
            super().__init__(cloud="AzureCloud")  # no cloud name: the SDK would read the Azure CLI's config

        def _refuse(self, *_: Any) -> Any:
            raise ConfigError("workspace", "an amlemu offline workspace cannot call the Azure ML service",
                              "submit to the emulator: `amlemu job convert FILE.py -o job.yml`, "
                              "then `amlemu job create -f job.yml`")

        _get_arm_token = _get_graph_token = _get_azureml_client_token = _refuse
        _get_all_subscription_ids = _get_workspace = _refuse

    return OfflineAuthentication


def offline_workspace(subscription_id: str, resource_group: str, workspace_name: str,
                      location: str = "westeurope") -> Any:
    """An azureml.core.Workspace made without the service, for building the seed's objects."""
    require_sdk()
    from azureml.core import Workspace  # noqa: PLC0415

    with quiet():
        return Workspace(subscription_id, resource_group, workspace_name, auth=_offline_auth_class()(),
                         _location=location, _disable_service_check=True)


def compute_target(workspace: Any, spec: ClusterSpec) -> Any:
    """An AmlCompute for `spec`, from the ARM resource the service would return: the v1 estimators
    take only AmlCompute/KubernetesCompute objects (not names) for node_count > 1."""
    require_sdk()
    from azureml._compute._util import convert_seconds_to_duration  # noqa: PLC0415
    from azureml.core.compute import AmlCompute  # noqa: PLC0415

    location = workspace._location or "westeurope"
    arm_id = (f"/subscriptions/{workspace.subscription_id}/resourceGroups/{workspace.resource_group}/providers/"
              f"Microsoft.MachineLearningServices/workspaces/{workspace.name}/computes/{spec.name}")
    scale = {"minNodeCount": spec.min_nodes, "maxNodeCount": spec.max_nodes,
             "nodeIdleTimeBeforeScaleDown": convert_seconds_to_duration(spec.idle_seconds_before_scaledown)}
    resource = {
        "id": arm_id, "name": spec.name, "location": location, "tags": None,
        "properties": {
            "computeType": "AmlCompute", "computeLocation": location, "description": None,
            "resourceId": None, "provisioningState": "Succeeded", "provisioningErrors": None,
            "isAttachedCompute": False,
            "properties": {"vmSize": spec.vm_size, "scaleSettings": scale, "subnet": None,
                           "vmPriority": "LowPriority" if spec.vm_priority is Priority.LOW_PRIORITY else "Dedicated",
                           "allocationState": "Steady", "currentNodeCount": 0, "targetNodeCount": 0},
        },
    }
    with quiet():
        return AmlCompute.deserialize(workspace, resource)


# --- a user's submission script --------------------------------------------------------------------
def load_v1_file(path: Path, variable: str | None = None) -> Any:
    """The module-level ScriptRunConfig or estimator that a v1 submission script defines. The file runs
    as a module named amlemu_convert, so its `if __name__ == "__main__":` part (the submit) does not."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("FILE", f"{path} does not exist", "give the Python file that builds the ScriptRunConfig")
    namespace = _run(path)
    if variable:
        if variable not in namespace:
            raise ConfigError("--variable", f"{path} defines no '{variable}' at module level",
                              f"defined job configurations: {', '.join(_configs(namespace)) or 'none'}")
        if not is_job_config(namespace[variable]):
            raise ConfigError("--variable", f"'{variable}' is a {type(namespace[variable]).__name__}",
                              "name a ScriptRunConfig or an azureml.train estimator")
        return namespace[variable]
    found = _configs(namespace)
    if not found:
        raise ConfigError(str(path), "defines no ScriptRunConfig or estimator at module level",
                          "define it at module level (src = ScriptRunConfig(...)) and guard the submission with "
                          '`if __name__ == "__main__":`')
    if len(found) > 1:
        raise ConfigError(str(path), f"defines several job configurations: {', '.join(found)}",
                          "pass --variable NAME")
    return namespace[found[0]]


def _configs(namespace: dict[str, Any]) -> list[str]:
    return [name for name, value in namespace.items() if not name.startswith("__") and is_job_config(value)]


def _run(path: Path) -> dict[str, Any]:
    # As `python FILE` would: its folder first on sys.path, argv of its own; its prints go to stderr
    # so that they cannot mix with the YAML on stdout.
    saved_path, saved_argv = list(sys.path), list(sys.argv)
    sys.path.insert(0, str(path.resolve().parent))
    sys.argv = [str(path)]
    try:
        with quiet(), contextlib.redirect_stdout(sys.stderr):
            return runpy.run_path(str(path), run_name="amlemu_convert")
    except ImportError as exc:
        if (exc.name or "").split(".")[0] == "azureml":
            require_sdk()  # raises the install hint when azureml-core itself is missing
            raise ConfigError(str(path), f"imports {exc.name}, which is not installed",
                              "pip install 'amlemu[sdk1]'") from None
        raise _failed(path, exc) from None
    except Exception as exc:  # the user's code: one line naming where it failed, not a traceback
        raise _failed(path, exc) from None
    finally:
        sys.path[:], sys.argv = saved_path, saved_argv


def _failed(path: Path, exc: BaseException) -> ConfigError:
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path.resolve()]
    where = f"{path}:{lines[-1]}" if lines else str(path)
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return ConfigError(where, f"running it failed: {type(exc).__name__}: {message}",
                       "keep only building the configuration at module level; put Workspace.from_config(), "
                       'Experiment(...) and .submit() under `if __name__ == "__main__":`')
