"""The curated environments amlemu knows, as data: name, version, Python, the image, and the pins of
the packages user code branches on, each with where it was read.

Sources are the environments' own build files in Azure/azureml-assets (a curated environment's
`context/Dockerfile` and `context/requirements.txt`), read at the commit named. A pin of None means
the environment does not install that package at all (a job importing it fails on Azure ML).
The ACPT environments take torch from their base image: its tag names the version
(`...-py310-torch271` is torch 2.7.1, whatever the environment's own name says).
"""
from __future__ import annotations

from dataclasses import dataclass

# The packages whose presence and version this table records (the "pins that matter").
PINNED = ("torch", "torchvision", "horovod", "mpi4py", "mlflow", "azureml-mlflow")
LATEST = "latest"  # installed unpinned (`=={{latest-pypi-version}}` in the build files)

_ASSETS = "https://github.com/Azure/azureml-assets/blob/{commit}/assets/training/general/environments/{env}/context/{file}"


def _src(commit: str, env: str, file: str) -> str:
    return _ASSETS.format(commit=commit, env=env, file=file)


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
        return package if pin.version == LATEST else f"{package}=={pin.version}"


def _acpt(name: str, version: str, folder: str, commit_docker: str, commit_reqs: str, image: str,
          torch: str) -> CuratedEnvironment:
    docker, reqs = _src(commit_docker, folder, "Dockerfile"), _src(commit_reqs, folder, "requirements.txt")
    base = f"{docker} (FROM {image}: torch {torch} in the base image's ptca conda environment)"
    absent = f"{reqs} and {docker}: not installed"
    return CuratedEnvironment(name, version, "3.10", image, {
        "torch": Pin(torch, base), "torchvision": Pin(None, absent), "horovod": Pin(None, absent),
        "mpi4py": Pin(None, absent), "mlflow": Pin(LATEST, f"{reqs} (a dependency of azureml-mlflow)"),
        "azureml-mlflow": Pin(LATEST, reqs)})


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
)


def lookup(name: str) -> CuratedEnvironment | None:
    """Curated names are matched without regard to case, as Azure ML's registry does."""
    return next((env for env in CURATED if env.name.lower() == name.lower()), None)


def is_curated_name(name: str) -> bool:
    return name.lower().startswith("azureml-")
