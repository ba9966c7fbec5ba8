"""A docker node keeps its init and idle `sleep` for its next job, and nothing else: a job's process
that passes for the kept `sleep` (its command line, its parent) is killed with the job, by the
host (this machine's engine) and from inside the node (another machine's)."""
from __future__ import annotations

import sys
import time
import uuid
from typing import Any

import docker
import pytest

from amlemu.backends import dockerengines
from amlemu.backends.base import LABEL
from amlemu.backends.software import software_paths
from amlemu.backends.dockerapi import kill_job_processes
from amlemu.backends.dockerexec import KEPT_ONLY, setpriv_path
from amlemu.backends.dockerplan import MIRROR_IMAGE
from amlemu.machines.rigproc import import_mirror

pytestmark = pytest.mark.slow


@pytest.fixture
def node() -> Any:
    client = docker.from_env()
    import_mirror(client)
    api = client.api
    created = api.create_container(
        MIRROR_IMAGE, command=["/usr/bin/tini", "--", "/bin/sleep", "infinity"], name=f"amlemu-t-{uuid.uuid4().hex[:8]}",
        labels={LABEL: "1", f"{LABEL}.home": "tests-kept"},
        host_config=api.create_host_config(binds={p: {"bind": p, "mode": "ro"} for p in software_paths()},
                                           read_only=True, tmpfs={"/tmp": "mode=1777"}))
    api.start(created["Id"])
    try:
        yield client.containers.get(created["Id"])
    finally:
        api.remove_container(created["Id"], force=True)


def _commands(container: Any) -> list[str]:
    return [row[-1] for row in container.top(ps_args="-eo pid,args")["Processes"]]


def _plant_impostor(container: Any) -> None:
    """As a job would: below the kept capabilities (dockerexec.py), orphaned to the node's init, its
    argv the kept sleep's."""
    setpriv = setpriv_path()
    assert setpriv, "setpriv (util-linux) is needed by docker nodes"
    code, out = container.exec_run([setpriv, f"--bounding-set=-{KEPT_ONLY}", "--", sys.executable, "-c",
                                    "import os; os.fork() or os.execv('/bin/sleep', ['/bin/sleep', 'infinity'])"])
    assert code == 0, out
    deadline = time.monotonic() + 10
    while _commands(container).count("/bin/sleep infinity") < 2:
        assert time.monotonic() < deadline, _commands(container)
        time.sleep(0.05)


@pytest.mark.parametrize("where", ["host", "inside"])
def test_a_job_process_posing_as_the_kept_sleep_is_killed(node: Any, where: str) -> None:
    _plant_impostor(node)
    killed = kill_job_processes(node) if where == "host" else dockerengines.stop_inside(node)
    assert killed == 1
    deadline = time.monotonic() + 10
    while _commands(node).count("/bin/sleep infinity") != 1:
        assert time.monotonic() < deadline, _commands(node)
        time.sleep(0.05)
    node.reload()
    assert node.status == "running"  # its own init and sleep kept
