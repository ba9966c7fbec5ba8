"""Azure ML's naming rules, in one place: job names, datastore names, workspace fields and the
environment variables a job may set. Each check raises ConfigError naming the field and the fix.
"""
from __future__ import annotations

import os
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
# Experiment names: "must be 1-256 characters, start with a letter or a number, and can only contain
# letters, numbers, underscores, and dashes" (the service's 400); runs' DisplayName: 256 characters
# (Azure ML's service limits page).
EXPERIMENT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,255}$")
DISPLAY_NAME_MAX = 256
# Asset (environment) names and versions: the resource-name rule, with '.' as Azure's own curated
# names have it (AzureML-sklearn-1.0-ubuntu20.04-py38-cpu); a letter or digit first, so never '..'.
ASSET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")
# A Docker image reference, by the distribution/reference grammar: [domain[:port]/]path[:tag][@digest],
# path components lower-case alphanumerics joined by '.', '_', '__' or '-'s; a name of at most 255.
# The first component is a registry only when it looks like one (a '.', a port, localhost), as the
# engine splits it; otherwise it is part of the lower-case path (UPPER/x is refused, as docker does).
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
IMAGE_DOMAIN_RE = re.compile(rf"^(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]+\])(?::[0-9]+)?$")
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_PATH_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
IMAGE_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
IMAGE_DIGEST_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}$")
IMAGE_NAME_MAX = 255
# Machine names (`amlemu machine add`): a DNS label, lower case (hostnames compare so), at most 32
# characters so that it can prefix node and network names; `all` is what --machines takes for every one.
MACHINE_NAME_RE = re.compile(r"^[a-z](?:[a-z0-9-]{0,30}[a-z0-9])?$")
MACHINES_ALL = "all"
# One process-environment string ("NAME=value") longer than this is refused by Linux's exec
# (MAX_ARG_STRLEN): the job would fail at launch with E2BIG, so it is refused at submission.
ENV_ENTRY_MAX = 128 * 1024 - 1

# Variables the platform sets on every node and a job must not: they wire the ranks together
# (MASTER_*, RANK, WORLD_SIZE, Open MPI's OMPI_/PMIX_), say which run and workspace a process
# belongs to (AZUREML_*, AZ_BATCH*, MLflow's), or steer the emulator itself (AMLEMU_*). A job
# that set one would break its own launch or pass for another run. Everything else (PATH,
# OMP_NUM_THREADS, NCCL_*, the data runtime's DATASET_MOUNT_*) stays the job's to set.
PLATFORM_VARIABLE_PREFIXES = ("AZUREML_", "AZ_BATCH", "OMPI_", "PMIX_", "AMLEMU_")
# ...but for the emulator's choices a job may make (read by the emulator, not the job): prefetch its
# ro_mount inputs (runs/datamounts.py), how the data runtime serves them (docs/dataruntime.md).
JOB_CHOICES = frozenset({"AMLEMU_DATA_PREFETCH", "AMLEMU_DATASET_MOUNT_PLACEHOLDERS",
                         "AMLEMU_DATASET_MOUNT_PLACEHOLDER_MAX_FILES"})
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
    if not isinstance(name, str) or not JOB_NAME_RE.fullmatch(name):
        raise ConfigError(field, f"{_shown(str(name))} is not a valid job name",
                          "use 1-255 letters, digits, '_' or '-', starting with a letter or digit "
                          "(or leave name out for a generated one)")
    return name


def check_experiment_name(name: Any, field: str = "experiment_name") -> str:
    if not isinstance(name, str) or not EXPERIMENT_NAME_RE.fullmatch(name):
        raise ConfigError(field, f"{_shown(str(name))} is not a valid experiment name",
                          "use 1-256 letters, digits, '_' or '-', starting with a letter or digit")
    return name


def default_experiment_name(folder: str) -> str:
    """The experiment a job without experiment_name goes to: a folder's name (Azure ML's rule: the
    working directory's, cwd_experiment_name), with what an experiment name cannot hold made '_'
    (never a refused default); "Default" (Azure ML's own) when nothing of it is left."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", folder)[:256].lstrip("_-")
    return name if EXPERIMENT_NAME_RE.fullmatch(name) else "Default"


def cwd_experiment_name() -> str:
    """Azure ML's default experiment: the name of the working directory the job is created from."""
    try:
        return default_experiment_name(os.path.basename(os.getcwd()))
    except OSError:  # the working directory was removed under us
        return "Default"


def check_display_name(name: Any, field: str = "display_name") -> str | None:
    if name is None:
        return None
    if not isinstance(name, (str, int, float)) or isinstance(name, bool):
        raise ConfigError(field, f"must be text, got a {type(name).__name__}", "quote it as a string")
    text = str(name)
    if len(text) > DISPLAY_NAME_MAX or "\0" in text:
        raise ConfigError(field, f"{_shown(text)} is not a display name",
                          f"use at most {DISPLAY_NAME_MAX} characters, without NUL (Azure ML's limit)")
    return text


def check_asset_name(value: Any, field: str, kind: str = "name") -> str:
    """An environment's name or version, as Azure ML registers them (never a path, a tag or a line)."""
    text = "" if value is None else str(value)
    if not ASSET_RE.fullmatch(text):
        raise ConfigError(field, f"{_shown(text)} is not a valid environment {kind}",
                          "use 1-255 letters, digits, '.', '_' or '-', starting with a letter or digit")
    return text


def check_image_reference(ref: Any, field: str = "environment.image") -> str:
    """A Docker image reference as the engine parses it ([registry/]name[:tag][@digest]); anything
    else is refused here, with the field named, rather than by the engine at submit."""
    text = ref if isinstance(ref, str) else str(ref)
    rest, at, digest = text.partition("@")
    name, colon, tag = rest, "", ""
    if ":" in rest.rsplit("/", 1)[-1]:  # a ':' after the last '/' is the tag's; before it, a port's
        name, colon, tag = rest.rpartition(":")
    first, slash, path = name.partition("/")
    if not (slash and ("." in first or ":" in first or first == "localhost")):
        first, path = "", name  # no registry: the whole name is the path
    valid = ((not first or IMAGE_DOMAIN_RE.fullmatch(first)) and IMAGE_PATH_RE.fullmatch(path) and len(name) <= IMAGE_NAME_MAX
             and (not colon or IMAGE_TAG_RE.fullmatch(tag)) and (not at or IMAGE_DIGEST_RE.fullmatch(digest)))
    if not valid:
        raise ConfigError(field, f"{_shown(text)} is not an image reference",
                          "write registry/name:tag or name@sha256:<hex> (a lower-case name of at most 255 "
                          "characters), e.g. mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04:latest")
    return text


def check_machine_name(name: Any, field: str = "name") -> str:
    if not isinstance(name, str) or not MACHINE_NAME_RE.fullmatch(name) or name == MACHINES_ALL:
        raise ConfigError(field, f"{_shown(str(name))} is not a valid machine name",
                          "use 1-32 lower-case letters, digits or '-', starting with a letter (not 'all')")
    return name


def check_datastore_name(name: str) -> str:
    if not DATASTORE_NAME_RE.fullmatch(name):
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
        if not isinstance(key, str) or not ENV_NAME_RE.fullmatch(name):
            raise ConfigError(field, "is not a valid variable name",
                              "use letters, digits and '_', not starting with a digit (e.g. MY_SETTING)")
        if name in PLATFORM_VARIABLES or (name.startswith(PLATFORM_VARIABLE_PREFIXES) and name not in JOB_CHOICES):
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
    if not pattern.fullmatch(value):
        raise ConfigError(f"--{key.replace('_', '-')}" if key != "workspace_name" else "--name",
                          f"{_shown(value)} {problem}", fix)
    return value


# What a terminal acts on rather than shows: C0 and C1 controls, DEL, and the bidirectional
# overrides (U+202E turns the rest of a line around). Names come from users and from jobs; the CLI
# prints these as escapes (\x1b, \u202e), never raw.
_BIDI = "\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
UNSAFE = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}]")
UNSAFE_KEEPING_LINES = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]")  # a human form's own line breaks
UNSAFE_IN_JSON = re.compile(f"[\x7f-\x9f{_BIDI}]")  # json.dumps escapes the C0 controls itself


def _escape(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escaped(text: str, pattern: re.Pattern[str] = UNSAFE) -> str:
    """`text` with every character a terminal would act on written as an escape."""
    return pattern.sub(_escape, text)
