"""A run's v1 run history, kept in its record by the service (emulator/service/v1online.py): the
metrics azureml-core's Run.log / log_list / log_row / log_table / log_image send from inside the
job (every value as sent, one JSON line each), the run's tags and properties, and the files
Run.upload_file sends.

Whatever a job sends lands under its own run's folder only: metric names and values are data in a
JSON file, and an uploaded file's name is checked segment by segment (`artifact_path`) before
anything is written, never following a link. The platform's own logs cannot be overwritten.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

FOLDER = "run-history"  # in the run's record
METRICS, PROPS = "metrics.jsonl", "run.json"
ARTIFACTS = "artifacts"  # uploaded files not under outputs/ or logs/, by their own names
# Where an uploaded file may go as it is named; anything else is kept under ARTIFACTS.
DIRECT = ("outputs/", "logs/")
PLATFORM = ("user_logs/", "system_logs/", "azureml-logs/", "snapshot/", FOLDER + "/", ARTIFACTS + "/")
MAX_NAME = 1024
_lock = threading.Lock()  # one service process writes a home's histories


class HistoryError(ValueError):
    """What a job sent that cannot be kept: the message names the field and the fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _folder(run_dir: Path) -> Path:
    folder = run_dir / FOLDER
    folder.mkdir(exist_ok=True)
    return folder


def append_metrics(run_dir: Path, metrics: list[dict[str, Any]]) -> None:
    """Each metric as azureml-core's metric service takes it (name, columns, values with step and data)."""
    lines = "".join(json.dumps(m, allow_nan=True) + "\n" for m in metrics)
    with _lock, (_folder(run_dir) / METRICS).open("a", encoding="utf-8") as out:
        out.write(lines)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    try:
        text = (run_dir / FOLDER / METRICS).read_text(encoding="utf-8")
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except ValueError:  # a line cut off by a crash: the others stand
            continue
        if isinstance(item, dict):
            found.append(item)
    return found


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def numeric_history(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """(step, value) of every numeric value logged: a scalar or list under its name, a row's or
    table's column as `name.column` (what `amlemu job show`, the studio page and metrics.png draw)."""
    history: dict[str, list[tuple[int, float]]] = {}
    for metric in read_metrics(run_dir):
        name = str(metric.get("name", ""))
        for point in (v for v in metric.get("value") or [] if isinstance(v, dict)):
            data = point.get("data") if isinstance(point.get("data"), dict) else {}
            for column, raw in data.items():
                value = _number(raw)
                if value is None:
                    continue
                points = history.setdefault(name if len(data) == 1 else f"{name}.{column}", [])
                step = point.get("step")
                points.append((step if isinstance(step, int) and not isinstance(step, bool) else len(points), value))
    return history


def properties(run_dir: Path) -> dict[str, dict[str, str]]:
    """{"tags": {...}, "properties": {...}} the run was given (Run.tag, add_properties)."""
    try:
        saved = json.loads((run_dir / FOLDER / PROPS).read_text())
    except (OSError, ValueError):
        saved = {}
    return {k: dict(saved.get(k) or {}) for k in ("tags", "properties")}


def update_properties(run_dir: Path, tags: dict[str, Any] | None, props: dict[str, Any] | None) -> None:
    with _lock:
        saved = properties(run_dir)
        for key, new in (("tags", tags), ("properties", props)):
            if isinstance(new, dict):
                saved[key].update({str(k): "" if v is None else str(v) for k, v in new.items()})
        tmp = _folder(run_dir) / f".{PROPS}.tmp"
        tmp.write_text(json.dumps(saved))
        tmp.replace(run_dir / FOLDER / PROPS)


def artifact_path(run_dir: Path, name: str) -> Path:
    """Where an uploaded file named `name` goes in the run's record: outputs/ and logs/ as named
    (what `job download` and the studio page read), any other name under artifacts/. Refused:
    names that leave the record or would replace the platform's logs."""
    clean = name.strip() if isinstance(name, str) else ""
    parts = clean.split("/")
    if not clean or len(clean) > MAX_NAME or "\0" in clean or "\\" in clean or any(p in ("", ".", "..") for p in parts):
        raise HistoryError("name", f"name: '{str(name)[:200]}' is not a relative file name within the run; "
                           "use a name like outputs/model.pkl")
    if clean.startswith(PLATFORM) or clean in ("mlflow.db", "metrics.png"):
        raise HistoryError("name", f"name: '{clean}' would replace the run's own records; upload under outputs/")
    return run_dir / clean if clean.startswith(DIRECT) else run_dir / ARTIFACTS / clean


def write_artifact(run_dir: Path, name: str, data: bytes) -> str:
    """Write an uploaded file (through a temporary file renamed into place; no link followed on the
    way: every folder is created or checked as a real folder). Returns the name it is listed under."""
    target = artifact_path(run_dir, name)
    folder = run_dir
    for part in target.relative_to(run_dir).parts[:-1]:
        folder = folder / part
        try:
            os.mkdir(folder, 0o755)
        except FileExistsError:
            if folder.is_symlink() or not folder.is_dir():
                raise HistoryError("name", f"name: '{name}' goes through {part}, which is not a folder") from None
    if target.is_symlink() or (target.exists() and not target.is_file()):
        raise HistoryError("name", f"name: '{name}' names something that is not a file")
    tmp = target.with_name(f".{target.name}.upload")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, target)
    return listed_name(run_dir, target)


def listed_name(run_dir: Path, path: Path) -> str:
    rel = path.relative_to(run_dir).as_posix()
    return rel.removeprefix(ARTIFACTS + "/")
