"""The code snapshot: what of the job's code folder a run gets, copied without ever leaving the folder.

What Azure ML does (azure-ai-ml `_utils/_asset_utils.py`: `get_upload_files_from_folder` walks the
folder with `os.walk(path, followlinks=True)` and `traverse_directory` maps each file through
`_resolve_path`, which follows a link, and a chain of links, to its final target): the code is
uploaded to blob storage, which has no links, so a symbolic link arrives on the node as a regular
file (or folder) holding its target's content, under the link's own name. Azure ML applies no
bounds: a link to /etc/ssl uploads the submitting machine's /etc/ssl (checked with azure-ai-ml
1.35.2; tests/test_snapshot.py compares the two file lists).

What the emulator does: the same for a link whose target, every link and `..` resolved, is inside
the code folder (copied as a regular file or folder under the link's name, so the snapshot itself
holds no links); a link whose target is outside is refused before anything is created, because
here the "upload" lands on the same host and would copy the host's files into a node. A link that
loops back to a folder it is in is refused too (Azure ML's walk would nest the folder in itself
until the path grows too long).
What is left out is Azure ML's too (emulator/jobs/ignorefile.py): the code folder's `.amlignore`,
else its `.gitignore`, with git's patterns, and `__pycache__`; nothing else (no fixed list: `.git`
or `.venv` go up to Azure ML unless an ignore file names them, so they are copied here too). A file
left out is never looked at (a link to a file outside that is ignored is not refused; a link to a
folder outside is, ignored or not: Azure ML uploads that folder all the same); folders are walked
even when all they hold is left out, as Azure ML's walk does (a file in them may be included again,
or reached through a link to a folder that is not left out). Folders that hold no file are not made
(blob storage has no folders).
Fifos, sockets and devices are skipped without being opened (reading a fifo would block the copy),
as are dangling links. Copied files keep only their executable bit: 0755 or 0644, never set-uid,
set-gid, sticky or group/other write, and they belong to whoever submits, as a download would.
"""
from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from amlemu.errors import ConfigError
from amlemu.jobs.ignorefile import IgnoreRules, ignore_rules

MAX_DEPTH = 64  # links to folders inside the folder can nest; a deeper tree is a loop in disguise
OUTSIDE_FIX = ("copy what it needs into the code folder, delete the link, or leave it out with .amlignore: the "
               "emulator never copies files from outside the code folder into a run (Azure ML would upload the "
               "link's target)")
# Azure ML walks into a linked folder whatever the ignore file says (its files are tested under the
# target's path, which no pattern of the code folder names): .amlignore is no way out for these.
OUTSIDE_FOLDER_FIX = ("copy what it needs into the code folder or delete the link: the emulator never copies files "
                      "from outside the code folder into a run (Azure ML would upload the linked folder, even one "
                      ".amlignore names)")
LOOP_FIX = "delete the link or point it at a folder that does not contain it"


@dataclass
class SnapshotPlan:
    """What a snapshot of `root` would hold, and what keeps it from being taken."""
    root: Path
    files: dict[str, Path] = field(default_factory=dict)  # path in the snapshot -> real path to read
    dirs: list[str] = field(default_factory=list)
    outside: list[ConfigError] = field(default_factory=list)  # links out of the folder
    refused: list[ConfigError] = field(default_factory=list)  # anything else that stops it (loops)
    skipped: list[str] = field(default_factory=list)  # "<path>: why", for notices
    rules: IgnoreRules | None = None  # the code folder's ignore rules, as Azure ML applies them


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a fifo"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def plan_snapshot(code: Path | None) -> SnapshotPlan:
    """Walk `code` (never following a link out of it) and list what the snapshot would hold. None:
    a job without code, whose snapshot is empty (Azure ML runs it in an empty working folder)."""
    if code is None:
        return SnapshotPlan(Path(os.devnull))
    root = os.path.realpath(code)
    plan = SnapshotPlan(Path(root))
    try:
        plan.rules = ignore_rules(Path(root))
    except ConfigError as exc:
        plan.refused.append(exc)
        return plan
    _walk(plan, root, "", "", (root,))
    plan.dirs = sorted({str(parent) for rel in plan.files for parent in Path(rel).parents if str(parent) != "."})
    return plan


def _walk(plan: SnapshotPlan, real_dir: str, rel_dir: str, real_rel: str, stack: tuple[str, ...]) -> None:
    """`real_dir` has no links in its path (`real_rel`: the same, relative to the code folder: what
    the ignore rules test); `rel_dir`: where it is in the snapshot; `stack`: the real folders being
    walked (loop check)."""
    if len(stack) > MAX_DEPTH:
        plan.refused.append(ConfigError("code", f"'{rel_dir}' is nested more than {MAX_DEPTH} folders deep "
                                        "through links", LOOP_FIX))
        return
    try:
        entries = sorted(os.scandir(real_dir), key=lambda e: e.name)
    except OSError as exc:
        plan.refused.append(ConfigError("code", f"cannot read '{rel_dir or '.'}': {exc.strerror}",
                                        "make the code folder readable"))
        return
    assert plan.rules is not None
    for entry in entries:
        rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
        tested = f"{real_rel}/{entry.name}" if real_rel else entry.name
        source = entry.path
        try:
            if entry.is_dir(follow_symlinks=False):
                _walk(plan, source, rel, tested, (*stack, source))
                continue
            if entry.is_file(follow_symlinks=False):
                if not plan.rules.excludes(tested):
                    plan.files[rel] = Path(source)
                continue
            mode = entry.stat(follow_symlinks=False).st_mode
        except OSError:  # removed while we walk
            continue
        if stat.S_ISLNK(mode):
            _link(plan, source, rel, tested, stack)
        elif not plan.rules.excludes(tested):
            plan.skipped.append(f"{rel}: {_kind(mode)}, not copied")


def _link(plan: SnapshotPlan, source: str, rel: str, tested: str, stack: tuple[str, ...]) -> None:
    """A link: Azure ML tests a link to a file by the link's own name, and walks into a link to a
    folder, testing its files under the target's path."""
    assert plan.rules is not None
    target = os.path.realpath(source)  # every link in the chain and every `..` resolved
    shown = os.readlink(source)
    try:
        mode: int | None = os.stat(target).st_mode
    except OSError:
        mode = None
    is_dir = mode is not None and stat.S_ISDIR(mode)
    if not is_dir and plan.rules.excludes(tested):
        return  # left out by name: never uploaded, so neither refused nor copied
    if not _inside(target, str(plan.root)):
        plan.outside.append(ConfigError(
            "code", f"'{rel}' is a symbolic link to {shown}" + (f" ({target})" if target != shown else "")
            + f", outside the code folder {plan.root}", OUTSIDE_FOLDER_FIX if is_dir else OUTSIDE_FIX))
    elif mode is None:
        plan.skipped.append(f"{rel}: a link to {shown}, which does not exist")
    elif is_dir and target in stack:
        plan.refused.append(ConfigError("code", f"'{rel}' is a symbolic link to {shown}, a folder it is "
                                        "in: the folder would be copied into itself", LOOP_FIX))
    elif is_dir:  # not the root itself: that is on the stack
        _walk(plan, target, rel, Path(target).relative_to(plan.root).as_posix(), (*stack, target))
    elif stat.S_ISREG(mode):
        plan.files[rel] = Path(target)
    else:
        plan.skipped.append(f"{rel}: {_kind(mode)}, not copied")


def check_code(code: Path | None) -> SnapshotPlan:
    """The plan, or the first refusal as a ConfigError (one line: the link, its target and the fix)."""
    plan = plan_snapshot(code)
    refused = plan.outside + plan.refused
    if refused:
        first = refused[0]
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        raise ConfigError(first.field, first.problem + more, first.fix)
    return plan


def take_snapshot(code: Path | None, dest: Path) -> SnapshotPlan:
    """Copy the code folder to `dest` (which must not exist) as check_code planned it; nothing is
    left at `dest` if it fails."""
    plan = check_code(code)
    dest.mkdir(parents=True)
    try:
        for rel in plan.dirs:
            (dest / rel).mkdir(mode=0o755)
        for rel, source in plan.files.items():
            if not _copy_file(source, dest / rel):
                plan.skipped.append(f"{rel}: changed while it was copied, not copied")
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return plan


def _copy_file(source: Path, target: Path) -> bool:
    """Copy one regular file; False if `source` is no longer one. O_NOFOLLOW and O_NONBLOCK: a file
    swapped for a link or a fifo since the plan is neither followed nor waited on."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as src:
        info = os.fstat(src.fileno())
        if not stat.S_ISREG(info.st_mode):
            return False
        mode = 0o755 if info.st_mode & stat.S_IXUSR else 0o644
        out_fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(out_fd, "wb") as out:
            shutil.copyfileobj(src, out, 1024 * 1024)
            os.fchmod(out.fileno(), mode)  # the umask may have taken bits away; set-uid never given
    return True
