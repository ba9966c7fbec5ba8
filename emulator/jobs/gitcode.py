"""`code: git+https://host/org/repo[.git][@ref][#subdirectory=path]`: the job's code from a git repository.

Azure ML takes a code path prefixed `git+` (azure-ai-ml's GIT_PATH_PREFIX) and its service fetches
the repository. Here it is cloned at submit, shallowly, into a temporary folder that becomes the
run's code snapshot as a local code folder would (emulator/jobs/snapshot.py: links out of it are
refused), then removed: a queued run keeps the commit it was submitted with. A repository is
untrusted: no hook of it runs (core.hooksPath=/dev/null), no submodule is fetched, only http(s)
transports are allowed, git never prompts for a credential, and a link-local host is refused.
A ref is a branch or a tag (`git clone --branch`), or a full commit id (a clone, then a checkout).
The fragment is pip's `#subdirectory=<path>`, or the path alone.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from amlemu.errors import ConfigError
from amlemu.storage.urlinputs import OFFLINE, blocked, offline

if TYPE_CHECKING:
    from amlemu.jobs.snapshot import SnapshotPlan
    from amlemu.specs import JobSpec

PREFIX = "git+"
REF_RE = re.compile(r"^[A-Za-z0-9_][\w./-]*$")  # no leading '-' (an option), no spaces or '..' (checked)
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
CLONE_TIMEOUT = 300  # seconds for the clone: a server that stalls fails the submit, not forever
# Git's own settings for an untrusted repository, before the verb (`git -c k=v clone`).
SAFE_CONFIG = ("core.hooksPath=/dev/null", "protocol.allow=never", "protocol.https.allow=always",
               "protocol.http.allow=always", "advice.detachedHead=false")
FIX = "clone it yourself (git clone <repository>) and set code: to that folder"


@dataclass(frozen=True)
class GitCode:
    url: str  # as written: git+https://...
    repo: str  # what git clones: https://host/org/repo.git
    ref: str | None  # a branch, a tag or a full commit id; None: the default branch
    subdir: str  # "" for the repository's root

    @property
    def host(self) -> str:
        return urlsplit(self.repo).hostname or ""


def is_git(code: object) -> bool:
    return isinstance(code, str) and code.strip().lower().startswith(PREFIX)


def parse_git_code(value: str, field: str = "code") -> GitCode:
    """Pure: the repository, ref and folder of a `git+` code URL, or a one-line refusal."""
    url = value.strip()
    parts = urlsplit(url[len(PREFIX):])
    if parts.scheme.lower() not in ("https", "http") or not parts.hostname:
        raise ConfigError(field, f"{url}: only git+https:// (or git+http://) repositories are cloned here", FIX)
    if parts.username or parts.password or parts.query:
        raise ConfigError(field, f"{url}: a credential in the URL is not used here (repositories are read "
                          "anonymously)", FIX)
    if blocked(parts.hostname):
        raise ConfigError(field, f"{url}: {parts.hostname} is a link-local address (a cloud metadata service); "
                          "it is never read", FIX)
    path, ref = parts.path, None
    if "@" in path:
        path, ref = path.rsplit("@", 1)
        if not REF_RE.match(ref) or ".." in ref:
            raise ConfigError(field, f"{url}: '{ref}' is not a branch, tag or commit", "write git+https://host/org/"
                              "repo.git@<branch or tag>")
    subdir = unquote(parts.fragment.removeprefix("subdirectory="))
    folders = [p for p in subdir.split("/") if p not in ("", ".")]
    if ".." in folders or subdir.startswith("/"):
        raise ConfigError(field, f"{url}: the folder '{subdir}' leaves the repository", "name a folder inside it")
    if not path.strip("/"):
        raise ConfigError(field, f"{url} names no repository", "write git+https://host/org/repo.git")
    return GitCode(url, f"{parts.scheme}://{parts.netloc}{path}", ref, "/".join(folders))


def clone_argv(code: GitCode, dest: str, shallow: bool = True) -> list[str]:
    """`git clone` of the repository at its ref into `dest` (pure). A commit id is no branch: that
    clone takes the history, and checkout_argv picks the commit."""
    by_commit = code.ref is not None and bool(COMMIT_RE.match(code.ref))
    options = ["--depth", "1"] if shallow and not by_commit else []
    branch = ["--branch", code.ref] if code.ref and not by_commit else []
    return ["git", *(arg for item in SAFE_CONFIG for arg in ("-c", item)), "clone", "--quiet",
            "--no-recurse-submodules", *(["--no-checkout"] if by_commit else []), *options, *branch,
            "--", code.repo, dest]


def checkout_argv(code: GitCode, dest: str) -> list[str] | None:
    """The checkout of a commit id after its clone; None for a branch or tag (cloned checked out)."""
    if code.ref is None or not COMMIT_RE.match(code.ref):
        return None
    return ["git", *(arg for item in SAFE_CONFIG for arg in ("-c", item)), "-C", dest, "checkout", "--quiet",
            "--detach", code.ref, "--"]


def git_env(environ: Mapping[str, str]) -> dict[str, str]:
    """Git never waits for a user name or password: a private repository fails at once."""
    return {**environ, "GIT_TERMINAL_PROMPT": "0", "GCM_INTERACTIVE": "never", "GIT_ASKPASS": "/bin/false",
            "SSH_ASKPASS": "/bin/false"}


def not_cloned(code: GitCode, why: str) -> ConfigError:
    return ConfigError("code", f"{code.url} cannot be cloned here ({why})", FIX)


def check_offline(job: JobSpec) -> None:
    """Before anything is created (a dry run too): offline, nothing is cloned, not even tried."""
    if job.code_git and offline():
        raise not_cloned(parse_git_code(job.code_git), f"{OFFLINE} is set: nothing is fetched")


def _run(argv: list[str], code: GitCode) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=CLONE_TIMEOUT, env=git_env(os.environ),
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise not_cloned(code, f"git took over {CLONE_TIMEOUT} s") from None
    except OSError as exc:
        raise not_cloned(code, f"git cannot run: {exc.strerror}") from None


def clone(code: GitCode, dest: Path) -> Path:
    """Clone into `dest` (which must not exist); returns the code folder in it."""
    try:
        found = socket.getaddrinfo(code.host, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise not_cloned(code, f"{code.host} does not resolve: {exc.strerror}") from None
    if any(blocked(str(info[4][0])) for info in found):
        raise not_cloned(code, f"{code.host} resolves to a link-local address (a cloud metadata service)")
    done = _run(clone_argv(code, str(dest)), code)
    if done.returncode and "does not support shallow" in done.stderr:  # a dumb-HTTP server: the history
        shutil.rmtree(dest, ignore_errors=True)
        done = _run(clone_argv(code, str(dest), shallow=False), code)
    checkout = checkout_argv(code, str(dest))
    if not done.returncode and checkout:
        done = _run(checkout, code)
    if done.returncode:
        lines = [line.removeprefix("fatal: ") for line in done.stderr.strip().splitlines()]
        raise not_cloned(code, lines[-1] if lines else f"git exited with {done.returncode}")
    shutil.rmtree(dest / ".git")  # the snapshot is the files at the ref (Azure ML's is the upload's)
    folder = dest / code.subdir if code.subdir else dest
    if folder.is_symlink() or not folder.is_dir():
        raise ConfigError("code", f"{code.url}: the repository has no folder {code.subdir}", "name a folder in it")
    return folder


@contextmanager
def code_folder(job: JobSpec) -> Iterator[Path | None]:
    """The job's code folder: its own, or its repository cloned for the time of the block."""
    if not job.code_git:
        yield job.code
        return
    check_offline(job)
    code = parse_git_code(job.code_git)
    scratch = Path(tempfile.mkdtemp(prefix="amlemu-git-"))
    try:
        yield clone(code, scratch / "repo")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def check_script(job: JobSpec, folder: Path) -> None:
    """The script the command runs is in the repository (a local code folder is checked at load)."""
    from amlemu.jobs.jobyaml import script_of, substitute_bindings  # noqa: PLC0415 - jobyaml imports this

    names = {f"{kind}.{n}": "DATA" for kind, items in (("inputs", job.inputs), ("outputs", job.outputs)) for n in items}
    script = script_of(substitute_bindings(job.command, names))
    if script and not Path(script).is_absolute() and not (folder / script).is_file():
        raise ConfigError("command", f"script {script} not found in {job.code_git}",
                          "fix the script path (it is relative to code)")


def take_snapshot(job: JobSpec, dest: Path) -> SnapshotPlan:
    """snapshot.take_snapshot of the job's code, cloned first when it is a repository."""
    from amlemu.jobs import snapshot  # noqa: PLC0415

    with code_folder(job) as folder:
        if job.code_git and folder is not None:
            check_script(job, folder)
        return snapshot.take_snapshot(folder, dest)
