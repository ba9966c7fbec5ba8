"""Which environment a job names, resolved as Azure ML resolves it, into pure data: the Python and
the pip requirements to build, the image, and what cannot be emulated here. No I/O.

A job's `environment` is one of:
- `azureml:<Name>@latest` / `azureml:<Name>:<version>`: a curated environment (names starting
  `AzureML-`, from curated.py) or one registered in the workspace (`amlemu environment create`);
- an inline definition: `image` (+ `conda_file`), or `build.path` (a Docker build context);
- an image reference alone.
"""
from __future__ import annotations

import hashlib
import json
import platform
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from amlemu.envs import curated
from amlemu.errors import ConfigError

REF_RE = re.compile(r"^azureml:(?P<name>[A-Za-z0-9][\w.-]*)(?:@(?P<label>[\w.-]+)|:(?P<version>[\w.-]+))?$")
# A registry's asset: azureml://registries/<registry>/environments/<name>/(versions/<v>|labels/<label>)
REGISTRY_RE = re.compile(r"^azureml://registries/(?P<registry>[A-Za-z0-9][\w-]*)/environments/"
                         r"(?P<name>[A-Za-z0-9][\w.-]*)(?:/versions/(?P<version>[\w.-]+)|/labels/(?P<label>[\w.-]+))?/?$")
REF_FIX = ("write azureml:<name>@latest, azureml:<name>:<version>, or "
           "azureml://registries/azureml/environments/<name>/labels/latest (or /versions/<version>)")
# Conda packages that are not Python packages: the OS / native layer an image brings, not emulated.
NATIVE = re.compile(r"^(cuda.*|cudatoolkit|cudnn|nccl|openmpi|mpich|gcc.*|gxx.*|libgcc.*|libstdcxx.*|_libgcc_mutex|"
                    r"_openmp_mutex|ca-certificates|openssl|mkl.*|blas|libblas|liblapack|intel-openmp|ld_impl.*|"
                    r"ncurses|readline|sqlite|tk|xz|zlib|bzip2|libffi|libuuid|nvidia-apex|git|cmake|make|ninja)$",
                    re.IGNORECASE)
CONDA_TO_PIP = {"pytorch": "torch", "pytorch-cuda": None, "pytorch-cpu": "torch", "py-xgboost": "xgboost"}
Lookup = Callable[[str, str | None], dict[str, Any] | None]  # (name, version or None for latest)


@dataclass(frozen=True)
class ResolvedEnvironment:
    """What a job's nodes run. `requirements` empty and `build` False: this machine's software."""

    label: str  # how notices name it: azureml:Name@latest, the image, "inline conda file"
    kind: str  # none | curated | registered | inline | image | build
    python: str | None = None  # "3.11"; None: this machine's Python
    requirements: tuple[str, ...] = ()
    image: str | None = None
    build_path: str | None = None  # a Docker build context (build.path)
    dockerfile: str = "Dockerfile"  # build.dockerfile_path, relative to the context
    build: bool = False  # a Python environment is to be built from `requirements`
    curated: curated.CuratedEnvironment | None = None
    notices: tuple[str, ...] = field(default=())  # what cannot be emulated, one line each

    def key(self, source: dict[str, Any]) -> str:
        """The content hash the built environment is cached under (the package source included)."""
        blob = json.dumps({"python": self.python, "requirements": sorted(self.requirements), "source": source,
                           "format": 1}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class EnvRef:
    """An environment by reference: a workspace's (registry None) or a registry's."""

    name: str
    version: str | None = None  # None: the latest
    registry: str | None = None

    @property
    def label(self) -> str:
        if self.registry:
            tail = f"versions/{self.version}" if self.version else "labels/latest"
            return f"azureml://registries/{self.registry}/environments/{self.name}/{tail}"
        return f"azureml:{self.name}" + (f":{self.version}" if self.version else "@latest")


def parse_ref(ref: str) -> EnvRef | None:
    """`azureml:Name@latest` -> EnvRef(Name); `azureml:Name:3` -> EnvRef(Name, "3");
    `azureml://registries/R/environments/Name/labels/latest` -> EnvRef(Name, None, R); an image -> None."""
    ref = ref.strip()
    match = REF_RE.match(ref) or REGISTRY_RE.match(ref)
    if not match:
        if ref.startswith("azureml:"):
            raise ConfigError("environment", f"'{ref}' is not an environment reference", REF_FIX)
        return None
    label = match.group("label")
    if label and label != "latest":
        raise ConfigError("environment", f"label '{label}' of {ref} is not supported",
                          "use the label latest (@latest, /labels/latest) or a version")
    registry = match.groupdict().get("registry")
    return EnvRef(match.group("name"), match.group("version"), registry)


def conda_requirement(spec: str) -> str | None:
    """A conda match spec (`numpy=1.26`, `conda-forge::numpy==1.26.4=py311_0`) as a pip requirement
    (`numpy==1.26.*`); None for the packages that are not Python packages."""
    match = re.match(r"^([A-Za-z0-9_.-]+)\s*(.*)$", spec.split("::")[-1].strip())
    if not match:
        raise ConfigError("conda_file.dependencies", f"'{spec}' is not a conda package spec")
    name, rest = CONDA_TO_PIP.get(match.group(1).lower(), match.group(1)), match.group(2).strip()
    if name is None or NATIVE.match(name):
        return None
    if not rest:
        return name
    if rest.startswith("=="):
        return f"{name}=={rest[2:].split('=')[0].strip()}"
    if rest.startswith("=") or rest[0].isdigit():  # conda's `=1.26` (or `1.26`) is the prefix 1.26.*
        version = rest.lstrip("=").split("=")[0].strip()
        return f"{name}=={version}" if version.endswith("*") else f"{name}=={version}.*"
    return f"{name}{rest}"


def python_version(spec: str) -> str | None:
    """`=3.11`, `3.11.7`, `==3.11.*` -> "3.11"; a range (`>=3.9,<3.13`) -> the lowest it names, unless
    this machine's Python is in it (None: this machine's, as conda would pick an installed one)."""
    spec = spec.strip()
    if not spec:
        return None
    if re.match(r"^(==?)?\s*\d", spec):
        return ".".join(re.findall(r"\d+", spec)[:2])
    try:
        if SpecifierSet(spec.replace(" ", "")).contains(platform.python_version()):
            return None
    except InvalidSpecifier:
        raise ConfigError("conda_file.dependencies", f"python{spec} is not a version spec") from None
    found = re.search(r"\d+\.\d+", spec)
    return found.group(0) if found else None


def requirement(text: str) -> Requirement | None:
    """The PEP 508 requirement `text` is, else None. A requirement is one line of printable text;
    packaging raises more than InvalidRequirement for some others (a newline inside a marker's
    quoted string is a SyntaxError from its literal parser)."""
    if not text.isprintable():
        return None
    try:
        return Requirement(text)
    except (InvalidRequirement, SyntaxError, ValueError):
        return None


def _not_installable(line: str) -> str | None:
    """Why a requirement of a job's conda file (a pip line or a converted conda package) is not
    installed, if so. The job is untrusted code and its environment is built on this machine: only
    a plain PEP 508 requirement (a name and versions, from the emulator's package source) is; a URL
    would fetch from anywhere and build what it finds."""
    req = requirement(line)
    if req is None:
        return "not a requirement (name, extras, versions)"
    return ("a direct URL reference; packages come from pip's configured sources (or AMLEMU_PACKAGE_INDEX / "
            "AMLEMU_FIND_LINKS)") if req.url else None


def from_conda(conda: dict[str, Any], where: str) -> tuple[str | None, list[str], list[str]]:
    """(python version, pip requirements, notices) of a conda environment file's content."""
    deps = conda.get("dependencies") or []
    if not isinstance(deps, list):
        raise ConfigError(f"{where}.dependencies", "must be a list")
    python, requirements, notices = None, [], []
    for dep in deps:
        if isinstance(dep, dict) and "pip" in dep:
            for line in dep["pip"] or []:
                line = str(line).strip()
                if line.startswith("-"):
                    notices.append(f"{where}: pip option '{line.split()[0]}' is not used here; packages come from "
                                   f"pip's configured sources (or AMLEMU_PACKAGE_INDEX / AMLEMU_FIND_LINKS)")
                elif line and (why := _not_installable(line)):
                    notices.append(f"{where}: '{line}' is not installed here: {why}")
                elif line:
                    requirements.append(line)
            continue
        text = str(dep).strip()
        head = re.split(r"[=<>! ]", text.split("::")[-1], maxsplit=1)[0].lower()
        if head == "python":
            python = python_version(text.split("::")[-1][len("python"):])
        elif head == "pip":
            continue
        elif (req := conda_requirement(text)) is None:
            notices.append(f"{where}: conda package '{text}' is not a Python package and is not emulated "
                           f"(nodes use this machine's libraries)")
        elif why := _not_installable(req):  # the pip rule: a URL (or what is no requirement) is never fetched
            notices.append(f"{where}: conda package '{text}' is not installed here: {why}")
        else:
            requirements.append(req)
    return python, requirements, notices


def _inline(definition: dict[str, Any], label: str, kind: str) -> ResolvedEnvironment:
    image, conda = definition.get("image"), definition.get("conda_file")
    if definition.get("build_path"):  # built by the engine where it can be (contextbuild.py), as the run is prepared
        return ResolvedEnvironment(label, "build", build_path=definition["build_path"],
                                   dockerfile=str(definition.get("dockerfile_path") or "Dockerfile"))
    if conda is None:  # the image's packages are its own: used where the engine has it (the backend's note)
        return ResolvedEnvironment(label, "image", image=image)
    python, requirements, notices = from_conda(conda, f"environment {label} conda_file")
    if image:
        notices.append(f"environment {label}: the OS packages and CUDA of image {image} are not emulated; "
                       f"its Python packages are the conda file's")
    return ResolvedEnvironment(label, kind, python=python, requirements=tuple(requirements), image=image,
                               build=True, notices=tuple(notices))


def resolve(reference: str | None, definition: dict[str, Any] | None, registered: Lookup) -> ResolvedEnvironment:
    """The environment a job names (its `environment` field, and the inline definition when it has one)."""
    if definition:
        return _inline(definition, definition.get("image") or definition.get("name") or "inline", "inline")
    if not reference:  # Azure ML requires one: `job validate` and the submit's findings say so
        return ResolvedEnvironment("none", "none")
    parsed = parse_ref(reference)
    if parsed is None:
        return _inline({"image": reference}, reference, "image")
    if parsed.registry is None:
        found = registered(parsed.name, parsed.version)
        if found is not None:
            return _inline(found, parsed.label, "registered")
    return _curated(parsed)


def _curated(ref: EnvRef) -> ResolvedEnvironment:
    """A curated environment: from the azureml registry, or by its AzureML- name in a workspace (where
    a name that is neither registered nor curated is refused, naming both ways to fix it)."""
    if ref.registry is not None and ref.registry.lower() != curated.REGISTRY:
        raise ConfigError("environment", f"{ref.label}: registry '{ref.registry}' is not emulated (the registry "
                          f"that exists here is {curated.REGISTRY}, with {curated.known_names()})",
                          f"name an environment of azureml://registries/{curated.REGISTRY}, or register yours "
                          "in the workspace (`amlemu environment create -f env.yml`) and write azureml:<name>@latest")
    env = curated.lookup(ref.name)
    if env is None:
        if ref.registry is None and not curated.is_curated_name(ref.name):
            raise ConfigError("environment", f"{ref.label} is not registered in this workspace",
                              "register it with `amlemu environment create -f env.yml`, or name a curated one "
                              f"({curated.known_names()})")
        raise ConfigError("environment", f"{ref.label}: curated environment {ref.name} is not in amlemu's table "
                          f"(it has {curated.known_names()})",
                          "name one of those, or register an environment with its image and conda file "
                          "(`amlemu environment create -f env.yml`)")
    requirements = tuple(r for p in env.pins if (r := env.requirement(p)))
    notices = () if ref.version is None else (
        f"environment {ref.label}: version {ref.version} is emulated with the pins of {env.name}@latest "
        f"(amlemu's table records one version of each curated environment)",)
    return ResolvedEnvironment(ref.label, "curated", python=env.python, requirements=requirements, image=env.image,
                               build=True, curated=env, notices=notices)
