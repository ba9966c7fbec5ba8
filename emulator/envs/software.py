"""What a job's nodes run: its environment built (or found in the cache), or this machine's
software with the reason why not. Planned without building (`plan_software`: the dry run and the
supervisor), built as a run is prepared (`realize`; Azure ML builds its image then)."""
from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name

from amlemu.envs import contextbuild, curated, hostdists, layer
from amlemu.envs.pipsources import truthy
from amlemu.envs.build import HOST_PYTHON, OFFLINE, RECORD, BuiltEnvironment, PackageSource, build, env_prefix
from amlemu.envs.resolve import Lookup, ResolvedEnvironment, resolve


RUNTIME_PACKAGES = {"azureml-mlflow", "azureml-defaults", "azureml-core", "azureml-telemetry", "azureml-dataset-runtime",
                    "azureml-inference-server-http"}


@dataclass(frozen=True)
class Software:
    environment: ResolvedEnvironment
    prefix: str | None  # the built environment, mounted read-only at this path; None: this machine's venv
    notices: tuple[str, ...]  # what is not emulated, for the plan's notices and lifecycle.txt
    built: BuiltEnvironment | None = None
    image: str | None = None  # the job's image with the packages layered on (the engine has the image)


def curated_gaps(env: ResolvedEnvironment, dists: dict[str, Any]) -> list[str]:
    """Where this machine's venv differs from a curated environment's pins: it is built only when
    there is none (no download of a curated stack; its Python and pins are named instead)."""
    assert env.curated is not None
    gaps = [] if env.python == HOST_PYTHON else [f"Python {env.python} there, {HOST_PYTHON} here"]
    for package, pin in env.curated.pins.items():
        here = dists.get(package)
        have = here.version if here is not None else None
        if pin.version is None and have:
            gaps.append(f"{package} is not in it, here {have}: a job importing {package} passes here "
                        f"and fails on Azure ML")
        elif pin.version is not None and not _pin_met(pin.version, have):
            gaps.append(f"{package} {pin.version} there, {have or 'none'} here")
    return gaps


def _pin_met(version: str, have: str | None) -> bool:
    """Does the version installed here (None: not installed) meet a curated pin?"""
    if have is None:
        return False
    if version == curated.LATEST:
        return True
    spec = version if curated.is_specifier(version) else f"=={version}"
    try:
        return SpecifierSet(spec).contains(have, prereleases=True)
    except InvalidSpecifier:
        return False


def plan(reference: str | None, definition: dict[str, Any] | None, registered: Lookup,
         source: PackageSource | None = None) -> tuple[ResolvedEnvironment, tuple[str, ...]]:
    """(the environment to build, or one whose `build` is False: this machine's software; the
    notices naming what is not emulated). The same for a dry run, a submit and the run itself."""
    env = resolve(reference, definition, registered)
    notices = list(env.notices)
    if env.kind == "build":
        notices.append(f"environment {env.label}: its Docker build context {env.build_path} is built by the engine "
                       "as the run is prepared where the engine has its base images (nothing pulled, RUN steps "
                       "without network); else nodes run this machine's software")
    if env.curated is not None:
        gaps = curated_gaps(env, hostdists.installed(hostdists.host_site()))
        if gaps:
            notices.append(f"environment {env.label} is not built here (its packages are not on this machine and "
                           f"are not downloaded): nodes run this machine's software; differences: {'; '.join(gaps)}")
            return replace(env, build=False), tuple(notices)
        notices.append(f"environment {env.label}: only its pinned packages are emulated, not its image {env.image}")
    if env.build:
        env, skipped = without_runtime(env, source)  # None: what the variables say (pip's sources not read)
        if skipped:
            notices.append(f"environment {env.label}: {', '.join(skipped)} not installed here (Azure ML's runtime "
                           f"packages, not on this machine; nodes track MLflow to a local store): set "
                           f"AMLEMU_PACKAGE_INDEX to install them")
        notices.append(f"environment {env.label}: nodes run exactly its packages ({', '.join(env.requirements) or 'none'}), "
                       f"built as the run is prepared (cached)")
    return env, tuple(notices)


def planned_notices(reference: str | None, definition: dict[str, Any] | None, registered: Lookup) -> tuple[str, ...]:
    """What a dry run and a submit say of the job's environment, without building it."""
    return plan(reference, definition, registered)[1]


@dataclass(frozen=True)
class SoftwarePlan:
    """What a job's nodes will run, decided without building anything: the environment's folder in
    the cache (named by its content hash), the image's tag, or this machine's software (both None).
    The dry run shows it; the supervisor realizes it (`realize`) into the same paths and tags."""

    environment: ResolvedEnvironment
    notices: tuple[str, ...]
    prefix: str | None = None
    image: str | None = None
    built: bool = True  # already in the cache or the engine (or nothing to build)
    source: PackageSource | None = None  # read only when there is something to build
    dockerfile: Path | None = None  # a build context's, when the engine builds it

    def to_dict(self) -> dict[str, Any]:
        runs = (f"environment {self.environment.label} at {self.prefix}" if self.prefix else
                f"image {self.image}" if self.image else "this machine's software")
        state = "" if not (self.prefix or self.image) else (
            " (built already)" if self.built else " (to be built as the run is prepared, then cached)")
        return {"environment": self.environment.label, "prefix": self.prefix, "image": self.image,
                "built": self.built, "runs": runs + state}


def plan_software(reference: str | None, definition: dict[str, Any] | None, registered: Lookup, cache: Path,
                  source: PackageSource | None = None, has_image: Callable[[str], bool] = lambda _: False
                  ) -> SoftwarePlan:
    """What will run, and whether it is built already; nothing is built (a dry run's and the supervisor's)."""
    env, notices = plan(reference, definition, registered, source)
    if env.kind == "build":  # a build context: the image the engine builds from it, or this machine's software
        dockerfile, why_not = contextbuild.plan(env, has_image)
        if dockerfile is None:
            return SoftwarePlan(env, (*notices[:-1], str(why_not)))
        tag = contextbuild.context_tag(env, dockerfile)
        return SoftwarePlan(env, notices, image=tag, built=has_image(tag), dockerfile=dockerfile)
    if not env.build:
        return SoftwarePlan(env, notices)
    source = source or PackageSource.from_env()  # pip's configuration is read only for a build
    if env.image and has_image(env.image):  # the docker backend runs the image: the packages go on top of it
        tag = layer.planned_tag(env, source)
        return SoftwarePlan(env, notices, image=tag, built=has_image(tag), source=source)
    prefix = env_prefix(env, cache, source)
    return SoftwarePlan(env, notices, prefix=str(prefix), built=(prefix / RECORD).is_file(), source=source)


def realize(planned: SoftwarePlan, cache: Path, log: Callable[[str], None] = lambda _: None) -> Software:
    """The planned software, built now where it is not yet (as the run is prepared): the same
    prefix or tag the plan named."""
    env, notices, source = planned.environment, planned.notices, planned.source
    if planned.dockerfile is not None:
        tag, reused = contextbuild.build_context(env, planned.dockerfile, cache, log)
        log(f"environment {env.label}: image {tag} ({'reused' if reused else 'built'} from its build context)")
        return Software(env, None, notices, image=tag)
    if env.kind == "build" and notices:  # a build context not built here: the reason why
        log(f"notice: {notices[-1]}")
    if source is None:
        return Software(env, None, notices)
    log(f"environment {env.label}: preparing (Python {env.python or HOST_PYTHON}; {', '.join(env.requirements) or 'no packages'}; "
        f"package source: {source.describe()})")
    if planned.image:
        tag, reused = layer.build_layer(env, cache, source)
        log(f"environment {env.label}: image {tag} ({'reused' if reused else 'built'}: {env.image} with its packages "
            f"layered on by docker build)")
        return Software(env, None, notices, image=tag)
    built = build(env, cache, source, horovod_links=horovod_links(env, cache))
    how = "reused from the cache" if built.reused else f"built in {built.record.get('build_seconds')} s"
    log(f"environment {env.label}: {how} at {built.prefix} ({len(built.record.get('installed', {}))} packages; "
        f"{len(built.record.get('reused_from_host', {}))} linked from this machine's venv)")
    return Software(env, str(built.prefix), notices, built)


def software_for(reference: str | None, definition: dict[str, Any] | None, registered: Lookup, cache: Path,
                 source: PackageSource | None = None, log: Callable[[str], None] = lambda _: None,
                 has_image: Callable[[str], bool] = lambda _: False) -> Software:
    """The job's software, planned and built (or found in the cache)."""
    return realize(plan_software(reference, definition, registered, cache, source, has_image), cache, log)


def without_runtime(env: ResolvedEnvironment, source: PackageSource | None) -> tuple[ResolvedEnvironment, list[str]]:
    """Azure ML's own runtime packages (azureml-mlflow routes MLflow to the workspace) are left out
    unless they are on this machine or AMLEMU_PACKAGE_INDEX names an index for them: the emulator
    plays their part (a download of Azure's SDK stack for a job that never reaches Azure)."""
    runtime = {r: name for r in env.requirements
               if (name := canonicalize_name(re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0])) in RUNTIME_PACKAGES}
    explicit = source.explicit_index if source is not None else bool(
        os.environ.get("AMLEMU_PACKAGE_INDEX")) and not truthy(os.environ.get(OFFLINE, ""))
    if explicit or not runtime:
        return env, []
    have = hostdists.installed(hostdists.host_site())  # read only when there is something to look up
    skipped = [r for r, name in runtime.items() if name not in have]
    return replace(env, requirements=tuple(r for r in env.requirements if r not in skipped)), skipped


def horovod_links(env: ResolvedEnvironment, cache: Path) -> tuple[str, ...]:
    """Horovod has no wheel on PyPI: a declared horovod comes from the wheel the project's recipe
    (scripts/horovod_wheel.py) built against the environment's torch, when it is in the cache."""
    torch = next((r.split("==", 1)[1] for r in env.requirements if r.replace(" ", "").startswith("torch==")), None)
    if torch is None or not any(r.lower().startswith("horovod") for r in env.requirements):
        return ()
    return tuple(str(p) for p in sorted((cache / "horovod").glob(f"horovod*-torch{torch}*")) if p.is_dir())



MISSING_RE = re.compile(r"(?:ModuleNotFoundError|ImportError): No module named '([\w.]+)'")


def missing_import(reason: str, software: Software | None, log: Callable[[str], None]) -> str | None:
    """A failed job whose log shows an import its environment lacks: the notice naming both."""
    match = MISSING_RE.search(reason)
    if not match or software is None:
        return None
    module = match.group(1).split(".")[0]
    where = f"environment {software.environment.label}" if software.prefix else "this machine's software"
    env = software.environment.curated
    pinned = env.requirement(module.replace("_", "-")) if env is not None and software.prefix is None else None
    hint = (f"the job imports {module}, which environment {software.environment.label} has ({pinned}) but this "
            f"machine's software, which runs in its place, does not (a curated stack is not downloaded): install it "
            f"in this machine's venv, or name an environment with a conda file that declares it") if pinned else (
            f"the job imports {module}, which {where} does not contain; declare it in the "
            f"environment (its conda file's pip list)")
    log(f"notice: {hint}")
    return hint
