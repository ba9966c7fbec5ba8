#!/usr/bin/env bash
# The one idempotent setup of amlemu, used by `make demo`, `make test` and CI.
#
#   1. Debian packages: Docker engine, Open MPI, build tools, chromium (apt, as root; skipped when
#      present), installed in the background while
#   2. the project's venv gets torch and the project itself (uv, at the versions of
#      scripts/constraints.txt: what the suite last passed with);
#   3. a running Docker engine (starts dockerd when none answers);
#   4. horovod (built once, cached) compiles in the background while Azurite (npm) for blob
#      datastores and the real MNIST data set, as torchvision expects it, install.
#
# A second run on a ready machine checks each step and changes nothing.
# Knobs: AMLEMU_VENV (default ./.venv), AMLEMU_CACHE (default ~/.cache/amlemu; horovod wheels and
# data live there, outside the work tree), AMLEMU_SKIP_DOCKER=1 (no engine: process backend only),
# AMLEMU_SECOND_ENGINE=1 (check that this machine can host the test rig's second Docker engine: root
# and network namespaces; the tests' `second_engine` fixture makes and removes the rig itself).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${AMLEMU_VENV:-$ROOT/.venv}
CACHE=${AMLEMU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/amlemu}
PY=${PYTHON:-python3}
DEB_PACKAGES=(docker.io docker-compose tini util-linux e2fsprogs openmpi-bin libopenmpi-dev iproute2 binutils cmake g++ make
  chromium chromium-driver  # the headless browser (and its driver) of the studio page test
  fuse3 libfuse3-3)  # the data runtime's FUSE mount (libfuse3 for mfusepy, fusermount3 to unmount)

step() { printf '\033[1m==> [%3ds] %s\033[0m\n' "$SECONDS" "$*"; }  # seconds since the setup began
die() { printf 'amlemu setup: %s\n' "$*" >&2; exit 1; }
# On any exit: a Horovod build still running is ended; apt is let finish (a killed dpkg leaves
# the machine's packages half-configured).
on_exit() {
  [ -z "${HOROVOD_BUILD:-}" ] || kill "$HOROVOD_BUILD" 2>/dev/null || true
  [ -z "${APT_INSTALL:-}" ] || wait "$APT_INSTALL" 2>/dev/null || true
}
trap on_exit EXIT

# `finish VAR`: wait for the background step whose pid VAR holds, forget it, return its status.
finish() {
  local pid=${!1} status=0
  wait "$pid" || status=$?
  printf -v "$1" '%s' ''
  return "$status"
}

missing_debs() {
  local pkg
  for pkg in "${DEB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || printf '%s ' "$pkg"
  done
}

system_packages() {
  command -v dpkg-query >/dev/null || die "no dpkg: install Docker, Open MPI (mpirun, mpicc), cmake and g++ by hand, then rerun"
  local missing
  missing=$(missing_debs)
  [ -z "$missing" ] && { step "Debian packages present"; return; }
  [ "$(id -u)" = 0 ] || die "missing Debian packages: ${missing}; run as root or: sudo apt-get install -y ${missing}"
  command -v apt-get >/dev/null || die "missing Debian packages (${missing}) and no apt-get to install them"
  step "installing Debian packages in the background: ${missing}"
  APT_LOG=$(mktemp)
  # shellcheck disable=SC2086 # the package list is meant to split
  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q ${missing}) >"$APT_LOG" 2>&1 &
  APT_INSTALL=$!
}

system_packages_done() {
  [ -n "${APT_INSTALL:-}" ] || return 0
  step "Debian packages: waiting for apt"
  finish APT_INSTALL || { tail -n 30 "$APT_LOG" >&2; die "apt-get could not install the Debian packages (above)"; }
  rm -f "$APT_LOG"
}

docker_engine() {
  if [ "${AMLEMU_SKIP_DOCKER:-0}" = 1 ]; then step "Docker engine skipped (AMLEMU_SKIP_DOCKER=1)"; return; fi
  if timeout 10 docker info >/dev/null 2>&1; then step "Docker engine answers"; return; fi
  [ "$(id -u)" = 0 ] || die "no Docker engine answers and only root can start one: start dockerd, or set AMLEMU_SKIP_DOCKER=1"
  local log=/var/log/amlemu-dockerd.log
  step "starting dockerd (log: $log)"
  # setsid: the engine must outlive this script and the make that called it.
  setsid dockerd >>"$log" 2>&1 </dev/null &
  local i
  for i in $(seq 60); do
    timeout 5 docker info >/dev/null 2>&1 && { step "Docker engine up after ${i}s"; return; }
    sleep 1
  done
  tail -n 15 "$log" >&2
  die "dockerd did not answer within 60 s (log: $log); set AMLEMU_SKIP_DOCKER=1 to go on without Docker"
}

# Optional: the 2-machine tests' rig (emulator/machines/rig.py) needs root and network namespaces.
second_engine() {
  [ "${AMLEMU_SECOND_ENGINE:-0}" = 1 ] || return 0
  "$VENV/bin/python" -m amlemu.machines.rig check >/dev/null || die "the second engine cannot run here (above): the 2-machine tests will fail"
  step "second Docker engine: this machine can host the test rig"
}

# pip, minus the warning this machine kind's pip.conf prints for each package its local indexes lack.
pip_install() {
  local log status=0
  log=$(mktemp)
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" >"$log" 2>&1 || status=$?
  grep -v 'is ignored: it is neither a file nor a directory' "$log" || true
  rm -f "$log"
  return "$status"
}

# uv reads no pip configuration: this machine's package sources for pip (local indexes, wheel
# folders, a cap on versions, the CA file) are handed to uv, so both install from the same places.
uv_sources() {
  local line key value
  UV_ARGS=(--python "$VENV/bin/python" --constraint "$ROOT/scripts/constraints.txt" --index-strategy unsafe-best-match)
  while IFS= read -r line; do
    key=${line%%=*}; key=${key#*.}; value=${line#*=}; value=${value#\'}; value=${value%\'}
    case $key in
      index-url) export UV_INDEX_URL=$value ;;
      extra-index-url) export UV_EXTRA_INDEX_URL=$value ;;
      find-links) export UV_FIND_LINKS=${value// /,} ;;
      constraint) UV_ARGS+=(--constraint "$value") ;;
      cert) export SSL_CERT_FILE=$value ;;
    esac
  done < <("$VENV/bin/python" -m pip config list 2>/dev/null)
}

uv_install() {
  "$VENV/bin/uv" pip install -q "${UV_ARGS[@]}" "$@"
}

venv_up_to_date() {
  local stamp_file=$VENV/.amlemu-stamp
  STAMP=$(cat "$ROOT/pyproject.toml" "$ROOT/scripts/constraints.txt" "$ROOT/scripts/setup.sh" "$ROOT/scripts/horovod_wheel.py" |
    sha256sum | cut -c1-16)
  [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$STAMP" ] &&
    "$VENV/bin/python" -c 'import horovod.torch, amlemu, pytest_amlemu, azure.ai.ml, azureml.core' 2>/dev/null
}

# Everything but Horovod in one resolution, by uv (half pip's time for torch's 5 GB, bytecode
# compiled on every core), at the tested versions.
python_env() {
  if venv_up_to_date; then step "venv up to date ($VENV)"; VENV_READY=1; return; fi
  [ -x "$VENV/bin/python" ] || { step "creating venv $VENV"; "$PY" -m venv "$VENV"; }
  step "installing torch, amlemu's dependencies and build tools (uv)"
  pip_install "uv==$(grep -oP '^uv==\K.*' "$ROOT/scripts/constraints.txt")"
  uv_sources
  local trainer_deps
  # The trainer extra minus horovod (no wheel on PyPI), read from pyproject.toml: written once.
  trainer_deps=$("$VENV/bin/python" -c 'import sys, tomllib
extra = tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]["trainer"]
print(" ".join(r for r in extra if not r.startswith("horovod")))' "$ROOT/pyproject.toml")
  # horovod's own dependencies come too: its wheel is installed with --no-deps. pip and setuptools:
  # horovod_wheel.py builds with pip, without build isolation.
  # shellcheck disable=SC2086 # the requirement list is meant to split
  uv_install --compile-bytecode -e "$ROOT[dev,sdk1,sdk2]" $trainer_deps cloudpickle psutil pyyaml packaging pip setuptools wheel
}

# After the Debian packages (Open MPI's headers, cmake, g++): Horovod compiles in the background.
horovod_build() {
  [ -z "${VENV_READY:-}" ] || return 0
  step "horovod wheel: building in the background (cached in $CACHE/horovod; ~3.5 min the first time)"
  HOROVOD_OUT=$(mktemp)
  "$VENV/bin/python" "$ROOT/scripts/horovod_wheel.py" --cache "$CACHE" >"$HOROVOD_OUT" &
  HOROVOD_BUILD=$!
}

horovod() {
  [ -n "${HOROVOD_BUILD:-}" ] || return 0
  step "horovod wheel: waiting for its build"
  finish HOROVOD_BUILD || die "horovod build failed (see above)"
  # --reinstall: a rebuilt wheel of the same version (another recipe) would be skipped otherwise.
  uv_install --no-deps --reinstall-package horovod "$(cat "$HOROVOD_OUT")"
  rm -f "$HOROVOD_OUT"
  uv_install -e "$ROOT[trainer,dev,sdk1,sdk2]"
  "$VENV/bin/python" -c 'import horovod.torch' || die "horovod.torch does not import after install"
  echo "$STAMP" >"$VENV/.amlemu-stamp"
}

# Azurite (the Azure Storage emulator) from the npm registry, for datastores on blob storage.
azurite() {
  local version dir=$CACHE/azurite
  version=$(grep -oE '^VERSION = "[^"]+"' "$ROOT/emulator/storage/azurite.py" | cut -d'"' -f2)
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    step "no Node.js: Azurite skipped, workspaceblobstore will be a local folder (install nodejs and npm to get it)"
    return
  fi
  if grep -qs "\"version\": \"$version\"" "$dir/node_modules/azurite/package.json"; then
    step "Azurite $version present"; return
  fi
  step "installing Azurite $version (npm)"
  mkdir -p "$dir"
  (cd "$dir" && npm install --no-audit --no-fund --loglevel=error "azurite@$version") || die "npm could not install azurite@$version"
}

mnist() {
  step "real MNIST"
  "$VENV/bin/python" -m pytest_amlemu.mnist prepare --cache "$CACHE"
  step "MNIST on the emulator's workspaceblobstore (what trainer/job.yml reads)"
  "$VENV/bin/python" -m pytest_amlemu.mnist publish || die "could not put MNIST on workspaceblobstore"
}

system_packages
python_env
system_packages_done
docker_engine
horovod_build
azurite
mnist
horovod
second_engine
step "ready: venv $VENV, data $CACHE/data/mnist"
