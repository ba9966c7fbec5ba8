"""What a pipeline step's input or output is bound to, as az ml writes it: `${{parent.inputs.x}}`,
`${{parent.jobs.<step>.outputs.<o>}}`, `${{parent.outputs.<o>}}` (and the older spellings without
`parent.`, which azure-ai-ml still reads), a string with pipeline inputs inside it, or a literal.
Pure data and parsing; no I/O.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Union

from amlemu.errors import ConfigError

# One binding expression; azure-ai-ml's ComponentJobConstants (INPUT_PATTERN, OUTPUT_PATTERN and the
# LEGACY_ ones) accept `parent.` as optional, so both spellings are read.
_EXPR = re.compile(r"\$\{\{\s*([^{}]*?)\s*\}\}")
_PARENT_INPUT = re.compile(r"^(?:parent\.)?inputs\.([A-Za-z_][\w]*)$")
_STEP_OUTPUT = re.compile(r"^(?:parent\.)?jobs\.([A-Za-z_][\w-]*)\.outputs\.([A-Za-z_][\w]*)$")
_PARENT_OUTPUT = re.compile(r"^(?:parent\.)?outputs\.([A-Za-z_][\w]*)$")
DATA_TYPES = ("uri_file", "uri_folder", "mltable", "custom_model", "mlflow_model", "triton_model")
PRIMITIVE_TYPES = ("string", "number", "integer", "boolean")
# Fields of a step's output as azure-ai-ml's OutputSchema has them.
OUTPUT_FIELDS = {"type", "path", "mode", "description", "name", "version", "is_control", "early_available"}


@dataclass(frozen=True)
class ParentInput:
    """`${{parent.inputs.<name>}}`: the pipeline's input."""
    name: str


@dataclass(frozen=True)
class StepOutputRef:
    """`${{parent.jobs.<step>.outputs.<output>}}`: another step's output; the edge of the graph."""
    step: str
    output: str


@dataclass(frozen=True)
class Template:
    """A string with pipeline inputs inside other text (`--lr=${{parent.inputs.lr}}`): a parameter."""
    text: str
    names: tuple[str, ...]

    def render(self, values: dict[str, Any]) -> str:
        def value(match: re.Match[str]) -> str:
            name = _PARENT_INPUT.match(match.group(1))
            return str(values[name.group(1)]) if name else match.group(0)

        return _EXPR.sub(value, self.text)


@dataclass(frozen=True)
class Literal:
    """A value written in place: a number, string or boolean, or a data input's mapping (type, path, mode)."""
    value: Any


Binding = Union[ParentInput, StepOutputRef, Template, Literal]


@dataclass(frozen=True)
class StepInput:
    binding: Binding
    mode: str | None = None  # a bound input's own mode (`{path: ${{parent...}}, mode: download}`)
    type: str | None = None  # the type written at the step, if any

    @property
    def data_type(self) -> str | None:
        """The type this input is written with: its own, or its literal data input's."""
        if self.type:
            return self.type
        if isinstance(self.binding, Literal) and isinstance(self.binding.value, dict):
            return str(self.binding.value.get("type", "uri_folder"))
        return None


@dataclass(frozen=True)
class StepOutput:
    """A step's output: where it goes (`path`, or bound up to the pipeline's output `parent`), its
    type and mode; none of them set means Azure ML's default (a uri_folder at the default path)."""
    type: str | None = None
    mode: str | None = None
    path: str | None = None
    parent: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # name, version, description: passed on as written


def _expression(text: str) -> str | None:
    """The inside of `text` when it is exactly one `${{...}}`."""
    match = _EXPR.fullmatch(text.strip())
    return match.group(1) if match else None


def parse_input(value: Any, where: str) -> StepInput:
    """A step's input as written: a binding string, a mapping whose path is one, or a literal."""
    if isinstance(value, dict) and isinstance(value.get("path"), str) and _EXPR.search(value["path"]):
        bound = parse_input(value["path"], f"{where}.path")
        mode = value.get("mode")
        return StepInput(bound.binding, str(mode) if mode else None, check_type(value.get("type"), f"{where}.type"))
    if isinstance(value, dict):
        check_type(value.get("type"), f"{where}.type")
        return StepInput(Literal(dict(value)))
    if not isinstance(value, str) or not _EXPR.search(value):
        return StepInput(Literal(value))
    inner = _expression(value)
    if inner is not None:
        if match := _PARENT_INPUT.match(inner):
            return StepInput(ParentInput(match.group(1)))
        if match := _STEP_OUTPUT.match(inner):
            return StepInput(StepOutputRef(match.group(1), match.group(2)))
        if _PARENT_OUTPUT.match(inner):
            raise ConfigError(where, f"{value} is a pipeline output; an input reads a pipeline input or a step's output",
                              "write ${{parent.inputs.<name>}} or ${{parent.jobs.<step>.outputs.<name>}}")
    names = []
    for expr in _EXPR.findall(value):
        match = _PARENT_INPUT.match(expr)
        if not match:
            raise ConfigError(where, f"${{{{{expr}}}}} is not a binding a step input can use inside text",
                              "write ${{parent.inputs.<name>}}, or bind the whole input to "
                              "${{parent.jobs.<step>.outputs.<name>}}")
        names.append(match.group(1))
    return StepInput(Template(value, tuple(names)))


def parse_output(value: Any, where: str) -> StepOutput:
    """A step's output as written: nothing (the default), `${{parent.outputs.<o>}}`, or a mapping."""
    if value is None:
        return StepOutput()
    if isinstance(value, str):
        inner = _expression(value)
        match = _PARENT_OUTPUT.match(inner) if inner is not None else None
        if not match:
            raise ConfigError(where, f"'{value}' is not an output binding",
                              "write ${{parent.outputs.<name>}}, a mapping (type, mode, path), or nothing")
        return StepOutput(parent=match.group(1))
    if not isinstance(value, dict):
        raise ConfigError(where, f"must be a mapping or ${{{{parent.outputs.<name>}}}}, got {type(value).__name__}")
    unknown = sorted(set(value) - OUTPUT_FIELDS)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}", "unknown field", f"known fields: {', '.join(sorted(OUTPUT_FIELDS))}")
    path, parent = value.get("path"), None
    inner = _expression(path) if isinstance(path, str) else None
    if inner is not None and _PARENT_OUTPUT.match(inner):  # bound up; a path with ${{name}} in it is a path
        parent, path = _PARENT_OUTPUT.match(inner).group(1), None  # type: ignore[union-attr]
    mode = value.get("mode")
    extra = {k: v for k, v in value.items() if k in ("name", "version", "description")}
    return StepOutput(check_type(value.get("type"), f"{where}.type"), str(mode) if mode else None,
                      str(path) if path else None, parent, extra)


def check_type(value: Any, where: str) -> str | None:
    if value is None:
        return None
    kind = str(value)
    if kind not in DATA_TYPES + PRIMITIVE_TYPES:
        raise ConfigError(where, f"'{kind}' is not an input or output type",
                          f"use one of: {', '.join(DATA_TYPES + PRIMITIVE_TYPES)}")
    return kind


def compatible(given: str | None, wanted: str | None) -> bool:
    """Whether a value of type `given` may feed an input of type `wanted`: the same data type (a
    model type, mltable, uri_file and uri_folder are each their own), or two primitive types (the
    value itself is checked against the input's type when the step runs); unknown on either side passes."""
    if not given or not wanted:
        return True
    if given in PRIMITIVE_TYPES and wanted in PRIMITIVE_TYPES:
        return True
    return given == wanted
