"""How a node gets its GPUs and no other: the docker backend without NVIDIA's container toolkit
(device nodes), with it (device requests); the process backend's CUDA_VISIBLE_DEVICES. No GPU is
needed: these check the plan, which `scripts/gpu_check.sh` then runs on a GPU machine."""
from __future__ import annotations

from pathlib import Path

import pytest

from amlemu.api import Emulator
from amlemu.backends import docker as docker_backend
from amlemu.backends import get_backend, gpudevices, software
from amlemu.cluster import autoscale
from amlemu.specs import ClusterSpec

SMI = "0, 00000000:3B:00.0\n1, 00000000:86:00.0\n"


def test_device_minor_comes_from_the_drivers_proc_entry(tmp_path: Path) -> None:
    for bus, minor in (("0000:3b:00.0", 1), ("0000:86:00.0", 0)):  # probe order differs from PCI order
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "information").write_text(f"Model: NVIDIA H200\nDevice Minor: \t {minor}\n")
    assert gpudevices.parse_gpu_minors(SMI, tmp_path) == {"0": "1", "1": "0"}
    assert gpudevices.parse_gpu_minors(SMI, tmp_path / "none") == {"0": "0", "1": "1"}  # no /proc: the index
    assert gpudevices.parse_gpu_minors("", tmp_path) == {}


def test_a_node_gets_its_own_gpu_device_and_the_drivers_control_devices() -> None:
    present = {"/dev/nvidiactl", "/dev/nvidia-uvm"}
    devices = gpudevices.device_nodes(["1"], {"0": "1", "1": "0"}, exists=present.__contains__)
    assert devices == ["/dev/nvidia0:/dev/nvidia0:rwm", "/dev/nvidiactl:/dev/nvidiactl:rwm",
                       "/dev/nvidia-uvm:/dev/nvidia-uvm:rwm"]
    assert gpudevices.device_nodes([], {}, exists=present.__contains__) == []  # no GPU: no device at all


def test_libcuda_outside_the_loaders_default_folders_goes_on_the_library_path() -> None:
    standard = "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n"
    elsewhere = "\tlibcuda.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libcuda.so.1\n"
    assert gpudevices.libcuda_dir(standard) is None
    assert gpudevices.libcuda_dir("\tlibc.so.6 (libc6,x86-64) => /lib/libc.so.6\n" + elsewhere) == \
        "/usr/local/nvidia/lib64"
    assert gpudevices.libcuda_dir("") is None


@pytest.mark.parametrize("toolkit", [False, True])
def test_docker_plan_uses_device_nodes_unless_the_nvidia_toolkit_is_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, toolkit: bool) -> None:
    monkeypatch.setattr(docker_backend.shutil, "which",
                        lambda name: "/usr/bin/hook" if toolkit and name == "nvidia-container-runtime-hook" else None)
    monkeypatch.setattr(gpudevices, "gpu_minors", lambda: {"0": "0", "1": "1"})
    monkeypatch.setattr(gpudevices, "driver_lib_dir", lambda: "/opt/driver/lib")
    emu = Emulator(home=tmp_path / "home")
    spec = ClusterSpec("gpu", "Standard_NC6s_v3", max_nodes=2)  # 1 V100 per node
    backend = get_backend("docker", emu.home)
    plans = [backend.plan_node(autoscale.node_request(emu.home, spec, i, host_gpus=("0", "1"))) for i in (0, 1)]
    assert [p.gpus for p in plans] == [("0",), ("1",)]
    if toolkit:
        assert [p.gpu_access for p in plans] == ["device_requests"] * 2
        assert plans[1].devices == () and "LD_LIBRARY_PATH" not in plans[1].environment
    else:
        assert [p.gpu_access for p in plans] == ["device_nodes"] * 2
        assert plans[1].devices[0] == "/dev/nvidia1:/dev/nvidia1:rwm"
        assert not any("nvidia0" in d for d in plans[1].devices)  # never the other node's GPU
        assert plans[1].environment["LD_LIBRARY_PATH"] == "/opt/driver/lib"
        assert plans[1].volumes["/opt/driver/lib"] == {"bind": "/opt/driver/lib", "mode": "ro"}
    cpu = backend.plan_node(autoscale.node_request(emu.home, ClusterSpec("cpu", "STANDARD_D2_V2"), 0,
                                                   host_gpus=("0", "1")))
    assert (cpu.gpu_access, cpu.devices) == (None, ())


def test_process_nodes_number_gpus_as_nvidia_smi_does(tmp_path: Path) -> None:
    emu = Emulator(home=tmp_path / "home")
    request = autoscale.node_request(emu.home, ClusterSpec("gpu", "Standard_NC6s_v3", max_nodes=2), 1,
                                     host_gpus=("0", "1"))
    env = get_backend("process", emu.home).node_env(request)
    assert (env["CUDA_VISIBLE_DEVICES"], env["CUDA_DEVICE_ORDER"]) == ("1", "PCI_BUS_ID")


MOUNTINFO = """\
22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
40 22 0:40 / /usr/local/nvidia ro,nosuid - overlay none ro
41 40 0:41 / /usr/local/nvidia/lib64/extra ro - tmpfs none ro
42 22 0:42 / /opt/my\\040env/lib rw - tmpfs none rw
43 22 0:43 / /usrlocal rw - tmpfs none rw
44 22 0:44 / /usr rw - tmpfs none rw
"""


def test_a_sandbox_mirrors_the_mounts_inside_this_machines_software_parents_first() -> None:
    """A GPU driver mounted at /usr/local/nvidia (as on Kubernetes' and the lent GPU machines) was an
    empty folder in a process node: the sandbox binds /usr alone."""
    paths = ["/usr", "/opt/my env"]
    assert software.submounts(paths, MOUNTINFO) == [
        "/usr", "/opt/my env", "/usr/local/nvidia", "/opt/my env/lib", "/usr/local/nvidia/lib64/extra"]
    assert software.submounts(["/etc/ssl/certs"], MOUNTINFO) == ["/etc/ssl/certs"]


def test_a_process_node_finds_libraries_where_this_machine_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An image's LD_LIBRARY_PATH (CUDA's images point it at the driver) reaches the node as far as
    the node sees those folders; the loader's cache goes into its sandbox."""
    mirrored = ["/usr", "/opt/venv"]
    assert software.mirrored_library_path("/usr/local/nvidia/lib64:/home/me/lib:relative:/opt/venv/lib:/usr/local/nvidia/lib64",
                                          mirrored) == "/usr/local/nvidia/lib64:/opt/venv/lib"
    assert software.mirrored_library_path("", mirrored) == ""
    assert software.mirrored_library_path("/usrx/lib", mirrored) == ""
    emu = Emulator(home=tmp_path / "home")
    request = autoscale.node_request(emu.home, ClusterSpec("gpu", "Standard_NC6s_v3"), 0, host_gpus=("0",))
    backend = get_backend("process", emu.home)
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/lib/nvidia-test:/root/secret-lib")
    assert backend.node_env(request)["LD_LIBRARY_PATH"] == "/usr/lib/nvidia-test"
    monkeypatch.delenv("LD_LIBRARY_PATH")
    assert "LD_LIBRARY_PATH" not in backend.node_env(request)
    sandbox = software.sandbox_software()
    assert Path("/etc/ld.so.cache").exists() and "/etc/ld.so.cache" in sandbox and "/usr" in sandbox
