"""A component's input and output types, and a value checked against its input's type, as
azure-ai-ml's port and parameter schemas have them (`_schema/component/input_output.py`). Pure."""
from __future__ import annotations

import math
from typing import Any

from amlemu.errors import ConfigError

PARAM_TYPES = ("string", "integer", "number", "boolean")  # literal values, put in the command as text
PORT_TYPES = ("uri_file", "uri_folder", "mltable", "custom_model", "mlflow_model", "triton_model")  # data
INPUT_TYPES = PARAM_TYPES + PORT_TYPES
INPUT_MODES = ("ro_mount", "download", "direct")  # the data modes a command job's input has here
OUTPUT_MODES = ("rw_mount", "upload", "direct")
# Names Azure ML refuses for inputs and outputs (its component reference: system parameters).
RESERVED_NAMES = ("path", "ld_library_path", "user", "logname", "home", "pwd", "shell")


def _integer(value: Any, field: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ConfigError(field, f"{value!r:.60} is not an integer", "give a whole number, e.g. 10")


def _number(value: Any, field: str) -> int | float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number: int | float = value
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise ConfigError(field, f"{value!r:.60} is not a number", "give a number, e.g. 0.01") from None
    else:
        raise ConfigError(field, f"{value!r:.60} is not a number", "give a number, e.g. 0.01")
    if not math.isfinite(number):
        raise ConfigError(field, f"{value!r:.60} is not a finite number", "give a number, e.g. 0.01")
    return number


def _boolean(value: Any, field: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ConfigError(field, f"{value!r:.60} is not a boolean", "give true or false")


def coerce(kind: str, value: Any, field: str) -> str | int | float | bool:
    """`value` as an input of type `kind` (string, integer, number, boolean) holds it; a string that
    spells the type ("10", "0.5", "true") is read as azure-ai-ml reads it; anything else is refused."""
    if kind == "integer":
        return _integer(value, field)
    if kind == "number":
        return _number(value, field)
    if kind == "boolean":
        return _boolean(value, field)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(field, f"a {type(value).__name__} is not a string", "give text (quote it)")
    return str(value)


def check_value(name: str, kind: str, value: Any, *, low: Any = None, high: Any = None,
                enum: tuple[str, ...] = (), field: str | None = None) -> str | int | float | bool:
    """The value of input `name` checked against its type, min/max and enum (the job fails on
    Azure ML on a value out of them; here it is refused before it runs)."""
    field = field or f"inputs.{name}"
    checked = coerce(kind, value, field)
    if low is not None and checked < low:  # type: ignore[operator]
        raise ConfigError(field, f"{checked} is below the input's min {low}", f"give a value of at least {low}")
    if high is not None and checked > high:  # type: ignore[operator]
        raise ConfigError(field, f"{checked} is above the input's max {high}", f"give a value of at most {high}")
    if enum and checked not in enum:
        raise ConfigError(field, f"{checked!r:.60} is not one of the input's enum", f"use one of: {', '.join(enum)}")
    return checked
