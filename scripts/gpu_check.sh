#!/usr/bin/env bash
# shellcheck disable=SC2317 # the steps' functions are called through `step`, which shellcheck cannot see
# The GPU check (`make gpu-check`): the GPU path end to end, on a machine with NVIDIA GPUs.
#
#   setup          scripts/setup.sh with AMLEMU_HOROVOD_GPU_OPERATIONS=NCCL: Debian packages, Docker,
#                  the venv with torch 2.14.1 (PyPI's Linux wheel is the CUDA 13 build), Horovod built
#                  with CUDA and NCCL (a CUDA toolkit from PyPI's wheels when there is no nvcc), MNIST
#   torch-cuda     torch is a CUDA build and computes on the GPU
#   horovod-nccl   Horovod has NCCL operations (rebuilt and reinstalled if the venv's has none)
#   (a) nodes      the seed's job on emulated nodes (docker's, else process) with 1 GPU each; each rank sees only its
#                  own GPU (with one GPU: see scripts/gpu_check.py for what runs instead)
#   (b) nccl       a Horovod allreduce of a CUDA tensor over NCCL
#   (c) pytest     pytest -m gpu examples (the plugin's GPU-per-node test), on the same nodes
#
# Offline (a GPU machine that reaches no package index, as the lent device machines): with
# AMLEMU_GPU_BUNDLE=DIR (made here by scripts/gpu_bundle.sh, carried there) the setup is
# scripts/gpu_offline_setup.sh instead: the machine's own python3 and CUDA torch, the bundle's
# wheels and Debian packages, Horovod built from the bundle's source. The nodes are docker's where an
# engine answers, else the process backend's (AMLEMU_GPU_CHECK_BACKEND chooses).
#
# One report line per step (ok/FAILED, seconds, its last output line); exit 0 when all passed,
# 1 when any failed, 2 without an NVIDIA GPU (then it installs nothing). Each step's full output:
# ~/.cache/amlemu/gpu-check/. Safe to run again: every install is checked first and cached, so a
# second run spends its time on the checks. First run on a GPU (1 x H200, 16 cores, offline, process
# nodes: docs/testing.md): 3 minutes, 100 s of it Horovod's NCCL build.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUNDLE=${AMLEMU_GPU_BUNDLE:-}
if [ -n "$BUNDLE" ]; then  # the machine's python3 is the one with CUDA torch; pip finds sources in the bundle
  BUNDLE=$(cd "$BUNDLE" && pwd)
  export AMLEMU_VENV=${AMLEMU_VENV:-$(python3 -c 'import sys; print(sys.prefix)')}
  export PIP_NO_INDEX=1 PIP_FIND_LINKS=$BUNDLE/sdists
else
  export AMLEMU_VENV=${AMLEMU_VENV:-$ROOT/.venv}
fi
export AMLEMU_CACHE=${AMLEMU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/amlemu}
PY=$AMLEMU_VENV/bin/python
LOGS=$AMLEMU_CACHE/gpu-check

no_gpu() { echo "gpu-check: no NVIDIA GPU here ($1): nothing installed, nothing checked" >&2; exit 2; }
command -v nvidia-smi >/dev/null 2>&1 || no_gpu "no nvidia-smi, so no NVIDIA driver"
GPUS=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null) \
  || no_gpu "nvidia-smi fails: $(nvidia-smi 2>&1 | head -n 1)"
[ -n "$GPUS" ] || no_gpu "nvidia-smi lists none"
NGPU=$(wc -l <<<"$GPUS")

# Horovod's kernels for A100 and H100/H200 by default; this machine's own capability added if other.
CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' | sort -u | head -n 1)
if [ -n "$CC" ] && [[ ",80,90," != *",$CC,"* ]]; then export HOROVOD_BUILD_CUDA_CC_LIST="80,90,$CC"; fi

mkdir -p "$LOGS"
START=$SECONDS
PASSED=0 FAILED=0
printf 'gpu-check: %s GPU(s): %s; %s cores; logs in %s\n' "$NGPU" "$(head -n 1 <<<"$GPUS")" "$(nproc)" "$LOGS"

# step KIND LABEL COMMAND...: run it, its output to $LOGS/<label>.log, print its report line.
# KIND check counts towards the result; info never fails the run.
step() {
  local kind=$1 label=$2 started=$SECONDS status=ok log last
  shift 2
  log="$LOGS/$(tr -c 'A-Za-z0-9\n' - <<<"$label" | tr -s -).log"
  "$@" >"$log" 2>&1 || status=FAILED
  last=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -v '^[[:space:]]*$' | tail -n 1 | cut -c1-400)
  [ "$kind" = info ] && status="info-${status,,}"
  printf '%-7s %-14s %4ss  %s\n' "$status" "$label" "$((SECONDS - started))" "$last"
  case $status in ok) PASSED=$((PASSED + 1)) ;; FAILED) FAILED=$((FAILED + 1)) ;; esac
  [ "$status" != FAILED ]
}

finish() {
  printf 'gpu-check: %s ok, %s failed in %ss%s\n' "$PASSED" "$FAILED" "$((SECONDS - START))" "${1:-}"
  [ "$FAILED" = 0 ] && [ -z "${1:-}" ]
  exit $?
}

torch_cuda() {
  "$PY" - <<'EOF'
import torch
assert torch.version.cuda, f"torch {torch.__version__} is not a CUDA build"
assert torch.cuda.is_available(), (f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: "
                                   f"is the driver new enough for CUDA {torch.version.cuda}?")
x = torch.ones(4096, device="cuda")
assert float(x @ x) == 4096.0
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
EOF
}

horovod_nccl() {
  if ! "$PY" -c 'import sys, horovod.torch as h; sys.exit(not h.nccl_built())' 2>/dev/null; then
    local wheel
    wheel=$("$PY" "$ROOT/scripts/horovod_wheel.py" --cache "$AMLEMU_CACHE" --gpu-operations NCCL) || return 1
    "$PY" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$wheel" || return 1
  fi
  "$PY" -c 'import horovod, horovod.torch as h; assert h.nccl_built(), "no NCCL"; print(f"horovod {horovod.__version__}: NCCL {h.nccl_built()}, CUDA {h.cuda_built()}, MPI {h.mpi_built()}, Gloo {h.gloo_built()}")'
}

# A skipped GPU test is no pass: the plugin skips it where it sees no GPU.
pytest_gpu() {
  local out rc=0
  # The examples that hold GPU tests (the others import SDKs an offline bundle leaves out).
  local files
  mapfile -t files < <(cd "$ROOT" && grep -l 'mark\.gpu' examples/test_*.py)
  [ "${#files[@]}" -gt 0 ] || { echo "no GPU test under examples/"; return 1; }
  out=$(cd "$ROOT" && "$PY" -m pytest -p no:cacheprovider -q -rs -m gpu "${files[@]}" --aml-backend "$BACKEND" --aml-strict 2>&1) || rc=$?
  echo "$out"
  [ "$rc" = 0 ] && grep -Eq '[0-9]+ passed' <<<"$out" && ! grep -Eq '[0-9]+ skipped' <<<"$out"
}

if [ -n "$BUNDLE" ]; then  # offline: a failed part of the setup still leaves the rest worth checking
  step check setup bash "$ROOT/scripts/gpu_offline_setup.sh" "$BUNDLE"
else
  step check setup env AMLEMU_HOROVOD_GPU_OPERATIONS=NCCL bash "$ROOT/scripts/setup.sh" || finish " (setup failed: nothing checked)"
fi
BACKEND=${AMLEMU_GPU_CHECK_BACKEND:-$(docker info >/dev/null 2>&1 && echo docker || echo process)}
echo "gpu-check: nodes on the $BACKEND backend"
step check torch-cuda torch_cuda || finish " (no CUDA torch: the rest not checked)"
step check horovod-nccl horovod_nccl
step check "(a) nodes" "$PY" "$ROOT/scripts/gpu_check.py" nodes "$BACKEND"
step check "(b) nccl" "$PY" "$ROOT/scripts/gpu_check.py" nccl
if [ "$NGPU" -lt 2 ]; then
  step info "2 ranks/1 GPU" "$PY" "$ROOT/scripts/gpu_check.py" nccl-shared
fi
step check "(c) pytest" pytest_gpu
finish
