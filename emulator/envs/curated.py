"""The curated environments amlemu knows, as data: name, version, Python, the image, and the pins of
the packages user code branches on, each with where it was read.

Sources are the environments' own build files in Azure/azureml-assets (a curated environment's
`context/Dockerfile` and its `context/requirements.txt` or `context/conda_dependencies.yaml`), read
at the commit named. A pin is an exact version, a version specifier as the build file writes it
(`~=1.5.0`), LATEST, or None: the environment does not install that package at all (a job importing
it fails on Azure ML). Each environment pins the packages user code of its kind branches on.
The ACPT environments take torch from their base image: its tag names the version
(`...-py310-torch271` is torch 2.7.1, whatever the environment's own name says).
"""
from __future__ import annotations

from dataclasses import dataclass

# The packages whose presence and version the PyTorch environments record (the pins that matter to
# distributed training code).
PINNED = ("torch", "torchvision", "horovod", "mpi4py", "mlflow", "azureml-mlflow")
LATEST = "latest"  # installed unpinned (`=={{latest-pypi-version}}` in the build files)
REGISTRY = "azureml"  # the one registry of curated environments (azureml://registries/azureml/...)
PREFIX = "AzureML-"  # a curated name in a workspace; the registry names it without the prefix

_ASSETS = "https://github.com/Azure/azureml-assets/blob/{commit}/assets/{kind}/environments/{env}/context/{file}"
_HEAD = "4b41f8ccbc01cf492767adc586ce1661c54c340a"  # azureml-assets' main, read 2026-12 (committed 2026-07-23)


def _src(commit: str, env: str, file: str, kind: str = "training/general") -> str:
    return _ASSETS.format(commit=commit, env=env, file=file, kind=kind)


def is_specifier(version: str) -> bool:
    return version[:1] in "~=<>!"


@dataclass(frozen=True)
class Pin:
    version: str | None  # an exact version, LATEST, or None: not installed
    source: str


@dataclass(frozen=True)
class CuratedEnvironment:
    name: str
    version: str  # the version `@latest` resolved to when the pins were read
    python: str
    image: str
    pins: dict[str, Pin]

    def requirement(self, package: str) -> str | None:
        """The pip requirement the pin stands for (None: not installed)."""
        pin = self.pins.get(package)
        if pin is None or pin.version is None:
            return None
        if pin.version == LATEST:
            return package
        return f"{package}{pin.version}" if is_specifier(pin.version) else f"{package}=={pin.version}"

    @property
    def short_name(self) -> str:
        """The name in the azureml registry (azureml://registries/azureml/environments/<short_name>)."""
        return self.name[len(PREFIX):] if self.name.lower().startswith(PREFIX.lower()) else self.name


def _acpt(name: str, version: str, folder: str, commit_docker: str, commit_reqs: str, image: str,
          torch: str) -> CuratedEnvironment:
    docker, reqs = _src(commit_docker, folder, "Dockerfile"), _src(commit_reqs, folder, "requirements.txt")
    base = f"{docker} (FROM {image}: torch {torch} in the base image's ptca conda environment)"
    absent = f"{reqs} and {docker}: not installed"
    return CuratedEnvironment(name, version, "3.10", image, {
        "torch": Pin(torch, base), "torchvision": Pin(None, absent), "horovod": Pin(None, absent),
        "mpi4py": Pin(None, absent), "mlflow": Pin(LATEST, f"{reqs} (a dependency of azureml-mlflow)"),
        "azureml-mlflow": Pin(LATEST, reqs)})


def _pip_env(name: str, folder: str, python: str, image: str, pins: dict[str, str | None], *,
             kind: str = "training/general", commit: str = _HEAD) -> CuratedEnvironment:
    """An environment whose packages its conda_dependencies.yaml lists (the Dockerfile installs that
    file, or the same list by `pip install`); a pin of None: not in the file."""
    conda = _src(commit, folder, "conda_dependencies.yaml", kind)
    docker = _src(commit, folder, "Dockerfile", kind)
    return CuratedEnvironment(name, "latest", python, image, {
        package: Pin(version, f"{conda}" if version is not None else f"{conda} and {docker}: not installed")
        for package, version in pins.items()})


_OPENMPI = "mcr.microsoft.com/azureml/openmpi5.0-ubuntu24.04:latest"
_AZUREML = {"azureml-core": LATEST, "azureml-defaults": LATEST, "azureml-mlflow": LATEST}
_NO_TORCH = {"torch": None, "horovod": None}

_LEGACY_DOCKERFILE = ("https://github.com/colonel8377/hkust_machine_learning/blob/HEAD/Dockerfile "
                      "(a copy of the curated environment's published Dockerfile)")

CURATED: tuple[CuratedEnvironment, ...] = (
    _acpt("AzureML-ACPT-pytorch-2.2-cuda12.1", "latest", "acpt-pytorch-2.2-cuda12.1",
          "113518cd2a660e99bc2282bc4cf238ef5c8c9483", "01da807f330e509148ba88afd718e74a128f8124",
          "mcr.microsoft.com/aifx/acpt/stable-ubuntu2204-cu118-py310-torch271", "2.7.1"),
    _acpt("AzureML-acpt-pytorch-2.8-cuda12.6", "latest", "acpt-pytorch-2.8-cuda12.6",
          "0665949b809dfb620a8c6f9321c566b0a1cd4c1c", "0103fd16903e3cba56975012d96b57876b4ae0e6",
          "mcr.microsoft.com/aifx/acpt/stable-ubuntu2204-cu126-py310-torch280", "2.8.0"),
    # The last curated PyTorch environment with Horovod (deprecated; Python 3.8, torch 1.10).
    CuratedEnvironment("AzureML-pytorch-1.10-ubuntu18.04-py38-cuda11-gpu", "latest", "3.8",
                       "mcr.microsoft.com/azureml/openmpi4.1.0-cuda11.1-cudnn8-ubuntu18.04", {
                           "torch": Pin("1.10.0", _LEGACY_DOCKERFILE), "torchvision": Pin("0.11.1", _LEGACY_DOCKERFILE),
                           "horovod": Pin("0.21.3", _LEGACY_DOCKERFILE), "mpi4py": Pin(None, _LEGACY_DOCKERFILE),
                           "mlflow": Pin(LATEST, f"{_LEGACY_DOCKERFILE}: a dependency of azureml-mlflow"),
                           "azureml-mlflow": Pin("1.35.0", _LEGACY_DOCKERFILE)}),
    # The environment most of Azure ML's examples name (azureml-examples' cli/jobs/basics).
    _pip_env("AzureML-sklearn-1.5", "sklearn-1.5", "3.10", _OPENMPI, {
        "scikit-learn": "~=1.5.0", "pandas": "~=1.5.3", "numpy": "~=1.22.0", "scipy": "~=1.10.0",
        "joblib": "~=1.2.0", "matplotlib": "~=3.5.0", **_AZUREML, "lightgbm": None, **_NO_TORCH}),
    _pip_env("AzureML-lightgbm-3.3", "lightgbm-3.3", "3.10", _OPENMPI, {
        "lightgbm": ">=4.6.0", "scikit-learn": "~=1.5.1", "xgboost": "~=1.7.6", "pandas": "~=1.5.3",
        "numpy": "~=1.22.0", "scipy": "~=1.10.0", "matplotlib": "~=3.5.0", **_AZUREML, **_NO_TORCH}),
    _pip_env("AzureML-tensorflow-2.16-cuda12", "tensorflow-2.16-cuda12", "3.11",
             "nvcr.io/nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04", {
                 "tensorflow": "==2.16.2", "tf-keras": "==2.16.0", "tensorboard": "~=2.16.0", "pandas": "==2.2.2",
                 "numpy": "==1.23.5", "scipy": "~=1.14.0", **_AZUREML, **_NO_TORCH}),
    _pip_env("AzureML-minimal-py311-inference", "minimal-py311-inference", "3.11",
             "mcr.microsoft.com/azureml/inference-base-2204:latest", {
                 "numpy": LATEST, "joblib": LATEST, "azureml-inference-server-http": LATEST, "scikit-learn": None,
                 "pandas": None, "azureml-mlflow": None, **_NO_TORCH}, kind="inference"),
)


def lookup(name: str) -> CuratedEnvironment | None:
    """Curated names are matched without regard to case, as Azure ML's registry does, with or
    without the `AzureML-` prefix (the registry's name has none, the workspace's has it)."""
    wanted = name.lower().removeprefix(PREFIX.lower())
    return next((env for env in CURATED if env.short_name.lower() == wanted), None)


def is_curated_name(name: str) -> bool:
    return name.lower().startswith(PREFIX.lower())


def known_names() -> str:
    return ", ".join(env.name for env in CURATED)
