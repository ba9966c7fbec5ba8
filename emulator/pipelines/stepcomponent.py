"""A pipeline step's component: where it comes from (`component: ./train.yml`, `file:./train.yml`,
`azureml:<name>:<version>` / `@latest`, or inline), loaded through amlemu.pipelines.component, and
the types of its inputs and outputs, which the pipeline's bindings are checked against.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from amlemu import safeyaml
from amlemu.errors import ConfigError, NotFoundError

if TYPE_CHECKING:
    from amlemu.pipelines.pipelinespec import ComponentRef


def component_ref(value: Any, where: str, base_dir: Path) -> ComponentRef:
    from amlemu.pipelines.pipelinespec import ComponentRef

    if isinstance(value, dict):
        return ComponentRef("inline", "", str(base_dir))
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(where, f"{value!r:.60} is not a component", "write ./component.yml, azureml:<name>:<version>, "
                          "azureml:<name>@latest, or the component's fields inline")
    text = value.strip()
    if text.startswith("azureml:"):
        return ComponentRef("registered", text, str(base_dir))
    path = (base_dir / text.removeprefix("file:")).resolve()
    if not path.is_file():
        raise ConfigError(where, f"{path} is not a file", "point it at the component's YAML, relative to the pipeline's")
    return ComponentRef("file", str(path), str(path.parent))


def component_dict(ref: ComponentRef, raw: Any, where: str,
                   components: Callable[[str], Mapping[str, Any]] | None) -> dict[str, Any] | None:
    """The component's YAML mapping; None for a registered one when there is no registry to ask."""
    if ref.kind == "inline":
        return dict(raw)
    if ref.kind == "file":
        data = safeyaml.load_file(Path(ref.ref), where, "component YAML")
        if not isinstance(data, dict):
            raise ConfigError(where, f"{ref.ref} is not a mapping of component fields")
        return data
    if components is None:
        return None
    try:
        return dict(components(ref.ref))
    except NotFoundError as exc:  # a missing component is the job's error, named at the step's field
        raise ConfigError(where, str(exc), "register it (`amlemu component create -f`), or name a file") from None


def load_component(ref: ComponentRef, raw: Any, where: str,
                   components: Callable[[str], Mapping[str, Any]] | None) -> Any:
    """The loaded component (amlemu.pipelines.component), its errors named under the step's field."""
    from amlemu.pipelines.component import component_from_dict

    data = component_dict(ref, raw, where, components)
    if data is None:
        return None
    try:
        return component_from_dict(data, Path(ref.base_dir), inline=ref.kind == "inline")
    except ConfigError as exc:
        raise ConfigError(f"{where}.{exc.field}", exc.problem, exc.fix) from None


def _types(ports: Any) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name, port in dict(ports or {}).items():
        kind = port.get("type") if isinstance(port, dict) else getattr(port, "type", None)
        found[str(name)] = None if kind is None else str(kind)
    return found


def input_types(component: Any) -> dict[str, str | None] | None:
    """The component's inputs and their types; None without a component (an inline command step)."""
    return None if component is None else _types(getattr(component, "inputs", None))


def output_types(component: Any) -> dict[str, str | None] | None:
    return None if component is None else _types(getattr(component, "outputs", None))
