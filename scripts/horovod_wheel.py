"""Build horovod 0.28.1 against the venv's torch once, and cache the wheel outside the work tree.

PyPI has no horovod wheel, and its sdist does not compile against torch 2.14 as released: its
CMake files hard-code C++14 while torch 2.14's headers require C++20 (and the CUDA build of torch
pulls in nvcc, which needs a standard it accepts). Environment variables cannot fix that because
horovod's setup.py forwards only HOROVOD_CMAKE and MAKEFLAGS, so we patch the CMake files.

Run it with the venv's python (torch must be importable, the build uses --no-build-isolation):

    python scripts/horovod_wheel.py --cache ~/.cache/amlemu

It prints the wheel's path. Stdlib only: it runs before the project itself is installed.
"""
from __future__ import annotations

import argparse
import os
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

DEFAULT_CC_LIST = "80,90"  # A100, and H100/H200 (sm_90 PTX also JITs on newer chips)


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


def find_cuda_home(env: dict[str, str]) -> str | None:
    """The CUDA toolkit to compile horovod's kernels with, or None for a CPU-only torch."""
    for candidate in (env.get("CUDA_HOME"), env.get("HOROVOD_CUDA_HOME"), "/usr/local/cuda"):
        if candidate and Path(candidate, "bin", "nvcc").exists():
            return str(Path(candidate).resolve())
    return None


def build_env(base: dict[str, str], *, cuda_home: str | None, cc_list: str, jobs: int) -> dict[str, str]:
    env = dict(base)
    env.update(
        HOROVOD_WITH_PYTORCH="1",
        HOROVOD_WITH_MPI="1",
        HOROVOD_WITH_GLOO="1",
        HOROVOD_WITHOUT_TENSORFLOW="1",
        HOROVOD_WITHOUT_MXNET="1",
        MAKEFLAGS=f"-j{jobs}",
    )
    if cuda_home:
        env.update(CUDA_HOME=cuda_home, HOROVOD_CUDA_HOME=cuda_home, HOROVOD_BUILD_CUDA_CC_LIST=cc_list)
    return env


def cache_key(*, torch_version: str, torch_cuda: str | None, cc_list: str, python_tag: str) -> str:
    gpu = f"cu{torch_cuda.replace('.', '')}-cc{cc_list.replace(',', '_')}" if torch_cuda else "cpu"
    return f"horovod{HOROVOD_VERSION}-torch{torch_version.replace('+', '_')}-{gpu}-{python_tag}"


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


def _strip_wheel(wheel: Path, work: Path, log: Path) -> Path:
    """Drop the 60 MB of debug info (RelWithDebInfo) from the .so files; repacking rewrites RECORD."""
    if not shutil.which("strip"):
        return wheel
    unpacked = work / "unpacked"
    _run([sys.executable, "-m", "wheel", "unpack", str(wheel), "-d", str(unpacked)], log)
    for so in unpacked.rglob("*.so"):
        subprocess.run(["strip", "--strip-debug", str(so)], check=True)
    out = work / "stripped"
    out.mkdir()
    _run([sys.executable, "-m", "wheel", "pack", str(next(unpacked.iterdir())), "-d", str(out)], log)
    return next(out.glob("*.whl"))


def build(cache: Path, cc_list: str) -> Path:
    import torch  # noqa: PLC0415 - only importable from the venv this script is meant to run in

    key = cache_key(torch_version=torch.__version__, torch_cuda=torch.version.cuda, cc_list=cc_list,
                    python_tag=sysconfig.get_config_var("SOABI") or "py")
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
        for relpath, variable, standard in STANDARD_PATCHES:
            path = source / relpath
            path.write_text(raise_standard(path.read_text(), variable, standard))
        cuda_home = find_cuda_home(dict(os.environ)) if torch.version.cuda else None
        if torch.version.cuda and not cuda_home:
            raise BuildError("torch is a CUDA build but no CUDA toolkit (nvcc) was found: "
                             "set CUDA_HOME to the toolkit, or install a CPU build of torch")
        env = build_env(dict(os.environ), cuda_home=cuda_home, cc_list=cc_list, jobs=os.cpu_count() or 1)
        _run(pip_wheel_argv(sys.executable, source, work / "wheel"), log, env)
        wheel = _strip_wheel(next((work / "wheel").glob("horovod-*.whl")), work, log)
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
    args = parser.parse_args(argv)
    try:
        print(build(args.cache.expanduser(), args.cc_list))
    except BuildError as exc:
        print(f"horovod build: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
