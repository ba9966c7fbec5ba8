"""A command component (`type: command` component YAML, as az ml reads it: azure-ai-ml's
CommandComponentSchema and its port and parameter schemas), pure data: its typed inputs (defaults,
optional, min/max, enum), outputs, command, code, environment and run settings. Each bad field is
refused with one line naming it. A step runs it as a command job (pipelines/componentjob.py); its
command's optional parts are pipelines/componentcmd.py's. No I/O but reading the YAML and, as a
command job's reader does, checking that its code folder and script exist.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from amlemu import safeyaml
from amlemu.errors import ConfigError
from amlemu.jobs.gitcode import is_git
from amlemu.names import ASSET_RE, check_display_name
from amlemu.pipelines.componentcmd import check_command, render_command  # noqa: F401 - re-exported
from amlemu.pipelines.componentjob import component_job, to_job_dict  # noqa: F401 - re-exported
from amlemu.pipelines.porttypes import (
    INPUT_MODES,
    INPUT_TYPES,
    OUTPUT_MODES,
    PARAM_TYPES,
    PORT_TYPES,
    RESERVED_NAMES,
    check_value,
    coerce,
)

FIELDS = {"$schema", "type", "name", "version", "display_name", "description", "tags", "properties",
          "is_deterministic", "inputs", "outputs", "code", "environment", "command", "distribution", "resources",
          "environment_variables", "queue_settings"}
NOT_EMULATED = {"additional_includes": "copy the files into the code folder"}
INPUT_FIELDS = {"type", "description", "optional", "default", "min", "max", "enum", "mode"}
OUTPUT_FIELDS = {"type", "description", "mode"}
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,254}$")  # Azure ML's component name
PORT_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # an input's or output's (a Python identifier)
PLACEHOLDER_URI = "azureml://datastores/workspaceblobstore/paths/amlemu-component-check/"


@dataclass(frozen=True)
class ComponentInput:
    type: str  # PARAM_TYPES (a literal) or PORT_TYPES (data)
    default: str | int | float | bool | None = None
    optional: bool = False
    description: str | None = None
    min: int | float | None = None
    max: int | float | None = None
    enum: tuple[str, ...] = ()
    mode: str | None = None  # a data input's (ro_mount, download, direct); None: the job's default


@dataclass(frozen=True)
class ComponentOutput:
    type: str  # PORT_TYPES
    mode: str | None = None  # rw_mount, upload, direct; None: the job's default
    description: str | None = None


@dataclass(frozen=True)
class ComponentSpec:
    command: str
    environment: str | dict[str, Any] | None  # as written (an inline one's file paths made absolute)
    inputs: dict[str, ComponentInput] = field(default_factory=dict)
    outputs: dict[str, ComponentOutput] = field(default_factory=dict)
    name: str | None = None  # None: an inline (anonymous) component
    version: str | None = None
    display_name: str | None = None
    description: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)
    is_deterministic: bool = True
    code: str | None = None  # an absolute folder, or a git URL as written
    distribution: dict[str, Any] | None = None
    resources: dict[str, Any] | None = None
    environment_variables: dict[str, str] = field(default_factory=dict)
    queue_settings: dict[str, Any] | None = None
    base_dir: str = "."  # the YAML's folder
    schema: str | None = None

    @property
    def label(self) -> str:
        """How errors name it: name:version, or 'inline'."""
        return f"{self.name}:{self.version}" if self.name and self.version else self.name or "inline"

    def to_dict(self) -> dict[str, Any]:
        """As az ml's component YAML has it (what is registered and shown); None fields left out."""
        data = {"$schema": self.schema, "type": "command", "name": self.name, "version": self.version,
                "display_name": self.display_name, "description": self.description, "tags": dict(self.tags),
                "properties": dict(self.properties), "is_deterministic": self.is_deterministic,
                "inputs": {n: _port_dict(asdict(p)) for n, p in self.inputs.items()},
                "outputs": {n: _port_dict(asdict(p)) for n, p in self.outputs.items()},
                "code": self.code, "environment": self.environment, "command": self.command,
                "distribution": self.distribution, "resources": self.resources,
                "environment_variables": dict(self.environment_variables), "queue_settings": self.queue_settings}
        return {k: v for k, v in data.items() if v is not None and v != {} or k in ("inputs", "outputs")}


def _port_dict(port: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in port.items()
            if v is not None and v != () and not (k == "optional" and v is False)}


def _mapping(value: Any, field_name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(field_name, f"must be a mapping, got {type(value).__name__}")
    return value


def _text(value: Any, field_name: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(field_name, f"must be text, got {type(value).__name__}")
    return str(value)


def _bool(value: Any, field_name: str, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(field_name, f"{value!r:.40} is not a boolean", "write true or false")
    return value


def _port_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not PORT_NAME_RE.fullmatch(name):
        raise ConfigError(f"{where}.{name}", "is not a valid name", "use letters, digits and '_', not starting "
                          "with a digit")
    if name.lower() in RESERVED_NAMES:
        raise ConfigError(f"{where}.{name}", "is a name Azure ML reserves", f"rename it (reserved: "
                          f"{', '.join(RESERVED_NAMES)})")
    return name


def _bound(kind: str, value: Any, field_name: str) -> int | float | None:
    if value is None:
        return None
    if kind not in ("integer", "number"):
        raise ConfigError(field_name, f"only an integer or number input has {field_name.rsplit('.', 1)[1]}",
                          "remove it, or change the input's type")
    return coerce(kind, value, field_name)  # type: ignore[return-value]


def _input(name: str, data: Any) -> ComponentInput:
    where = f"inputs.{name}"
    data = _mapping(data, where)
    unknown = sorted(set(data) - INPUT_FIELDS)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}", "unknown field", f"known fields: {', '.join(sorted(INPUT_FIELDS))}")
    kind = data.get("type")
    if kind not in INPUT_TYPES:
        raise ConfigError(f"{where}.type", "missing" if kind is None else f"{kind!r:.40} is not an input type",
                          f"use one of: {', '.join(INPUT_TYPES)}")
    low, high = _bound(kind, data.get("min"), f"{where}.min"), _bound(kind, data.get("max"), f"{where}.max")
    if low is not None and high is not None and low > high:
        raise ConfigError(f"{where}.min", f"{low} is above max {high}", "swap them")
    enum = data.get("enum")
    if enum is not None and (kind != "string" or not isinstance(enum, list) or not enum):
        raise ConfigError(f"{where}.enum", "only a string input has an enum: a list of its allowed values",
                          "write enum: [a, b], or remove it")
    enum_values = tuple(coerce("string", v, f"{where}.enum") for v in enum or ())
    default = data.get("default")
    if default is not None and kind in PORT_TYPES:
        raise ConfigError(f"{where}.default", f"a {kind} input has no default", "remove it; bind the input where "
                          "the component is used")
    if default is not None:
        default = check_value(name, kind, default, low=low, high=high, enum=enum_values, field=f"{where}.default")
    mode = _text(data.get("mode"), f"{where}.mode")
    if mode is not None and (kind in PARAM_TYPES or mode not in INPUT_MODES):
        raise ConfigError(f"{where}.mode", f"{mode!r:.40} is not a mode a {kind} input has here",
                          f"use one of: {', '.join(INPUT_MODES)}" if kind in PORT_TYPES else "remove it")
    return ComponentInput(kind, default, _bool(data.get("optional"), f"{where}.optional", False),
                          _text(data.get("description"), f"{where}.description"), low, high, enum_values, mode)


def _output(name: str, data: Any) -> ComponentOutput:
    where = f"outputs.{name}"
    data = _mapping(data, where)
    unknown = sorted(set(data) - OUTPUT_FIELDS)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}", "unknown field", f"known fields: {', '.join(sorted(OUTPUT_FIELDS))}")
    kind = data.get("type")
    if kind in PARAM_TYPES:
        raise ConfigError(f"{where}.type", f"a {kind} output (a primitive output) is not emulated",
                          "write the value to a uri_file output and read it in the next step")
    if kind not in PORT_TYPES:
        raise ConfigError(f"{where}.type", "missing" if kind is None else f"{kind!r:.40} is not an output type",
                          f"use one of: {', '.join(PORT_TYPES)}")
    mode = _text(data.get("mode"), f"{where}.mode")
    if mode is not None and mode not in OUTPUT_MODES:
        raise ConfigError(f"{where}.mode", f"{mode!r:.40} is not an output mode here", f"use one of: "
                          f"{', '.join(OUTPUT_MODES)}")
    return ComponentOutput(kind, mode, _text(data.get("description"), f"{where}.description"))


def _code(code: Any, base_dir: Path) -> str | None:
    """The code folder made absolute (a registered component keeps pointing at it), a git URL as
    it is; job_from_dict checks that it exists."""
    if code is None or is_git(code):
        return None if code is None else str(code)
    text = _text(code, "code")
    return str((base_dir / str(text)).expanduser().resolve())


def _environment(env: Any, base_dir: Path) -> str | dict[str, Any]:
    """As written; an inline one's conda_file and build.path made absolute, so that the step's job
    reads them from wherever the pipeline is."""
    if env is None or (isinstance(env, str) and not env.strip()):
        raise ConfigError("environment", "missing", "give the component's environment (azureml:<name>@latest, "
                          "azureml:<name>:<version>, or inline: image: ...)")
    if isinstance(env, str):
        return env.strip()
    env = dict(_mapping(env, "environment"))
    if isinstance(env.get("conda_file"), str):
        env["conda_file"] = str((base_dir / env["conda_file"]).expanduser().resolve())
    if isinstance(env.get("build"), dict) and isinstance(env["build"].get("path"), str) and \
            "://" not in env["build"]["path"]:
        env["build"] = {**env["build"], "path": str((base_dir / env["build"]["path"]).expanduser().resolve())}
    return env


def _identity(data: dict[str, Any], inline: bool) -> tuple[str | None, str | None]:
    """(name, version); an inline component has neither (az ml ignores them there)."""
    if inline:
        return None, None
    name = data.get("name")
    if name is None:
        raise ConfigError("name", "missing", "give the component a name (lower-case letters, digits and '_')")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ConfigError("name", f"{name!r:.60} is not a component name", "use lower-case letters, digits and '_', "
                          "starting with a letter (at most 255)")
    version = _text(data.get("version"), "version")
    if version is not None and not ASSET_RE.fullmatch(version):
        raise ConfigError("version", f"{version!r:.60} is not a version", "use 1-255 letters, digits, '.', '_' or '-', "
                          "starting with a letter or digit")
    return name, version


def _check_fields(data: dict[str, Any]) -> None:
    if data.get("type", "command") != "command":
        raise ConfigError("type", f"{data['type']!r:.40} components are not emulated", "use type: command")
    for key, fix in NOT_EMULATED.items():
        if key in data:
            raise ConfigError(key, "is not emulated", fix)
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise ConfigError(unknown[0], "unknown field", f"a command component's fields: {', '.join(sorted(FIELDS))}")


def component_from_dict(data: Any, base_dir: Path, *, inline: bool = False) -> ComponentSpec:
    """az ml's command component YAML (a file's, an inline one's, a registered one's) -> ComponentSpec.
    `inline`: a pipeline step's own component, without name and version."""
    if not isinstance(data, dict):
        raise ConfigError("component", "the component YAML must be a mapping of fields", "see az ml's "
                          "commandComponent schema: name, type: command, inputs, outputs, command, environment")
    _check_fields(data)
    name, version = _identity(data, inline)
    command = data.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ConfigError("command", "missing", "give the command the component runs")
    inputs = {_port_name(n, "inputs"): _input(n, v) for n, v in _mapping(data.get("inputs"), "inputs").items()}
    outputs = {_port_name(n, "outputs"): _output(n, v) for n, v in _mapping(data.get("outputs"), "outputs").items()}
    both = sorted(set(inputs) & set(outputs))
    if both:
        raise ConfigError(f"outputs.{both[0]}", "an input has this name too", "give inputs and outputs distinct names")
    check_command(command, inputs, outputs)
    spec = ComponentSpec(
        command=command, environment=_environment(data.get("environment"), base_dir), inputs=inputs,
        outputs=outputs, name=name, version=version, display_name=check_display_name(data.get("display_name")),
        description=_text(data.get("description"), "description"),
        tags={str(k): str(v) for k, v in _mapping(data.get("tags"), "tags").items()},
        properties=dict(_mapping(data.get("properties"), "properties")),
        is_deterministic=_bool(data.get("is_deterministic"), "is_deterministic", True),
        code=_code(data.get("code"), base_dir), distribution=_mapping(data.get("distribution"), "distribution") or None,
        resources=_mapping(data.get("resources"), "resources") or None,
        environment_variables=dict(_mapping(data.get("environment_variables"), "environment_variables")),
        queue_settings=_mapping(data.get("queue_settings"), "queue_settings") or None,
        base_dir=str(base_dir.resolve()), schema=_text(data.get("$schema"), "$schema"))
    _check_as_job(spec)
    return spec


def _check_as_job(spec: ComponentSpec) -> None:
    """The component as the command job it runs, every optional part kept and each input a
    placeholder: the command job's reader checks code, script, environment, distribution and
    resources, with the same field names."""
    component_job(spec, {n: _placeholder(p) for n, p in spec.inputs.items()}, {}, base_dir=Path(spec.base_dir))


def _placeholder(port: ComponentInput) -> Any:
    """A value the input accepts (its default, else one its type, range and enum allow)."""
    if port.type in PORT_TYPES:
        return PLACEHOLDER_URI
    if port.default is not None:
        return port.default
    known = [v for v in (*port.enum[:1], port.min, port.max) if v is not None]
    return known[0] if known else {"boolean": True, "string": "x"}.get(port.type, 1)


def load_component(path: str | Path) -> ComponentSpec:
    """A component YAML file (`az ml component create -f`, a step's `component: ./train.yml`)."""
    path = Path(path)
    return component_from_dict(safeyaml.load_file(path, "-f", "component YAML"), base_dir=path.parent)


def component_from_record(record: dict[str, Any]) -> ComponentSpec:
    """A registered component (its to_dict() and base_dir, as the registry stores it)."""
    data = {k: v for k, v in record.items() if k in FIELDS}
    return component_from_dict(data, base_dir=Path(record.get("base_dir") or "."))
