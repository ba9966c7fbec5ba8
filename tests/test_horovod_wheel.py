"""The horovod build recipe: CMake patches, build environment and cache key (pure parts)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from conftest import REPO

_spec = importlib.util.spec_from_file_location("horovod_wheel", REPO / "scripts" / "horovod_wheel.py")
hw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hw)


def test_raise_standard_bumps_lower_and_keeps_higher() -> None:
    text = "if(X)\n    set(CMAKE_CXX_STANDARD 14)\nendif()\nset( CMAKE_CXX_STANDARD  23 )\n"
    out = hw.raise_standard(text, "CMAKE_CXX_STANDARD", 20)
    assert "set(CMAKE_CXX_STANDARD 20)" in out and "set(CMAKE_CXX_STANDARD 23)" in out
    assert "14" not in out


def test_raise_standard_fails_loudly_on_an_unexpected_sdist() -> None:
    with pytest.raises(hw.BuildError, match="no set\\(CMAKE_CUDA_STANDARD"):
        hw.raise_standard("project(x)\n", "CMAKE_CUDA_STANDARD", 17)


def test_patches_cover_the_known_breakages() -> None:
    patches = {(f, v): s for f, v, s in hw.STANDARD_PATCHES}
    assert patches[("horovod/torch/CMakeLists.txt", "CMAKE_CXX_STANDARD")] == 20  # torch 2.14 headers
    assert patches[("horovod/common/ops/cuda/CMakeLists.txt", "CMAKE_CUDA_STANDARD")] >= 17


def test_build_env_selects_frameworks_and_cuda_only_when_asked() -> None:
    cpu = hw.build_env({"PATH": "/bin"}, cuda_home=None, cc_list="90", jobs=2)
    assert cpu["HOROVOD_WITH_PYTORCH"] == cpu["HOROVOD_WITH_MPI"] == cpu["HOROVOD_WITHOUT_GLOO"] == "1"
    assert "HOROVOD_WITH_GLOO" not in cpu
    assert cpu["HOROVOD_WITHOUT_TENSORFLOW"] == "1" and cpu["MAKEFLAGS"] == "-j2"
    assert "HOROVOD_CUDA_HOME" not in cpu and cpu["PATH"] == "/bin"
    gpu = hw.build_env({}, cuda_home="/opt/cuda", cc_list="80,90", jobs=4)
    assert (gpu["CUDA_HOME"], gpu["HOROVOD_CUDA_HOME"], gpu["HOROVOD_BUILD_CUDA_CC_LIST"]) == (
        "/opt/cuda", "/opt/cuda", "80,90")


def test_cache_key_changes_with_what_the_binary_depends_on() -> None:
    base = dict(torch_version="2.14.1+cu130", torch_cuda="13.0", cc_list="80,90", python_tag="cpython-311")
    key = hw.cache_key(**base)
    assert key == "horovod0.28.1-mpi-torch2.14.1_cu130-cu130-cc80_90-cpython-311"
    for change in ({"torch_version": "2.13.0"}, {"torch_cuda": None}, {"cc_list": "90"},
                   {"python_tag": "cpython-312"}):
        assert hw.cache_key(**{**base, **change}) != key


def test_find_cuda_home(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    assert hw.find_cuda_home({"CUDA_HOME": str(tmp_path)}) != str(tmp_path.resolve())  # no nvcc there
    (tmp_path / "bin" / "nvcc").write_text("")
    assert hw.find_cuda_home({"CUDA_HOME": str(tmp_path)}) == str(tmp_path.resolve())
    (tmp_path / "bin" / "nvcc").chmod(0o755)  # a toolkit found by its nvcc on PATH alone (some images)
    found = hw.find_cuda_home({"PATH": f"/nonexistent:{tmp_path / 'bin'}"})
    assert found == str(tmp_path.resolve()) or Path("/usr/local/cuda/bin/nvcc").exists()


def test_build_runs_without_build_isolation() -> None:
    argv = hw.pip_wheel_argv("/venv/bin/python", Path("/src"), Path("/out"))
    assert argv[:4] == ["/venv/bin/python", "-m", "pip", "wheel"] and "--no-build-isolation" in argv
    assert "--no-binary" in hw.pip_download_argv("py", Path("/d"))


def test_nccl_build_has_its_own_cache_key() -> None:
    base = dict(torch_version="2.14.1+cu130", torch_cuda="13.0", cc_list="80,90", python_tag="cpython-311")
    assert hw.cache_key(**base, gpu_operations=None) == hw.cache_key(**base)
    assert hw.cache_key(**base, gpu_operations="NCCL") == "horovod0.28.1-mpi-torch2.14.1_cu130-cu130-cc80_90-nccl-cpython-311"


def test_build_env_for_nccl_points_cmake_at_the_staged_nccl() -> None:
    env = hw.build_env({"PATH": "/bin"}, cuda_home="/tk", cc_list="90", jobs=16, nccl=("/n/include", "/stage/lib"))
    assert (env["HOROVOD_GPU_OPERATIONS"], env["HOROVOD_NCCL_INCLUDE"], env["HOROVOD_NCCL_LIB"],
            env["HOROVOD_NCCL_LINK"]) == ("NCCL", "/n/include", "/stage/lib", "SHARED")
    assert env["PATH"] == "/tk/bin:/bin"  # the toolkit's nvcc first
    assert "HOROVOD_GPU_OPERATIONS" not in hw.build_env({}, cuda_home="/tk", cc_list="90", jobs=1)
    with pytest.raises(hw.BuildError, match="CUDA"):
        hw.build_env({}, cuda_home=None, cc_list="90", jobs=1, nccl=("/i", "/l"))


def test_nccl_from_torchs_wheel_is_staged_with_the_unversioned_name_cmake_looks_for(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    (site / "torch").mkdir(parents=True)
    assert hw.torch_nccl(site / "torch") is None
    nccl = site / "nvidia" / "nccl"
    (nccl / "include").mkdir(parents=True)
    (nccl / "lib").mkdir()
    (nccl / "include" / "nccl.h").write_text("#define NCCL_MAJOR 2\n")
    (nccl / "lib" / "libnccl.so.2").write_bytes(b"\x7fELF")
    assert hw.torch_nccl(site / "torch") == nccl
    include, lib = hw.stage_nccl(nccl, tmp_path / "stage")
    assert Path(include, "nccl.h").exists()
    assert Path(lib, "libnccl.so").resolve() == (nccl / "lib" / "libnccl.so.2").resolve()
    assert hw.stage_nccl(nccl, tmp_path / "stage") == (include, lib)  # twice is fine


def test_a_wheel_toolkit_gets_the_layout_nvcc_and_cmake_expect(tmp_path: Path) -> None:
    """PyPI's cuda-toolkit wheels install nvidia/cu13/{bin,include,lib}; nvcc.profile wants
    targets/x86_64-linux/{include,lib} and CMake an unversioned libcudart.so (as /usr/local/cuda has)."""
    home = tmp_path / "nvidia" / "cu13"
    for folder in ("bin", "include", "lib"):
        (home / folder).mkdir(parents=True)
    (home / "lib" / "libcudart.so.13").write_bytes(b"\x7fELF")
    (home / "include" / "cuda_runtime.h").write_text("")
    for _ in range(2):  # idempotent
        assert hw.toolkit_layout(home, machine="x86_64") == home
    assert (home / "targets" / "x86_64-linux" / "include" / "cuda_runtime.h").exists()
    assert (home / "targets" / "x86_64-linux" / "lib" / "libcudart.so").resolve() == (home / "lib" / "libcudart.so.13")
    assert (home / "lib64" / "libcudart.so.13").exists()
    assert hw.toolkit_requirement("13.0.3.0") == "cuda-toolkit[nvcc,cccl,crt,nvvm,cudart]==13.0.3.0"


def _sdist_tree(root: Path) -> Path:
    """The lines of horovod 0.28.1's sdist that the patches touch."""
    files = {
        "CMakeLists.txt": "cmake_minimum_required(VERSION 3.13)\nproject(horovod CXX)\nset(CMAKE_CXX_STANDARD 14)\n",
        "horovod/torch/CMakeLists.txt": "set(CMAKE_CXX_STANDARD 14)\n",
        "horovod/common/ops/cuda/CMakeLists.txt": "set(CMAKE_CUDA_STANDARD 14)\n",
        "cmake/Modules/FindPytorch.cmake": 'string(TOUPPER "${Pytorch_CUDA}" Pytorch_CUDA)\n',
        "horovod/common/group_table.h": "#include <mutex>\n#include <queue>\n#include <unordered_map>\n",
    }
    for relpath, text in files.items():
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_text(text)
    return root


def test_no_build_carries_debug_info_and_a_cpu_build_turns_torchs_cuda_off(tmp_path: Path) -> None:
    cpu = _sdist_tree(tmp_path / "cpu")
    hw.patch_sources(cpu, cuda=False)
    top = (cpu / "CMakeLists.txt").read_text()
    assert top.index("project(horovod CXX)") < top.index('CMAKE_CXX_FLAGS_RELWITHDEBINFO "-O2 -DNDEBUG"')
    assert "set(CMAKE_CXX_STANDARD 17)" in top
    assert "set(Pytorch_CUDA FALSE)" in (cpu / "cmake/Modules/FindPytorch.cmake").read_text()
    assert "#include <queue>\n#include <string>\n" in (cpu / "horovod/common/group_table.h").read_text()  # GCC 13
    gpu = _sdist_tree(tmp_path / "gpu")
    hw.patch_sources(gpu, cuda=True)
    assert 'CMAKE_CUDA_FLAGS_RELWITHDEBINFO "-O2 -DNDEBUG"' in (gpu / "CMakeLists.txt").read_text()
    assert "TOUPPER" in (gpu / "cmake/Modules/FindPytorch.cmake").read_text()


def test_patches_fail_loudly_on_an_unexpected_sdist(tmp_path: Path) -> None:
    root = _sdist_tree(tmp_path)
    (root / "cmake/Modules/FindPytorch.cmake").write_text("set(Pytorch_CUDA TRUE)\n")
    with pytest.raises(hw.BuildError, match="FindPytorch.cmake"):
        hw.patch_sources(root, cuda=False)


def test_nccl_operations_need_the_cuda_parts(tmp_path: Path) -> None:
    import torch  # noqa: PLC0415 - the test venv has the trainer extra
    with pytest.raises(hw.BuildError, match="--cuda no" if torch.version.cuda else "CUDA build of torch"):
        hw.build(tmp_path, "90", gpu_operations="NCCL", cuda="no")
