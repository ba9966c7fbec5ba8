"""Build horovod 0.28.1 against the venv's torch once, and cache the wheel outside the work tree.

PyPI has no horovod wheel, and its sdist does not compile against torch 2.14 as released: its
CMake files hard-code C++14 while torch 2.14's headers require C++20 (and the CUDA build of torch
pulls in nvcc, which needs a standard it accepts). Environment variables cannot fix that because
horovod's setup.py forwards only HOROVOD_CMAKE and MAKEFLAGS, so we patch the CMake files.

Run it with the venv's python (torch must be importable, the build uses --no-build-isolation):

    python scripts/horovod_wheel.py --cache ~/.cache/amlemu [--gpu-operations NCCL]

It prints the wheel's path. Stdlib only: it runs before the project itself is installed.

With a CUDA build of torch (PyPI's Linux torch is one), horovod compiles CUDA parts and needs a
toolkit (nvcc): CUDA_HOME, HOROVOD_CUDA_HOME or /usr/local/cuda, else one is assembled from PyPI's
`cuda-toolkit` wheels of the version torch was built with, once, under <cache>/cuda.
`--gpu-operations NCCL` (scripts/gpu_check.sh) also builds Horovod's NCCL operations against the
NCCL that torch brought (the nvidia-nccl wheel): its own cache entry, the default build unchanged.

The CUDA parts are built only where they can run: with `--cuda auto` (the default) when a GPU is
visible (`nvidia-smi -L`). On a CPU machine the same CUDA torch gets a CPU-only Horovod, and no
build carries debug info: 3.5 minutes on 2 cores, where the CUDA build with debug info took 6.5.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

HOROVOD_VERSION = "0.28.1"

# (file inside the sdist, CMake variable, standard it must be raised to)
STANDARD_PATCHES: tuple[tuple[str, str, int], ...] = (
    ("CMakeLists.txt", "CMAKE_CXX_STANDARD", 17),
    ("horovod/torch/CMakeLists.txt", "CMAKE_CXX_STANDARD", 20),
    ("horovod/common/ops/cuda/CMakeLists.txt", "CMAKE_CUDA_STANDARD", 17),
)

# Headers horovod 0.28.1 uses without including them, which GCC 13's libstdc++ no longer brings in
# through others (seen on Ubuntu 24.04's GCC 13: "'string' in namespace 'std' does not name a type").
MISSING_INCLUDES: tuple[tuple[str, str, str], ...] = (
    ("horovod/common/group_table.h", "#include <queue>\n", "#include <string>\n"),
)

# Keep RelWithDebInfo's optimisation (setup.py fixes the build type) but not its -g: compiling the
# debug info costs time, and it was stripped from the wheel afterwards anyway.
NO_DEBUG_INFO = ('set(CMAKE_CXX_FLAGS_RELWITHDEBINFO "-O2 -DNDEBUG")\n'
                 'set(CMAKE_CUDA_FLAGS_RELWITHDEBINFO "-O2 -DNDEBUG")\n')
# FindPytorch.cmake turns CUDA on whenever torch is a CUDA build and torch finds an nvcc.
CPU_ONLY = ('string(TOUPPER "${Pytorch_CUDA}" Pytorch_CUDA)', "set(Pytorch_CUDA FALSE)")

DEFAULT_CC_LIST = "80,90"  # A100, and H100/H200 (sm_90 PTX also JITs on newer chips)


# The parts of PyPI's cuda-toolkit that compiling horovod's kernels needs (nvcc, its front end and
# headers, cudart). Installed with `pip install --target`, they land in nvidia/cu<major>/.
TOOLKIT_EXTRAS = "nvcc,cccl,crt,nvvm,cudart"
# nvcc.profile looks for headers and libraries under targets/<this>/ (as /usr/local/cuda has them).
NVCC_TARGET_DIRS = {"x86_64": "x86_64-linux", "aarch64": "sbsa-linux"}


class BuildError(RuntimeError):
    pass


def raise_standard(text: str, variable: str, standard: int) -> str:
    """Raise every `set(<variable> N)` below `standard` to it; fail loudly if none is found."""
    pattern = re.compile(rf"set\(\s*{re.escape(variable)}\s+(\d+)\s*\)")
    if not pattern.search(text):
        raise BuildError(f"no set({variable} ...) found: the horovod sdist is not the expected one")

    def bump(match: re.Match[str]) -> str:
        return f"set({variable} {max(int(match.group(1)), standard)})"

    return pattern.sub(bump, text)


def patch_once(text: str, old: str, new: str, where: str) -> str:
    """Replace the one `old` in `text`; fail loudly when the sdist does not have it."""
    if text.count(old) != 1:
        raise BuildError(f"{old!r} not found once in {where}: the horovod sdist is not the expected one")
    return text.replace(old, new)


def patch_sources(source: Path, *, cuda: bool) -> None:
    """The C++ standards torch needs, the includes GCC 13 needs, no debug info, and, without `cuda`,
    a CPU-only torch part."""
    for relpath, variable, standard in STANDARD_PATCHES:
        path = source / relpath
        path.write_text(raise_standard(path.read_text(), variable, standard))
    for relpath, anchor, include in MISSING_INCLUDES:
        path = source / relpath
        path.write_text(patch_once(path.read_text(), anchor, anchor + include, relpath))
    top = source / "CMakeLists.txt"
    top.write_text(patch_once(top.read_text(), "project(horovod CXX)\n", "project(horovod CXX)\n" + NO_DEBUG_INFO,
                              "CMakeLists.txt"))
    if not cuda:
        find = source / "cmake" / "Modules" / "FindPytorch.cmake"
        find.write_text(patch_once(find.read_text(), *CPU_ONLY, "FindPytorch.cmake"))


def gpu_visible() -> bool:
    """Whether an NVIDIA GPU is visible here (`nvidia-smi -L` lists one)."""
    if not shutil.which("nvidia-smi"):
        return False
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return listed.returncode == 0 and "GPU" in listed.stdout


def find_cuda_home(env: dict[str, str]) -> str | None:
    """The CUDA toolkit to compile horovod's kernels with, or None for a CPU-only torch."""
    nvcc = shutil.which("nvcc", path=env.get("PATH", ""))  # a toolkit on PATH only (some images)
    on_path = str(Path(nvcc).resolve().parent.parent) if nvcc else None
    for candidate in (env.get("CUDA_HOME"), env.get("HOROVOD_CUDA_HOME"), "/usr/local/cuda", on_path):
        if candidate and Path(candidate, "bin", "nvcc").exists():
            return str(Path(candidate).resolve())
    return None


def toolkit_requirement(toolkit_version: str) -> str:
    """What pip installs to get a CUDA toolkit matching torch's (PyPI's cuda-toolkit meta-package)."""
    return f"cuda-toolkit[{TOOLKIT_EXTRAS}]=={toolkit_version}"


def toolkit_layout(home: Path, machine: str | None = None) -> Path:
    """Give a pip-installed toolkit (nvidia/cu<major>/ of the cuda-toolkit wheels) the layout that
    nvcc.profile and CMake's FindCUDAToolkit expect of /usr/local/cuda: targets/<arch>/{include,lib}
    links, lib64, and the unversioned libcudart.so. Idempotent."""
    target = home / "targets" / NVCC_TARGET_DIRS.get(machine or platform.machine(), "x86_64-linux")
    target.mkdir(parents=True, exist_ok=True)
    links = {target / "include": "../../include", target / "lib": "../../lib", home / "lib64": "lib"}
    runtime = sorted((home / "lib").glob("libcudart.so.[0-9]*"))
    if runtime:
        links[home / "lib" / "libcudart.so"] = runtime[0].name
    for link, points_to in links.items():
        if not link.is_symlink() and not link.exists():
            link.symlink_to(points_to)
    return home


def torch_toolkit_version() -> str | None:
    """The cuda-toolkit version the installed torch depends on (torch 2.14's CUDA wheels), or None."""
    try:
        return importlib.metadata.version("cuda-toolkit")
    except importlib.metadata.PackageNotFoundError:
        return None


def wheel_toolkit(cache: Path, toolkit_version: str, log: Path) -> str:
    """A CUDA toolkit from PyPI's wheels under <cache>/cuda, installed once; its home (CUDA_HOME)."""
    prefix = cache / "cuda" / f"cuda-toolkit-{toolkit_version}"
    if not any(prefix.glob("nvidia/cu*/bin/nvcc")):
        shutil.rmtree(prefix, ignore_errors=True)  # whatever an interrupted install left
        prefix.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="amlemu-cuda-", dir=prefix.parent) as tmp:
            staged = Path(tmp) / "toolkit"
            _run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-warn-script-location",
                  "--target", str(staged), toolkit_requirement(toolkit_version)], log)
            staged.rename(prefix)  # atomic: a half-installed toolkit is never taken for a whole one
    nvcc = next(prefix.glob("nvidia/cu*/bin/nvcc"), None)
    if nvcc is None:
        raise BuildError(f"{toolkit_requirement(toolkit_version)} installed no nvcc under {prefix}")
    return str(toolkit_layout(nvcc.parent.parent))


def torch_nccl(torch_dir: Path) -> Path | None:
    """The NCCL that torch's CUDA wheel brought (site-packages/nvidia/nccl), if any."""
    nccl = torch_dir.parent / "nvidia" / "nccl"
    return nccl if (nccl / "include" / "nccl.h").exists() and any((nccl / "lib").glob("libnccl.so*")) else None


def stage_nccl(nccl: Path, dest: Path) -> tuple[str, str]:
    """(include dir, lib dir) for horovod's FindNCCL, which looks for an unversioned libnccl.so
    where the wheel has only libnccl.so.2: a link to it. The built library still needs libnccl.so.2
    by its soname, which importing torch has loaded before horovod.torch loads."""
    lib = dest / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    link = lib / "libnccl.so"
    if not link.is_symlink():
        link.symlink_to(sorted((nccl / "lib").glob("libnccl.so.[0-9]*"))[0].resolve())
    return str((nccl / "include").resolve()), str(lib)


def build_env(base: dict[str, str], *, cuda_home: str | None, cc_list: str, jobs: int,
              nccl: tuple[str, str] | None = None) -> dict[str, str]:
    env = dict(base)
    env.update(
        HOROVOD_WITH_PYTORCH="1",
        HOROVOD_WITH_MPI="1",
        HOROVOD_WITHOUT_GLOO="1",  # AmlCompute launches Horovod with mpirun: Gloo would be compiled for nothing
        HOROVOD_WITHOUT_TENSORFLOW="1",
        HOROVOD_WITHOUT_MXNET="1",
        MAKEFLAGS=f"-j{jobs}",
    )
    if cuda_home:
        env.update(CUDA_HOME=cuda_home, HOROVOD_CUDA_HOME=cuda_home, HOROVOD_BUILD_CUDA_CC_LIST=cc_list)
        # nvcc finds cicc and its libraries relative to itself; CMake finds nvcc on the PATH first.
        env["PATH"] = f"{cuda_home}/bin:{env['PATH']}" if env.get("PATH") else f"{cuda_home}/bin"
    if nccl:
        if not cuda_home:
            raise BuildError("NCCL operations need a CUDA build of torch and a CUDA toolkit")
        # CMake reads these itself ($ENV{...}), so they reach it through setup.py unchanged.
        env.update(HOROVOD_GPU_OPERATIONS="NCCL", HOROVOD_NCCL_INCLUDE=nccl[0], HOROVOD_NCCL_LIB=nccl[1],
                   HOROVOD_NCCL_LINK="SHARED")
    return env


def cache_key(*, torch_version: str, torch_cuda: str | None, cc_list: str, python_tag: str,
              gpu_operations: str | None = None) -> str:
    """`torch_cuda` is None for a build without CUDA parts (a CPU torch, or --cuda no)."""
    gpu = f"cu{torch_cuda.replace('.', '')}-cc{cc_list.replace(',', '_')}" if torch_cuda else "cpu"
    ops = f"-{gpu_operations.lower()}" if gpu_operations else ""
    return f"horovod{HOROVOD_VERSION}-mpi-torch{torch_version.replace('+', '_')}-{gpu}{ops}-{python_tag}"


def pip_download_argv(python: str, dest: Path) -> list[str]:
    return [python, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            f"horovod=={HOROVOD_VERSION}", "-d", str(dest)]


def pip_wheel_argv(python: str, source: Path, dest: Path) -> list[str]:
    # --no-build-isolation: horovod's CMake must find the venv's torch ("Could NOT find Pytorch").
    return [python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", str(source), "-w", str(dest)]


def _run(argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    with log.open("ab") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise BuildError(f"{argv[2:4]} failed (exit {done.returncode}); full log: {log}\n{tail}")


def build(cache: Path, cc_list: str, gpu_operations: str | None = None, cuda: str = "auto") -> Path:
    import torch  # noqa: PLC0415 - only importable from the venv this script is meant to run in

    if gpu_operations and not torch.version.cuda:
        raise BuildError(f"--gpu-operations {gpu_operations} needs a CUDA build of torch; "
                         f"this one is {torch.__version__}")
    if gpu_operations and cuda == "no":
        raise BuildError(f"--gpu-operations {gpu_operations} needs the CUDA parts: drop --cuda no")
    with_cuda = bool(torch.version.cuda) and (cuda == "yes" or bool(gpu_operations) or
                                              (cuda == "auto" and gpu_visible()))
    torch_cuda = torch.version.cuda if with_cuda else None
    key = cache_key(torch_version=torch.__version__, torch_cuda=torch_cuda, cc_list=cc_list,
                    python_tag=sysconfig.get_config_var("SOABI") or "py", gpu_operations=gpu_operations)
    target_dir = cache / "horovod" / key
    existing = sorted(target_dir.glob("horovod-*.whl"))
    if existing:
        return existing[0]

    target_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="amlemu-horovod-", dir=target_dir.parent) as tmp:
        work = Path(tmp)
        log = target_dir.parent / f"{key}.build.log"
        log.write_text("")
        _run(pip_download_argv(sys.executable, work), log)
        with tarfile.open(next(work.glob("horovod-*.tar.gz"))) as sdist:
            sdist.extractall(work, filter="data")
        source = work / f"horovod-{HOROVOD_VERSION}"
        patch_sources(source, cuda=with_cuda)
        cuda_home = find_cuda_home(dict(os.environ)) if with_cuda else None
        if with_cuda and not cuda_home:
            version = torch_toolkit_version()
            if not version:
                raise BuildError("torch is a CUDA build but no CUDA toolkit (nvcc) was found, and torch did "
                                 "not come with PyPI's cuda-toolkit to match: set CUDA_HOME to a toolkit")
            cuda_home = wheel_toolkit(cache, version, log)
        nccl = None
        if gpu_operations == "NCCL":
            found = torch_nccl(Path(torch.__file__).resolve().parent)
            if not found:
                raise BuildError("--gpu-operations NCCL: torch brought no NCCL (site-packages/nvidia/nccl)")
            nccl = stage_nccl(found, work / "nccl")
        env = build_env(dict(os.environ), cuda_home=cuda_home, cc_list=cc_list, jobs=os.cpu_count() or 1,
                        nccl=nccl)
        _run(pip_wheel_argv(sys.executable, source, work / "wheel"), log, env)
        wheel = next((work / "wheel").glob("horovod-*.whl"))
        staged = work / "staged"
        staged.mkdir()
        shutil.copy2(wheel, staged / wheel.name)
        staged.rename(target_dir)  # atomic: a half-built wheel is never taken for a cached one
    return next(target_dir.glob("horovod-*.whl"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, required=True, help="cache folder (outside the work tree)")
    parser.add_argument("--cc-list", default=os.environ.get("HOROVOD_BUILD_CUDA_CC_LIST", DEFAULT_CC_LIST),
                        help="CUDA compute capabilities to build kernels for (default %(default)s)")
    parser.add_argument("--gpu-operations", choices=["NCCL"],
                        default=os.environ.get("AMLEMU_HOROVOD_GPU_OPERATIONS") or None, help="also build Horovod's GPU operations on NCCL (needs a CUDA build of torch)")
    parser.add_argument("--cuda", choices=["auto", "yes", "no"], default=os.environ.get("AMLEMU_HOROVOD_CUDA", "auto"),
                        help="build the CUDA parts (with a CUDA torch): auto = when a GPU is visible (default %(default)s)")
    args = parser.parse_args(argv)
    try:
        print(build(args.cache.expanduser(), args.cc_list, args.gpu_operations, args.cuda))
    except BuildError as exc:
        print(f"horovod build: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
