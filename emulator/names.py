"""Azure ML's naming rules, in one place: job names, datastore names, workspace fields and the
environment variables a job may set. Each check raises ConfigError naming the field and the fix.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from amlemu.errors import ConfigError

# Azure ML resource names (jobs included): the ARM pattern ^[a-zA-Z0-9][a-zA-Z0-9\-_]{0,254}$.
JOB_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,254}$")
# "Datastore name ... can only contain alphanumeric characters and underscores" (Azure ML docs).
DATASTORE_NAME_RE = re.compile(r"^[A-Za-z0-9_]{1,255}$")
GUID_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
WORKSPACE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{2,32}$")  # 3-33 characters
RESOURCE_GROUP_RE = re.compile(r"^[-\w.()]{0,89}[-\w()]$")  # 1-90 characters, no trailing period
LOCATION_RE = re.compile(r"^[A-Za-z0-9]{1,64}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# One process-environment string ("NAME=value") longer than this is refused by Linux's exec
# (MAX_ARG_STRLEN): the job would fail at launch with E2BIG, so it is refused at submission.
ENV_ENTRY_MAX = 128 * 1024 - 1

# Variables the platform sets on every node and a job must not: they wire the ranks together
# (MASTER_*, RANK, WORLD_SIZE, Open MPI's OMPI_/PMIX_), say which run and workspace a process
# belongs to (AZUREML_*, AZ_BATCH*, MLflow's), or steer the emulator itself (AMLEMU_*). A job
# that set one would break its own launch or pass for another run. Everything else (PATH,
# OMP_NUM_THREADS, NCCL_*, the data runtime's DATASET_MOUNT_*) stays the job's to set.
PLATFORM_VARIABLE_PREFIXES = ("AZUREML_", "AZ_BATCH", "OMPI_", "PMIX_", "AMLEMU_")
PLATFORM_VARIABLES = frozenset({"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK",
                                "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID"})


def _shown(value: str) -> str:
    """A user's string as one short printable line (a newline in a name must not split the error)."""
    if len(value) > 64:
        return f"{_shown(value[:40])}... ({len(value)} characters)"
    return value if value.isprintable() and value.strip() == value and value else repr(value)


def check_job_name(name: Any, field: str = "name") -> str | None:
    if name is None:
        return None
    if not isinstance(name, str) or not JOB_NAME_RE.match(name):
        raise ConfigError(field, f"{_shown(str(name))} is not a valid job name",
                          "use 1-255 letters, digits, '_' or '-', starting with a letter or digit "
                          "(or leave name out for a generated one)")
    return name


def check_datastore_name(name: str) -> str:
    if not DATASTORE_NAME_RE.match(name):
        raise ConfigError("name", f"{_shown(name)} is not a valid datastore name",
                          "use letters, digits and underscores only (at most 255)")
    return name


def check_environment_variables(env: Mapping[Any, Any]) -> dict[str, str]:
    """The job's `environment_variables` -> {name: value}; a name no shell could export, or one
    the platform owns, is refused here rather than dropped or failing on the node."""
    checked: dict[str, str] = {}
    for key, raw in env.items():
        name = key if isinstance(key, str) else str(key)
        field = f"environment_variables.{_shown(name)}"
        if not isinstance(key, str) or not ENV_NAME_RE.match(name):
            raise ConfigError(field, "is not a valid variable name",
                              "use letters, digits and '_', not starting with a digit (e.g. MY_SETTING)")
        if name in PLATFORM_VARIABLES or name.startswith(PLATFORM_VARIABLE_PREFIXES):
            raise ConfigError(field, "is set by the platform on every node",
                              "remove it (the job may not override it) or use a name of your own")
        if isinstance(raw, (dict, list)):
            raise ConfigError(field, f"must be a single value, got a {type(raw).__name__}", "quote it as a string")
        value = "" if raw is None else str(raw)
        if "\0" in value:
            raise ConfigError(field, "contains a NUL character, which no environment can hold", "remove it")
        if len(name) + 1 + len(value.encode()) > ENV_ENTRY_MAX:
            raise ConfigError(field, f"is {len(value.encode())} bytes; a process's variable holds at most "
                              f"{ENV_ENTRY_MAX} bytes", "pass large data as an input file instead")
        checked[name] = value
    return checked


def check_workspace_field(key: str, value: str) -> str:
    rules = {
        "subscription_id": (GUID_RE, "is not a subscription id",
                            "give the GUID, e.g. 00000000-0000-0000-0000-000000000000"),
        "workspace_name": (WORKSPACE_NAME_RE, "is not a valid workspace name",
                           "use 3-33 letters, digits, '_' or '-', starting with a letter or digit"),
        "resource_group": (RESOURCE_GROUP_RE, "is not a valid resource group name",
                           "use 1-90 letters, digits, '_', '-', '.', '(' or ')', not ending in '.'"),
        "location": (LOCATION_RE, "is not a location", "give an Azure region name, e.g. westeurope"),
    }
    pattern, problem, fix = rules[key]
    if not pattern.match(value):
        raise ConfigError(f"--{key.replace('_', '-')}" if key != "workspace_name" else "--name",
                          f"{_shown(value)} {problem}", fix)
    return value
