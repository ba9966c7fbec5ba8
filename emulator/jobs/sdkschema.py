"""azure-ai-ml's own verdict on a CLI v2 job YAML: its `load_job` (the schema `az ml job create`
checks before anything is sent), its errors as one ConfigError per field, naming the fix.

azure-ai-ml reports a refused command job as a marshmallow ValidationError whose text nests the
schema's verdict as JSON, twice over ("Validation for CommandSchema failed: {errors: [{message:
"Validation for CommandJobSchema failed: {field: [problem]}"}]}"). Fields that take one of several
forms (distribution, inputs, code, job_tier) report one list of problems per form they tried: the
form that fits best is kept (fewest problems, not the `${{...}}` binding form), and "not in set"
answers of equally good forms are merged into one list of the values allowed.
"""
from __future__ import annotations

import json
import logging
import re
import warnings
from pathlib import Path
from typing import Any

from amlemu import safeyaml
from amlemu.errors import ConfigError
from amlemu.lazydeps import defer_rfc3987_syntax

REFERENCE = "see https://aka.ms/ml-cli-v2-job-command-yaml-reference"
NOT_IN_SET = re.compile(r"^Value '(?P<value>.*)' passed is not in set \[(?P<allowed>.*)\]$", re.S)
BINDING = "is not a data binding string"
Problem = tuple[tuple[str, ...], str]  # (path of the field, azure-ai-ml's message)


def installed() -> bool:
    defer_rfc3987_syntax()  # over a second of CPU on every import of azure-ai-ml (lazydeps says why)
    try:
        import azure.ai.ml  # noqa: F401,PLC0415
    except ImportError:
        return False
    return True


def schema_errors(path: str | Path, overrides: list[str] | None = None) -> list[ConfigError]:
    """What azure-ai-ml's load_job refuses in the job YAML at `path` (with `--set` overrides applied
    as `az ml` applies them): one ConfigError per field, [] when it loads."""
    from azure.ai.ml import load_job  # noqa: PLC0415
    from marshmallow import ValidationError  # noqa: PLC0415

    params = []
    for item in overrides or []:
        key, _, raw = item.partition("=")
        params.append({key: safeyaml.loads(raw, f"--set {key}") if raw else ""})
    quiet = logging.getLogger("azure.ai.ml")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # "experimental class" notices on every schema
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load_job(path, params_override=params)
    except ValidationError as exc:
        return _errors(_problems(exc.messages))
    except Exception as exc:  # noqa: BLE001 - its other refusals (ValidationException, ...) are one line
        lines = str(getattr(exc, "message", None) or exc).strip().splitlines()
        return [ConfigError("job", f"{lines[0] if lines else type(exc).__name__} (azure-ai-ml)", REFERENCE)]
    finally:
        quiet.setLevel(level)
    return []


def _problems(node: Any, path: tuple[str, ...] = ()) -> list[Problem]:
    """The schema's nested verdict -> (field path, message) pairs."""
    if isinstance(node, str):
        found = _embedded(node)
        if found is None:
            return [(path, node)]
        if isinstance(found.get("errors"), list):  # {"result": "Failed", "errors": [{message, path}]}
            return [p for e in found["errors"] if isinstance(e, dict)
                    for p in _problems(e.get("message", ""), path + _path(e.get("path")))]
        return _problems(found, path)
    if isinstance(node, dict):
        problems = []
        for key, value in node.items():
            inner = path if key == "_schema" else (*path, str(key))
            if key == "value" and len(path) == 2 and path[0] in ("inputs", "outputs"):
                inner = path  # the input's own fields, not the wrapper's
            problems += _problems(value, inner)
        return problems
    if isinstance(node, list):
        if all(isinstance(item, str) for item in node):
            return [p for item in node for p in _problems(item, path)]
        return _best_form([_problems(form, path) for form in node])
    return [(path, str(node))]


def _embedded(text: str) -> dict[str, Any] | None:
    """The JSON object a "Validation for X failed:\\n\\n {...}" message carries, if any."""
    start = text.find("{")
    if not text.startswith("Validation for") or start < 0:
        return None
    try:
        found, _ = json.JSONDecoder().raw_decode(text[start:])
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _path(value: Any) -> tuple[str, ...]:
    return () if not isinstance(value, str) or value in ("*", "") else tuple(value.split("."))


def _best_form(forms: list[list[Problem]]) -> list[Problem]:
    """Of the forms a field was tried as, the problems of the one that fits best."""
    def rank(problems: list[Problem]) -> tuple[bool, int]:
        return (any(BINDING in m for _, m in problems), len(problems))
    forms = [f for f in forms if f]
    if not forms:
        return []
    best = min(rank(f) for f in forms)
    tied = [f for f in forms if rank(f) == best]
    if all(NOT_IN_SET.match(m) for f in tied for _, m in f) and len({tuple(p for p, _ in f) for f in tied}) == 1:
        merged = []
        for i, (where, message) in enumerate(tied[0]):
            value = NOT_IN_SET.match(message)["value"]  # type: ignore[index]
            allowed = [a.strip(" '") for f in tied for a in NOT_IN_SET.match(f[i][1])["allowed"].split(",")]  # type: ignore[index]
            merged.append((where, f"Value '{value}' passed is not in set [{', '.join(dict.fromkeys(allowed))}]"))
        return merged
    return tied[0]


def _errors(problems: list[Problem]) -> list[ConfigError]:
    """One ConfigError per field (its first problem), in the schema's order."""
    errors: dict[str, ConfigError] = {}
    for where, message in problems:
        field = ".".join(where) or "job"
        if field not in errors:
            errors[field] = _error(field, message.strip())
    return list(errors.values())


def _error(field: str, message: str) -> ConfigError:
    message = message.splitlines()[0].rstrip(":.") if message else "refused"
    if (not_in := NOT_IN_SET.match(message)) is not None:
        allowed = [a.strip(" '") for a in not_in["allowed"].split(",") if a.strip(" '") != "null"]
        return ConfigError(field, f"'{not_in['value']}' is not allowed (azure-ai-ml)", f"use one of: {', '.join(allowed)}")
    if message == "Unknown field":
        return ConfigError(field, "unknown field (azure-ai-ml)", "remove it or fix its name; " + REFERENCE)
    if message == "Missing data for required field":
        return ConfigError(field, "missing (azure-ai-ml)", "give it; " + REFERENCE)
    return ConfigError(field, f"{message[:1].lower()}{message[1:]} (azure-ai-ml)", REFERENCE)
