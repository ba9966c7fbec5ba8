"""This machine's NVIDIA GPUs and how they are dealt out to emulated nodes (one node, its own GPUs,
as each AmlCompute node has its own)."""
from __future__ import annotations

import functools
import os
import shutil
import subprocess


@functools.lru_cache(maxsize=1)
def visible_gpus() -> tuple[str, ...]:
    """Indices of the GPUs this process may use (nvidia-smi, narrowed by CUDA_VISIBLE_DEVICES).
    Asked once per process (nvidia-smi takes a while); `reset()` makes the next call ask again."""
    if not shutil.which("nvidia-smi"):
        return ()
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    found = tuple(line.strip() for line in out.splitlines() if line.strip())
    allowed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if allowed is not None:
        found = tuple(g for g in found if g in allowed.split(","))
    return found


def reset() -> None:
    """Forget the cached answer: after CUDA_VISIBLE_DEVICES or the machine's GPUs changed (tests
    that fake nvidia-smi, a long-lived process)."""
    visible_gpus.cache_clear()


def assign(gpus: tuple[str, ...], index: int, per_node: int) -> tuple[str, ...]:
    """Node `index` gets the next `per_node` GPUs, round robin (nodes share GPUs only when the
    machine has fewer than the cluster needs). Pure."""
    if not gpus or per_node <= 0:
        return ()
    return tuple(gpus[(index * per_node + k) % len(gpus)] for k in range(per_node))
