"""Reusing this machine's installed packages in a built environment, cheaply and exactly.

A declared requirement that this machine's venv already satisfies (same name, a version the
specifier accepts) is not downloaded or built again: its files, as its RECORD lists them, are
hard-linked into the new environment (copied where the cache is on another file system), with the
requirements it declares in turn (extras and markers honoured). Only that closure is linked, so
the environment holds the declared packages and their dependencies and nothing else of the venv:
an undeclared import still fails, which a `--system-site-packages` layering (the whole venv visible
behind the environment) would not give. uv then installs what is left and sees the linked
distributions as installed.
"""
from __future__ import annotations

import os
import shutil
import sysconfig
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name

from amlemu.envs.resolve import requirement


def host_site() -> Path:
    """The site-packages of the venv the emulator runs in (the nodes' software when no environment)."""
    return Path(sysconfig.get_paths()["purelib"])


def installed(site: Path) -> dict[str, metadata.Distribution]:
    """The distributions installed at `site`, by canonical name. Named by their metadata folder
    (`<name>-<version>.dist-info`, the name's dashes written as underscores), so nothing is parsed
    until a distribution is used: parsing every METADATA cost ~70 ms a submit and a supervisor."""
    found: dict[str, metadata.Distribution] = {}
    try:
        folders = sorted(site.iterdir())
    except OSError:
        return found
    for folder in folders:
        if folder.suffix in (".dist-info", ".egg-info") and folder.is_dir():
            found.setdefault(canonicalize_name(folder.name.split("-", 1)[0]), metadata.PathDistribution(folder))
    return found


def closure(requirements: list[str], dists: dict[str, metadata.Distribution]
            ) -> tuple[list[metadata.Distribution], list[str]]:
    """(the installed distributions that satisfy `requirements` with all they require, the
    requirements this machine cannot satisfy)."""
    todo: list[tuple[str, str]] = [(r, "") for r in requirements]  # (requirement, the extra it came under)
    extras_seen: dict[str, set[str]] = {}
    unmet: list[str] = []
    while todo:
        text, extra = todo.pop()
        req = requirement(text)
        if req is None:
            unmet.append(text)
            continue
        if req.marker and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        dist = dists.get(name)
        if req.url or dist is None or not req.specifier.contains(dist.version, prereleases=True):
            unmet.append(str(req))
            continue
        wanted = set(req.extras) | {""}
        if name in extras_seen and wanted <= extras_seen[name]:
            continue
        new = wanted - extras_seen.get(name, set())
        extras_seen.setdefault(name, set()).update(wanted)
        todo += [(dep, e) for dep in dist.requires or [] for e in sorted(new)]
    return [dists[n] for n in sorted(extras_seen)], sorted(set(unmet))


def link_distribution(dist: metadata.Distribution, site: Path, env_site: Path, env_bin: Path) -> int:
    """Hard-link (else copy) one distribution's files into the environment; console scripts are
    rewritten to start the environment's Python. Returns the number of files."""
    host_bin = Path(sysconfig.get_paths()["scripts"])
    count = 0
    for rel in dist.files or []:
        src = Path(os.path.normpath(site / rel))
        if not src.is_file():
            continue  # RECORD may list files since removed (a .pyc)
        if src.is_relative_to(site):
            dest = env_site / src.relative_to(site)
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not dest.exists():
                try:
                    os.link(src, dest)
                except OSError:
                    shutil.copy2(src, dest)
        elif src.parent == host_bin:
            dest = env_bin / src.name
            data = src.read_bytes()
            if data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
                data = b"#!" + str(env_bin / "python").encode() + b"\n" + data.split(b"\n", 1)[1]
            dest.write_bytes(data)
            dest.chmod(0o755)
        else:
            continue  # headers, data files: not what an import needs
        count += 1
    return count
