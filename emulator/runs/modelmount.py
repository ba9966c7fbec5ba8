"""An MLflow model on a ro_mount input, as a folder MLflow loads.

A ro_mount input is one link into the node's read-only blob cache (mounts.py). MLflow's loaders
(`mlflow.pyfunc.load_model(path)`, `mlflow.<flavor>.load_model`) check every path they open, the
model's folder and then its `MLmodel` file, against its parent folder, links resolved, and refuse
one that leads out of it ("Invalid path: resolved path is outside the artifact directory"): a link
into the cache does, and so would a folder of links to the cached files. On AmlCompute the input
is a mount point, a real folder. So a folder input holding an MLflow model (an `MLmodel` file at
its top, whatever the input's declared type: mlflow_model, custom_model, uri_folder) is copied from
the node's cache into the run's input folder as the job starts, as `download` mode copies: real
files. A bind mount would avoid the copy, but a node (a running container, a sandbox made at
launch) does not see a mount made afterwards, and a hard link would let the job write into the
cache that later runs on the node read. Other folders keep the single link: a data set can be large.

Differences from a mount: the copy is the run's own (a write to it succeeds and reaches nothing
else), and blobs changed while the job runs are not seen by it."""
from __future__ import annotations

import shutil
from pathlib import Path

MLMODEL = "MLmodel"  # the file every MLflow model folder has at its top


def is_mlflow_model(cached: Path) -> bool:
    """A cached folder (the host's view of the node's cache) that MLflow would load as a model."""
    return cached.is_dir() and (cached / MLMODEL).is_file()


def copy_model(cached: Path, target: Path) -> int:
    """Copy the cached model folder to `target` (the run's own input folder, not there yet); the
    cache holds only files the host wrote. Returns the bytes copied."""
    shutil.copytree(cached, target, symlinks=False)
    return sum(p.stat().st_size for p in cached.rglob("*") if p.is_file())
