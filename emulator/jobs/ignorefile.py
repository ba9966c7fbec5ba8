"""Which files of a job's code folder Azure ML leaves out of the code snapshot: its rules, with git's
pattern syntax (the `pathspec` library's gitwildmatch: `!`, `**`, anchored `/x`, folder-only `x/`).

What azure-ai-ml does (checked with 1.35.2; `_utils/_asset_utils.py` IgnoreFile / AmlIgnoreFile /
GitIgnoreFile / get_ignore_file, `entities/_component/code.py` ComponentIgnoreFile, through which a
command job's code is uploaded; tests/test_snapshot.py compares the file lists):
- One ignore file is read, in the code folder itself: `.amlignore`, else `.gitignore` (never both).
  Ignore files in sub-folders are not read (they are uploaded as ordinary files), nor any above.
- `__pycache__` is always left out, as if the ignore file ended with it.
- Each *file* is tested, by its path relative to the code folder, with the folder it is in resolved
  (a file reached through a linked folder is tested under the path of the link's target); the last
  pattern that matches it decides (`!` includes it again). Folders are never tested themselves, so
  unlike git a file can be included again under an excluded folder (`build/` then `!build/keep.txt`
  uploads build/keep.txt).
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import pathspec
from pathspec.patterns import GitWildMatchPattern

from amlemu.errors import ConfigError

IGNORE_FILES = (".amlignore", ".gitignore")  # the first one present is the one read
ALWAYS_IGNORED = ("__pycache__",)
MAX_BYTES = 1024 * 1024


@dataclass(frozen=True)
class IgnoreRules:
    """The code folder's ignore rules. `source`: the ignore file read, or None."""
    spec: pathspec.PathSpec
    source: Path | None = None

    def excludes(self, rel: str) -> bool:
        """Is the file at `rel` (relative to the code folder, '/'-separated, its folder resolved) left out?"""
        return self.spec.match_file(rel)


def _read(path: Path) -> str:
    """The ignore file's text, from a regular file only: a fifo is never waited on (O_NONBLOCK)."""
    fix = f"make {path.name} a small UTF-8 text file of patterns, or delete it"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError("code", f"cannot read {path}: {exc.strerror}", fix) from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError("code", f"{path} is not a regular file", fix)
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ConfigError("code", f"{path} is over {MAX_BYTES // 1024} KiB", fix)
    try:
        return data.decode("utf-8-sig")  # as azure-ai-ml opens it
    except UnicodeDecodeError:
        raise ConfigError("code", f"{path} is not UTF-8 text", fix) from None


def ignore_rules(code: Path) -> IgnoreRules:
    """The rules Azure ML applies to the code folder `code` (see the module's notes). A pattern git
    would refuse, or an ignore file that cannot be read as text, is a ConfigError naming it. An
    ignore file that is a link out of the folder is not read: the snapshot refuses that link."""
    root = os.path.realpath(code)
    source = next((code / name for name in IGNORE_FILES if os.path.exists(code / name)), None)
    if source is not None and not os.path.realpath(source).startswith(root.rstrip(os.sep) + os.sep):
        return IgnoreRules(pathspec.PathSpec([GitWildMatchPattern(p) for p in ALWAYS_IGNORED]), source)
    lines = [] if source is None else [line.rstrip() for line in _read(source).splitlines()]
    patterns = []
    for number, line in enumerate([*lines, *ALWAYS_IGNORED], start=1):
        try:
            patterns.append(GitWildMatchPattern(line))
        except ValueError as exc:  # GitWildMatchPatternError
            raise ConfigError("code", f"{source}: line {number}, {line!r}, is not a pattern ({exc})",
                              "fix or delete the line (see `git help gitignore`)") from None
    return IgnoreRules(pathspec.PathSpec(patterns), source)
