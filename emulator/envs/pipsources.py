"""The package sources the user's pip has: what `pip config list` prints (pip's configuration files,
global, user and site, and the PIP_* variables, merged by pip itself), read once per process for a
given set of PIP_* variables. Environments are built from them by default, as `pip install` would
install; with none configured, that is PyPI (pip's default index).

Precedence, as pip applies it to `pip install`: a PIP_* variable (`:env:`) over the `[install]`
section over `[global]`. Values of the list options are whitespace-separated, as in pip.conf.
"""
from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass

SECTIONS = (":env:", "install", "global")  # the first that sets an option wins
LINE = re.compile(r"^(?P<section>[^.]+)\.(?P<key>[a-z0-9-]+)=(?P<value>.*)$")


@dataclass(frozen=True)
class PipSources:
    index_url: str | None = None  # None: PyPI
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    constraints: tuple[str, ...] = ()
    no_index: bool = False
    cert: str | None = None
    origin: str = "pip's configuration (none set: PyPI)"


def truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def parse(text: str) -> dict[str, str]:
    """`pip config list`'s lines (`global.find-links='/opt/wheels'`) -> option -> value, by precedence."""
    found: dict[tuple[str, str], str] = {}
    for line in text.splitlines():
        match = LINE.match(line.strip())
        if not match or match["section"] not in SECTIONS:
            continue
        try:
            value = ast.literal_eval(match["value"])  # pip prints each value with repr()
        except (ValueError, SyntaxError):
            continue
        found[(match["section"], match["key"])] = str(value)
    options: dict[str, str] = {}
    for section in reversed(SECTIONS):
        options |= {key: value for (where, key), value in found.items() if where == section}
    return options


def from_options(options: Mapping[str, str]) -> PipSources:
    def words(key: str) -> tuple[str, ...]:
        return tuple(options.get(key, "").split())

    named = sorted(k for k in ("index-url", "extra-index-url", "find-links", "no-index") if options.get(k))
    origin = f"pip's configuration ({', '.join(named)})" if named else PipSources.origin
    return PipSources(options.get("index-url") or None, words("extra-index-url"), words("find-links"),
                      words("constraint"), truthy(options.get("no-index", "")), options.get("cert") or None, origin)


def pip_sources(environ: Mapping[str, str]) -> PipSources:
    """The sources of the pip beside this Python, under `environ`'s PIP_* variables."""
    relevant = tuple(sorted((k, v) for k, v in environ.items()
                            if k.startswith("PIP_") or k in ("HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "VIRTUAL_ENV")))
    return _read(relevant)


@functools.lru_cache(maxsize=8)
def _read(environ: tuple[tuple[str, str], ...]) -> PipSources:
    env = dict(environ) | {"PATH": "/usr/bin:/bin", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                              env=env, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return PipSources(origin="PyPI (pip's configuration could not be read)")
    if done.returncode:  # no pip here: pip's default, as a pip installed later would have it
        return PipSources(origin="PyPI (no pip to read a configuration from)")
    return from_options(parse(done.stdout))
