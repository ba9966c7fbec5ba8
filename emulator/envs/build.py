"""Building a resolved environment into a Python environment of its own, with uv, cached by content
hash under the cache folder: built once, whatever the number of jobs asking for it at once (a file
lock), and reused by every later job with the same Python, requirements and package source.

    <cache>/envs/<key>/            the environment (bin/python, lib/python3.X/site-packages)
    <cache>/envs/<key>/amlemu-env.json   its record, written last: present = complete
    <cache>/envs/<key>.lock        held while it is built
    <cache>/envs/<key>.log         uv's output of the build
    <cache>/envs/uv-cache/         uv's own cache (wheels it fetched)

($AMLEMU_ENV_CACHE moves <cache>/envs elsewhere.)
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from amlemu.envs import hostdists, pipsources
from amlemu.envs.resolve import ResolvedEnvironment
from amlemu.errors import BuildError

RECORD = "amlemu-env.json"
HOST_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
OFFLINE = "AMLEMU_OFFLINE"
PYPI = "https://pypi.org/simple"
# uv's reason when a requirement has no candidate in the sources (it names the package first).
NOT_FOUND = re.compile(r"Because (?:there (?:is|are) no versions? of |only )?([A-Za-z0-9][A-Za-z0-9._-]*)"
                       r"[^,]*? (?:was not found|is available|are available|and you require)")


def redact(url: str) -> str:
    """An index URL without its user and password (a mirror's token never reaches a log)."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        return urlunsplit(parts._replace(netloc=f"***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")))
    return url


@dataclass(frozen=True)
class PackageSource:
    """Where packages this machine's venv lacks come from. By default the sources the user's pip has
    (pip.py); AMLEMU_PACKAGE_INDEX / AMLEMU_FIND_LINKS name the emulator's own instead (an index,
    find-links folders, and nothing else); AMLEMU_OFFLINE=1: no index at all, only AMLEMU_FIND_LINKS'
    folders (a machine without a network). `index_url` None with `offline` False: PyPI, as pip's."""

    index_url: str | None = None
    find_links: tuple[str, ...] = ()
    extra_index_urls: tuple[str, ...] = ()
    constraints: tuple[str, ...] = ()
    offline: bool = True
    origin: str = "AMLEMU_PACKAGE_INDEX / AMLEMU_FIND_LINKS"  # how the source was chosen, for messages
    cert: str | None = None  # pip's `cert`: the CA bundle its indexes are verified with

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PackageSource:
        env = os.environ if environ is None else environ
        links = tuple(p for p in env.get("AMLEMU_FIND_LINKS", "").split(os.pathsep) if p)
        if pipsources.truthy(env.get(OFFLINE, "")):
            return cls(None, links, offline=True, origin=f"{OFFLINE}=1")
        if env.get("AMLEMU_PACKAGE_INDEX") or links:
            index = env.get("AMLEMU_PACKAGE_INDEX") or None
            return cls(index, links, offline=index is None)
        pip = pipsources.pip_sources(env)
        return cls(pip.index_url, pip.find_links, pip.extra_index_urls, pip.constraints, offline=pip.no_index,
                   origin=pip.origin, cert=pip.cert)

    def key(self) -> dict[str, Any]:
        return {"index": None if self.offline else (self.index_url or PYPI), "find_links": list(self.find_links),
                **({"extra": list(self.extra_index_urls)} if self.extra_index_urls and not self.offline else {}),
                **({"constraints": list(self.constraints)} if self.constraints else {})}

    def uv_args(self) -> list[str]:
        if self.offline:
            args = ["--no-index"]
        else:  # uv's own order (the first index that has a package serves it): no index shadows another
            args = ["--index-url", self.index_url] if self.index_url else []
            for url in self.extra_index_urls:
                args += ["--extra-index-url", url]
        for link in self.find_links:
            args += ["--find-links", link]
        for constraint in self.constraints:
            args += ["--constraint", constraint]
        return args

    @property
    def explicit_index(self) -> bool:
        """An index named for the emulator (AMLEMU_PACKAGE_INDEX), not just pip's."""
        return bool(self.index_url) and self.origin.startswith("AMLEMU_PACKAGE_INDEX")

    def uv_env(self) -> dict[str, str]:
        return {"SSL_CERT_FILE": self.cert} if self.cert else {}

    def describe(self) -> str:
        if self.offline:
            parts = ["no index"]
        else:
            parts = [f"index {redact(self.index_url) if self.index_url else PYPI + ' (PyPI)'}"]
            parts += [f"extra index {redact(url)}" for url in self.extra_index_urls]
        return ", ".join(parts + [f"find-links {link}" for link in self.find_links]) + f" (from {self.origin})"

    def way_out(self) -> str:
        """How to make a package this source lacks available."""
        if self.offline and self.origin.startswith(OFFLINE):
            return (f"unset {OFFLINE} to install from pip's configured sources, or put its wheel in a folder "
                    "named by AMLEMU_FIND_LINKS")
        if self.origin.startswith("AMLEMU_"):
            return ("add it to AMLEMU_PACKAGE_INDEX / AMLEMU_FIND_LINKS, or unset both to install from pip's "
                    "configured sources")
        return ("make it available from pip's sources (`pip config set global.extra-index-url <index>`, or "
                "PIP_INDEX_URL / PIP_EXTRA_INDEX_URL / PIP_FIND_LINKS), or set AMLEMU_FIND_LINKS to a folder "
                "holding its wheel")


@dataclass(frozen=True)
class BuiltEnvironment:
    prefix: Path
    record: dict[str, Any]
    reused: bool  # found complete in the cache: nothing was built


def uv_binary() -> str:
    """uv: $AMLEMU_UV, else on PATH, else beside this Python (the venv's uv, a dev dependency)."""
    for candidate in (os.environ.get("AMLEMU_UV"), shutil.which("uv"), str(Path(sys.executable).with_name("uv"))):
        if candidate and Path(candidate).is_file():
            return candidate
    raise BuildError("uv is not installed: `pip install uv` (amlemu's dev dependencies have it), or set AMLEMU_UV")


def _uv_env(root: Path) -> dict[str, str]:
    # Never a Python download, never a user's uv.toml (the package source is the emulator's); uv's
    # cache beside the environments, so its hard links into them stay on one file system.
    return {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "UV_NO_CONFIG": "1", "NO_COLOR": "1",
            "UV_CACHE_DIR": str(root / "uv-cache")}


def _run(argv: list[str], log: Path, what: str, source: PackageSource | None = None) -> None:
    with open(log, "a") as out:
        out.write(f"$ {' '.join(redact(a) for a in argv)}\n")
        out.flush()
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False,
                              env={**_uv_env(log.parent), **(source.uv_env() if source else {})})
    if done.returncode:
        text = log.read_text(errors="replace")
        lines = text.splitlines()
        reason = next((ln.strip(" ×╰─▶") for ln in lines if "×" in ln or "error:" in ln), lines[-1] if lines else "")
        detail = " ".join(ln.strip(" ╰─▶│") for ln in lines[lines.index(reason) + 1:][:3]) \
            if reason in lines else ""
        message = re.sub(r"\s+", " ", f"{reason} {detail}").strip()[:400]
        # uv wraps its explanation at the terminal's width ("you require\n  amlemupin==3.0" under xdist)
        output = " ".join(text[text.rfind("$ "):].split())
        missing = NOT_FOUND.search(output) if source is not None else None
        if missing:  # the one line a user acts on: the package, where it was looked for, the way out
            required = re.search(r"you require ([^,; ]+)", output)
            wanted = f" ({required.group(1)})" if required and required.group(1) != missing.group(1) else ""
            raise BuildError(f"{what}: package {missing.group(1)}{wanted} was not found in the sources tried: "
                             f"{source.describe()}; {source.way_out()} (uv's log: {log})")
        raise BuildError(f"{what}: {message} (uv's log: {log})")


def find_python(version: str | None, log: Path) -> str:
    """The interpreter of the declared version: this machine's when it matches, else one uv finds
    installed here (never downloaded)."""
    if version is None or version == HOST_PYTHON:
        return getattr(sys, "_base_executable", sys.executable)
    done = subprocess.run([uv_binary(), "python", "find", version], capture_output=True, text=True,
                          env=_uv_env(log.parent), check=False)
    if done.returncode:
        raise BuildError(f"python {version} is not installed on this machine (this one has {HOST_PYTHON}); "
                         f"install it, or declare python={HOST_PYTHON} in the conda file")
    return done.stdout.strip()


def env_root(cache: Path) -> Path:
    return Path(os.environ.get("AMLEMU_ENV_CACHE") or cache / "envs")  # tests keep theirs apart


def env_prefix(env: ResolvedEnvironment, cache: Path, source: PackageSource) -> Path:
    """Where the environment is (or will be) built: its content hash under the cache."""
    return env_root(cache) / env.key(source.key())


def build(env: ResolvedEnvironment, cache: Path, source: PackageSource, *,
          horovod_links: tuple[str, ...] = ()) -> BuiltEnvironment:
    """The environment's folder, built now or found in the cache."""
    key = env.key(source.key())
    root = env_root(cache)
    root.mkdir(parents=True, exist_ok=True)
    prefix, log = root / key, root / f"{key}.log"
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second job asking for it waits here, then reuses it
        if (prefix / RECORD).is_file():
            record = json.loads((prefix / RECORD).read_text())
            if not record.get("bytecode"):  # built before environments were compiled: once, now
                record["bytecode"] = compile_bytecode(prefix, log)
                _write_record(prefix, record)
            return BuiltEnvironment(prefix, record, reused=True)
        shutil.rmtree(prefix, ignore_errors=True)  # what a build that died left
        log.write_text("")
        started = time.monotonic()
        try:
            record = _build(env, prefix, log, source, horovod_links)
        except BaseException:
            shutil.rmtree(prefix, ignore_errors=True)
            raise
        record.update(key=key, label=env.label, built_at=time.time(), bytecode=compile_bytecode(prefix, log),
                      build_seconds=round(time.monotonic() - started, 2))
        _write_record(prefix, record)
        return BuiltEnvironment(prefix, record, reused=False)


def _write_record(prefix: Path, record: dict[str, Any]) -> None:
    tmp = prefix / f"{RECORD}.tmp"
    tmp.write_text(json.dumps(record, indent=2))
    tmp.rename(prefix / RECORD)


def compile_bytecode(prefix: Path, log: Path) -> bool:
    """Every module of the environment compiled once, here, to the bytecode Python would otherwise
    compile on each rank's every start: uv installs without it, the packages linked from this
    machine come without their __pycache__, and a node cannot write it back (a process node's
    prefix is read-only). torch + Horovod imported in 3.4 s uncompiled, 2.0 s compiled. Compiling
    runs no package code. A file that does not compile (a template, old syntax) stays as it was."""
    site = next(iter(sorted((prefix / "lib").glob("python3*/site-packages"))), None)
    if site is None:
        return False
    with open(log, "a") as out:
        out.write(f"$ {prefix / 'bin' / 'python'} -m compileall -q -j 0 {site}\n")
        out.flush()
        subprocess.run([str(prefix / "bin" / "python"), "-m", "compileall", "-q", "-j", "0", str(site)],
                       stdout=out, stderr=subprocess.STDOUT, check=False)
    return True


def _build(env: ResolvedEnvironment, prefix: Path, log: Path, source: PackageSource,
           horovod_links: tuple[str, ...]) -> dict[str, Any]:
    python = find_python(env.python, log)
    _run([uv_binary(), "venv", "--quiet", "--python", python, str(prefix)], log, f"environment {env.label} could not be built")
    env_python = prefix / "bin" / "python"
    env_site = Path(subprocess.run([str(env_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True).stdout.strip())
    return install(env, env_site, prefix / "bin", ["--python", str(env_python)], log, source, horovod_links)


def install(env: ResolvedEnvironment, site: Path, bin_dir: Path, where: list[str], log: Path, source: PackageSource,
            horovod_links: tuple[str, ...] = ()) -> dict[str, Any]:
    """The environment's requirements into `site` (a venv's site-packages, or a --target folder):
    this machine's packages linked first, the rest by uv from the package source."""
    reused: dict[str, str] = {}
    bin_dir.mkdir(parents=True, exist_ok=True)
    if (env.python or HOST_PYTHON) == HOST_PYTHON:  # the same ABI: this machine's packages fit
        host = hostdists.host_site()
        dists, _ = hostdists.closure(list(env.requirements), hostdists.installed(host))
        for dist in dists:
            hostdists.link_distribution(dist, host, site, bin_dir)
            reused[dist.metadata["Name"]] = dist.version
    requirements = site.parent / f"{site.name}-requirements.txt"
    requirements.write_text("".join(f"{r}\n" for r in env.requirements))
    if env.requirements:
        links = [a for link in horovod_links for a in ("--find-links", link)]
        # --no-build: wheels only. Building a source distribution runs its code on this machine, and
        # what a job declares must not run here (Horovod's wheel comes built, from the cache).
        _run([uv_binary(), "pip", "install", "--no-build", *where, *source.uv_args(), *links, "-r", str(requirements)],
             log, f"environment {env.label} could not be built", source)
    installed = {d.metadata["Name"]: d.version for d in hostdists.installed(site).values()}
    return {"python": env.python or HOST_PYTHON, "requirements": list(env.requirements),
            "source": source.describe(), "installed": dict(sorted(installed.items())),
            "reused_from_host": dict(sorted(reused.items()))}
