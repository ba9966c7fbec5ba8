#!/usr/bin/env bash
# Packs what the GPU check needs for a GPU machine that reaches no package index (a lent device
# machine: an image with CUDA's python3 and torch, nothing to download from) into one folder that
# travels with the working tree:
#
#   bash scripts/gpu_bundle.sh [DIR] [TARGET_PACKAGES]   # DIR default .gpu-bundle (git-ignored)
#
#   wheels/   the emulator's runtime packages for the target's Python (3.12 by default), less those
#             TARGET_PACKAGES names (the target's own, one name per line; they are not shipped
#             twice): mlflow-skinny (MLflow's tracking without its UI), no cloud SDKs (adlfs,
#             azure-*), no jupyterlab (a job's interactive services)
#   sdists/   horovod's source (scripts/horovod_wheel.py builds it there) and what pip's isolated
#             build of its metadata needs (setuptools, wheel)
#   data/     the MNIST wheel of pytest_amlemu.mnist (its pinned sha256)
#   debs/     Debian 12 packages for the pieces the image may lack: Open MPI (mpirun, the
#             headers and wrappers Horovod builds with), iproute2 and tini (a process node's
#             sandbox), fuse3 (the data runtime); scripts/gpu_offline_setup.sh unpacks only those
#             whose files the target does not have
#
# Then `AMLEMU_GPU_BUNDLE=DIR bash scripts/gpu_check.sh` there. Size: ~45 MB.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$ROOT/.gpu-bundle}
HAVE=${2:-}
PY=${AMLEMU_VENV:-$ROOT/.venv}/bin/python
PYVER=${AMLEMU_GPU_PYTHON:-3.12}
CACHE=${AMLEMU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/amlemu}

# The emulator's own requirements (pyproject.toml) that a GPU check's jobs use; mlflow as its
# tracking client, mlflow-skinny (the full wheel's extra 12 MB is its UI).
RUNTIME=(mlflow-skinny==3.17.2 docker paramiko fsspec click jmespath pyyaml pathspec mfusepy psutil packaging rich
  numpy matplotlib optuna scipy starlette uvicorn cryptography certifi pytest pytest-xdist pytest-timeout mpi4py)
# Open MPI 4.1 and what it loads, the sandbox's tools, the data runtime's FUSE.
DEBS=(openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1
  libhwloc15 libhwloc-plugins libibverbs1 ibverbs-providers librdmacm1 libnl-3-200 libnl-route-3-200 libpmix2
  libpsm-infinipath1 libpsm2-2 libucx0 libnuma1 libmunge2 libltdl7
  iproute2 libbpf1 libelf1 libmnl0 libxtables12 libcap2-bin tini fuse3 libfuse3-3)
PLATFORMS=(manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_26_x86_64 manylinux_2_27_x86_64
  manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux1_x86_64 any)

rm -rf "$OUT"
mkdir -p "$OUT"/{wheels,sdists,data,debs}
platform_args=()
for p in "${PLATFORMS[@]}"; do platform_args+=(--platform "$p"); done
"$PY" -m pip download -q --disable-pip-version-check --only-binary=:all: --python-version "$PYVER" \
  --implementation cp "${platform_args[@]}" -d "$OUT/wheels" "${RUNTIME[@]}"
if [ -n "$HAVE" ]; then  # the target's own packages stay out (names compared as PEP 503 normalises them)
  "$PY" - "$OUT/wheels" "$HAVE" <<'EOF'
import re, sys
from pathlib import Path
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
have = {norm(line.strip()) for line in Path(sys.argv[2]).read_text().split() if line.strip()}
for wheel in Path(sys.argv[1]).glob("*.whl"):
    if norm(wheel.name.split("-")[0]) in have:
        wheel.unlink()
EOF
fi
"$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: -d "$OUT/sdists" horovod==0.28.1
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: -d "$OUT/sdists" setuptools wheel
"$PY" -c "import sys; from pytest_amlemu import mnist; print(mnist.fetch_wheel(__import__('pathlib').Path(sys.argv[1])))" \
  "$CACHE" | xargs -I{} cp {} "$OUT/data/"
(cd "$OUT/debs" && apt-get download "${DEBS[@]}" >/dev/null)
du -sh "$OUT" "$OUT"/*
