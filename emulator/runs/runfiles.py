"""A run's files as the service hands them out (the studio's downloads, the signed log URLs), and
its launch plan as the studio shows it.

A job is untrusted code and wrote most of a run's folder: a file is opened with no link followed
on the way (`open_in_run`), and never one of the run's private files: the launch plan
(system_logs/launch.json: the job's environment_variables, which may hold secrets), the launch
agent's configuration (agent-config.marshal), or any file kept owner-only (mode 0600: the platform keeps its
secrets so; `amlemu job download` still copies them for the home's owner). The studio shows the
launch plan through `shown_plan`, with the values of the job's variables and of anything named
like a secret masked.
"""
from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from amlemu.runs.metrics import PLOT_NAME

# What of a run's record the page lists and serves: what `amlemu job download` gives.
DOWNLOADABLE = ("outputs", "logs", "user_logs", "system_logs", "azureml-logs")
MAX_FILES = 500  # listed per run; the rest is in `amlemu job download`
LAUNCH_PLAN, AGENT_CONFIG = "system_logs/launch.json", "agent-config.marshal"
PRIVATE = frozenset({LAUNCH_PLAN, AGENT_CONFIG})
MASK = "***"
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|KEY|CREDENTIAL|SAS|SIGNATURE|AUTH|CONNECTION_STRING", re.I)
MAX_PLAN = 4 * 1024 * 1024  # bytes of launch.json read for the page


def private(rel: str, info: os.stat_result) -> bool:
    """Never served: the launch plan, the agent's configuration, and any file no one but its owner may read."""
    return rel in PRIVATE or not info.st_mode & 0o077


def open_in_run(run_dir: Path, rel: str, tops: tuple[str, ...] = DOWNLOADABLE, *,
                allow_private: bool = False) -> BinaryIO | None:
    """The regular file run_dir/rel opened for reading, or None: `rel` must be a plain relative
    path under one of `tops` (or the metrics plot), and every folder on the way and the file
    itself are opened with O_NOFOLLOW relative to the previous one, so a link the job left (or
    swaps in meanwhile) fails the open instead of leading out of the run's folder. A private file
    is None too, unless `allow_private` (the studio reading the launch plan to mask it)."""
    parts = rel.split("/")
    if not parts or any(p in ("", ".", "..") or "\0" in p for p in parts):
        return None
    if not (parts[0] in tops and len(parts) > 1 or parts == [PLOT_NAME]):
        return None
    fds: list[int] = []
    try:
        fds.append(os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW))
        for part in parts[:-1]:
            fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fds[-1]))
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fds[-1])
    except OSError:
        return None
    finally:
        for each in fds:
            os.close(each)
    info = os.fstat(fd)
    # A fifo would block the reader, a device is not ours.
    if not stat.S_ISREG(info.st_mode) or (private(rel, info) and not allow_private):
        os.close(fd)
        return None
    return open(fd, "rb")


def list_files(run_dir: Path) -> list[dict[str, Any]]:
    """The regular files of the run's downloadable folders (links, special and private files left
    out, and never followed), with their sizes, in path order."""
    found: list[dict[str, Any]] = []
    plot = run_dir / PLOT_NAME
    if plot.is_file() and not plot.is_symlink():
        found.append({"path": PLOT_NAME, "size": plot.stat().st_size})
    for rel, info in walk_files(run_dir):
        if len(found) >= MAX_FILES:
            break
        found.append({"path": rel, "size": info.st_size})
    return found


def walk_files(run_dir: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Each regular, not private file of the run's downloadable folders (path relative to the run's
    folder, its lstat), in path order; links neither listed nor followed."""
    for top in DOWNLOADABLE:
        root = run_dir / top
        if root.is_symlink() or not root.is_dir():
            continue
        for folder, dirs, files in os.walk(root, followlinks=False):
            dirs.sort()
            for name in sorted(files):
                info = os.lstat(os.path.join(folder, name))
                rel = Path(folder, name).relative_to(run_dir).as_posix()
                if stat.S_ISREG(info.st_mode) and not private(rel, info):
                    yield rel, info


def _masked(value: Any, hide: set[str], found: set[str]) -> Any:
    """`value` with the string under each key in `hide` or named like a secret masked (the values
    masked go into `found`)."""
    if isinstance(value, dict):
        shown = {}
        for key, item in value.items():
            if isinstance(item, str) and (key in hide or SECRET_NAME.search(str(key))):
                found.add(item)
                shown[key] = MASK
            else:
                shown[key] = _masked(item, hide, found)
        return shown
    if isinstance(value, list):
        return [_masked(item, hide, found) for item in value]
    return value


def _scrubbed(value: Any, secrets: list[str]) -> Any:
    """Every string with the masked values cut out where they appear inside it (an argv's `X=...`)."""
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, MASK)
        return value
    if isinstance(value, dict):
        return {key: _scrubbed(item, secrets) for key, item in value.items()}
    if isinstance(value, list):
        return [_scrubbed(item, secrets) for item in value]
    return value


def shown_plan(run_dir: Path, declared: set[str]) -> dict[str, Any] | None:
    """The run's launch plan as the studio shows it: the values of the job's own variables
    (`declared`) and of every variable named like a secret (the run's token) masked, wherever they
    appear; None before the launch (or when it is not one)."""
    fh = open_in_run(run_dir, LAUNCH_PLAN, allow_private=True)
    if fh is None:
        return None
    with fh:
        text = fh.read(MAX_PLAN + 1)
    try:
        plan = json.loads(text) if len(text) <= MAX_PLAN else None
    except ValueError:
        return None
    if not isinstance(plan, dict):
        return None
    found: set[str] = set()
    masked = _masked(plan, declared, found)
    # Longest first, so a secret that holds another is cut whole; very short values are left (a
    # value such as "1" would mask every digit of the plan).
    return _scrubbed(masked, sorted((s for s in found if len(s) >= 4), key=len, reverse=True))
