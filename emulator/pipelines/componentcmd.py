"""A component's command: its `${{inputs.x}}` / `${{outputs.y}}` bindings and its `$[[...]]`
optional parts, checked and rendered by Azure ML's documented rules (the command component
reference and "Define optional inputs"):

- an optional input goes inside a `$[[...]]` part, and only optional inputs go there (the
  service refuses "optional input x must be placed in nested argument: $[[]]", and an output or
  a required input inside one);
- a part is kept, without its `$[[` and `]]`, when every input it names has a value (given, or
  its default); it is dropped, whole, when one of them has none;
- `\\` at a line's end does not continue the command (Azure ML does not support it).

Pure: no I/O.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from amlemu.errors import ConfigError
from amlemu.jobs.jobyaml import BINDING_RE

if TYPE_CHECKING:
    from amlemu.pipelines.component import ComponentSpec

OPEN, CLOSE = "$[[", "]]"


def split_parts(command: str) -> list[tuple[str, bool]]:
    """The command as (text, optional) pieces in order; the optional ones without `$[[` / `]]`."""
    parts: list[tuple[str, bool]] = []
    at = 0
    while (start := command.find(OPEN, at)) >= 0:
        end = command.find(CLOSE, start + len(OPEN))
        if end < 0:
            raise ConfigError("command", f"the $[[ at character {start} is never closed",
                              "close each optional part with ]]: $[[--x ${{inputs.x}}]]")
        inner = command[start + len(OPEN):end]
        if OPEN in inner:
            raise ConfigError("command", "a $[[...]] part inside another is not supported",
                              "write each optional part on its own: $[[--a ${{inputs.a}}]] $[[--b ${{inputs.b}}]]")
        parts += [(command[at:start], False), (inner, True)]
        at = end + len(CLOSE)
    parts.append((command[at:], False))
    return [(text, optional) for text, optional in parts if text or optional]


def _refs(text: str) -> list[tuple[str, str, str]]:
    """(inputs|outputs|<other>, name, the whole reference) for each ${{...}} in `text`."""
    return [(*m.group(1).partition(".")[::2], m.group(1)) for m in BINDING_RE.finditer(text)]


def _check_ref(kind: str, name: str, ref: str, in_part: bool, inputs: Mapping[str, Any],
               outputs: Mapping[str, Any]) -> None:
    declared = {"inputs": inputs, "outputs": outputs}
    if name not in declared.get(kind, {}):
        known = [f"{k}.{n}" for k, names in declared.items() for n in names]
        raise ConfigError("command", f"${{{{{ref}}}}} names no declared input or output",
                          f"declare it under inputs or outputs (known: {', '.join(known) or 'none'})")
    is_optional = kind == "inputs" and bool(inputs[name].optional)
    if in_part and not is_optional:
        what, fix = ("an output", "move it out of the optional part") if kind == "outputs" else \
            ("a required input", f"move it out of the optional part, or declare inputs.{name} optional: true")
        raise ConfigError("command", f"${{{{{ref}}}}} is {what} inside $[[...]]: only optional inputs can be "
                          "in $[[]]", fix)
    if not in_part and is_optional:
        raise ConfigError("command", f"optional input {name} must be placed in an optional part $[[...]]",
                          f"write $[[--{name} ${{{{inputs.{name}}}}}]], or make the input required")


def check_command(command: str, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> None:
    """Every binding names a declared input or output, optional inputs only inside `$[[...]]`
    and only they there. `inputs`: name -> an object with `.optional`."""
    if re.search(r"\\[ \t]*\r?\n", command):
        raise ConfigError("command", "a '\\' at the end of a line: Azure ML does not support continuing the "
                          "command's lines", "remove the '\\' (YAML's folded style, command: >-, joins the lines)")
    for text, in_part in split_parts(command):
        for kind, name, ref in _refs(text):
            _check_ref(kind, name, ref, in_part, inputs, outputs)


def effective_values(component: ComponentSpec, values: Mapping[str, Any]) -> dict[str, Any]:
    """Each input's value: the one given, else its default; an input with neither is absent. A
    value for an input the component does not declare, or none for a required one, is refused."""
    unknown = sorted(set(values) - set(component.inputs))
    if unknown:
        raise ConfigError(f"inputs.{unknown[0]}", f"the component {component.label} has no input named "
                          f"{unknown[0]}", f"its inputs: {', '.join(component.inputs) or 'none'}")
    found = {}
    for name, port in component.inputs.items():
        value = values.get(name)
        value = port.default if value is None else value
        if value is None and not port.optional:
            raise ConfigError(f"inputs.{name}", "a required input has no value",
                              f"give inputs.{name} a value (the component {component.label} has no default for it)")
        if value is not None:
            found[name] = value
    return found


def render_command(component: ComponentSpec, values: Mapping[str, Any]) -> str:
    """The command a step runs, given its inputs' values (name -> value; None or absent: not
    given): each `$[[...]]` part kept without its brackets when every input it names has a value
    (given or default), dropped when one has none; `${{inputs.x}}` / `${{outputs.y}}` stay for
    the command job to bind (a literal by its value, data by its path on the node), as a command
    job has them. A required input without a value is refused (one line naming inputs.x)."""
    present = effective_values(component, values)
    kept = []
    for text, optional in split_parts(component.command):
        if optional and any(kind == "inputs" and name not in present for kind, name, _ in _refs(text)):
            continue
        kept.append(text)
    return "".join(kept)
