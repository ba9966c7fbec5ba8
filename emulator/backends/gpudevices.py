"""What gives a container an NVIDIA GPU without NVIDIA's container toolkit (which neither Debian
nor PyPI serves): the GPU's /dev/nvidia<minor>, the driver's control devices, and the folder of the
driver's libcuda when the loader would not find it by itself. Used by the docker backend."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

# The NVIDIA driver's devices every CUDA process opens, besides its GPUs' /dev/nvidia<minor>, as far
# as they exist when the node is created (/dev/nvidia-uvm appears with the first CUDA process on
# this machine: scripts/gpu_check.sh runs one before it creates nodes).
NVIDIA_CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
# Where the dynamic loader looks without ld.so.cache (the mirror image has none) on Debian.
DEFAULT_LIB_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
                    "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu")


def parse_gpu_minors(smi_csv: str, proc_gpus: Path) -> dict[str, str]:
    """nvidia-smi's GPU index -> the minor number of its /dev/nvidia<N> (usually equal, not always:
    the driver numbers devices in probe order, nvidia-smi in PCI order), from `nvidia-smi
    --query-gpu=index,pci.bus_id` and /proc/driver/nvidia/gpus/<bus id>/information."""
    minors = {}
    for line in smi_csv.splitlines():
        index, _, bus = (part.strip() for part in line.partition(","))
        if not index:
            continue
        domain, _, rest = bus.partition(":")  # nvidia-smi: 00000000:3B:00.0; /proc: 0000:3b:00.0
        info = proc_gpus / f"{domain[-4:]}:{rest}".lower() / "information"
        found = re.search(r"Device Minor:\s*(\d+)", info.read_text()) if info.is_file() else None
        minors[index] = found.group(1) if found else index
    return minors


def gpu_minors() -> dict[str, str]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_gpu_minors(out, Path("/proc/driver/nvidia/gpus"))


def device_nodes(gpus: list[str], minors: dict[str, str], exists=os.path.exists) -> list[str]:  # type: ignore[no-untyped-def]
    """The docker `devices` that give a node these GPUs (nvidia-smi indices) and no other. Pure."""
    if not gpus:
        return []
    paths = [f"/dev/nvidia{minors.get(g, g)}" for g in gpus] + [d for d in NVIDIA_CONTROL_DEVICES if exists(d)]
    return [f"{path}:{path}:rwm" for path in paths]


def libcuda_dir(ldconfig_output: str) -> str | None:
    """The folder of the driver's libcuda.so.1 from `ldconfig -p`, when the loader would not find it
    there by itself (no ld.so.cache in the mirror image): it goes on the node's LD_LIBRARY_PATH."""
    for line in ldconfig_output.splitlines():
        name, _, path = line.strip().partition(" => ")
        if name.startswith("libcuda.so.1 ") and ("x86-64" in name or "AArch64" in name):
            folder = str(Path(path).parent)
            return None if folder in DEFAULT_LIB_DIRS else folder
    return None


def driver_lib_dir() -> str | None:
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return libcuda_dir(out)
