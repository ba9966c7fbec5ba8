"""A docker node's resident agent (emulator/backends/nodeserver.py) runs each launch on a warm node
without `docker exec`, and gives a job nothing: it serves only the host, the host uses it only
after checking it is the node's own, and every launch still works where it is gone."""
from __future__ import annotations

import _socket
import marshal
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import docker
import pytest
from conftest import wait_until

from amlemu.api import Emulator
from amlemu.backends import dockerexec
from amlemu.runs import agent
from amlemu.runs.agent import run_resident
from amlemu.specs import RunStatus

pytestmark = pytest.mark.slow

# What started the job: the command lines of its ancestors, up to the node's first process.
ANCESTRY = """
import os
pid, chain = os.getppid(), []
while pid > 0:
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        chain.append(fh.read().replace(b"\\0", b" ").decode())
    with open(f"/proc/{pid}/status") as fh:
        pid = int(next(line.split()[1] for line in fh if line.startswith("PPid:")))
print("launched by resident agent:", any("nodeserver.py" in c for c in chain), flush=True)
"""


def _node(emu: Emulator) -> Any:
    (name,) = [c.name for c in docker.from_env().containers.list(filters={"label": f"amlemu.home={emu.home.id}"})]
    return docker.from_env().containers.get(name)


def _launched(emu: Emulator, make_job) -> str:  # type: ignore[no-untyped-def]
    run = emu.submit(make_job(ANCESTRY, nodes=1))
    assert run.wait(timeout=120) is RunStatus.COMPLETED, run.record.error
    return run.logs(0)


def _server_pid(node: Any) -> int | None:
    for pid in (int(row[0]) for row in node.top(ps_args="-eo pid")["Processes"]):
        try:
            if dockerexec.is_server(Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")):
                return pid
        except OSError:
            pass
    return None


@pytest.mark.parametrize("backend", ["docker"])
def test_a_warm_node_launches_through_its_resident_agent(emu: Emulator, cluster, make_job, tmp_path: Path) -> None:
    cluster(max_nodes=1, idle_seconds_before_scaledown=120)
    assert "launched by resident agent: True" in _launched(emu, make_job)  # a new node's first job
    assert "launched by resident agent: True" in _launched(emu, make_job)  # kept across jobs
    node = _node(emu)
    first = _server_pid(node)  # the node's command: it becomes the node's idle sleep when it leaves
    assert first is not None
    # A second server started beside it (two at once): the first leaves it the socket and sleeps.
    dockerexec.start_server(node.client.api, node.name)
    wait_until(lambda: Path(f"/proc/{first}/cmdline").read_bytes() == b"/bin/sleep\0infinity\0", 10,
               "the first server sleeps")
    assert _server_pid(node) not in (None, first)  # the second serves alone
    os.kill(_server_pid(node), 9)  # gone (a job may kill it): started again by the next run, before its launch
    wait_until(lambda: _server_pid(node) is None, 10, "the server is gone")
    assert "launched by resident agent: True" in _launched(emu, make_job)
    assert _server_pid(node) is not None
    node.reload()
    assert node.status == "running"
    # Where it does not answer, the launch agent runs the same argv through `docker exec`.
    config = tmp_path / "agent-config.marshal"
    entry = {"before": [shutil.which("docker"), "exec", "-i", node.name, "/bin/sh", "-c"], "after": [],
             "resident": {"socket": str(tmp_path / "no-server.sock"), "pidns": 0, "before": ["/bin/sh", "-c"]}}
    config.write_bytes(marshal.dumps({"exec": {"node-0": entry}, "host_env": {"PATH": os.environ["PATH"]}}))
    done = subprocess.run([sys.executable, "-SI", agent.__file__, "node-0", "echo $((6 * 7)) from the node"],
                          env={agent.CONFIG_VARIABLE: str(config)}, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "42 from the node\n"), done.stderr
    # Through it, the agent's signals reach the command (mpirun ending its daemons, a cancel).
    entry["resident"] = {**dockerexec.ensure_server(node.client.api, node.name, node.attrs["State"]["Pid"]),
                         "before": ["/bin/sh", "-c"]}
    config.write_bytes(marshal.dumps({"exec": {"node-0": entry}, "host_env": {"PATH": os.environ["PATH"]}}))
    waiting = subprocess.Popen([sys.executable, "-SI", agent.__file__, "node-0", "exec sleep 3600"],
                               env={agent.CONFIG_VARIABLE: str(config)})
    wait_until(lambda: "sleep 3600" in str(node.top()["Processes"]), 10, "the command runs in the node")
    waiting.terminate()
    assert waiting.wait(timeout=10) == 128 + signal.SIGTERM
    assert "sleep 3600" not in str(node.top()["Processes"])


@pytest.mark.parametrize("backend", ["docker"])
def test_the_resident_agent_serves_the_host_only_and_the_host_checks_it(emu: Emulator, cluster, make_job,
                                                                         tmp_path: Path) -> None:
    cluster(max_nodes=1, idle_seconds_before_scaledown=120)
    _launched(emu, make_job)
    node = _node(emu)
    init = node.attrs["State"]["Pid"]
    setpriv = dockerexec.setpriv_path()
    # A job's process asks the node's server to run something: it is hung up on, nothing runs.
    ask = ("import _socket, os, sys\n"
           "s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET); s.connect(sys.argv[1])\n"
           "fds = b''.join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))\n"
           "try:\n"
           "    s.sendmsg([b'/usr/bin/touch\\0/tmp/ran-by-server'], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])\n"
           "    print('answer:', s.recv(64) or 'hung up', flush=True)\n"
           "except (BrokenPipeError, ConnectionResetError):\n    print('answer: hung up', flush=True)\n")
    code, out = node.exec_run([setpriv, f"--bounding-set=-{dockerexec.KEPT_ONLY}", "--", sys.executable, "-c", ask,
                               dockerexec.SERVER_SOCKET])
    assert code == 0 and b"answer: hung up" in out, out
    assert node.exec_run(["test", "-e", "/tmp/ran-by-server"])[0] == 1
    # The host reaches it; the same request from here runs.
    server = dockerexec.ensure_server(node.client.api, node.name, init)
    assert server is not None
    with open(os.devnull, "rb") as null:
        status = run_resident({**server, "before": []}, ["/usr/bin/touch", "/tmp/ran-by-server"]) \
            if os.dup2(null.fileno(), 0) == 0 else None
    assert status == 0 and node.exec_run(["test", "-e", "/tmp/ran-by-server"])[0] == 0
    # A socket that is not the node's server is never sent anything: one in this machine's namespaces,
    # and one a job put in place of the server's (its process lacks the node's capabilities).
    outside = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    outside.bind(str(tmp_path / "impostor.sock"))
    outside.listen(1)
    assert run_resident({**server, "socket": str(tmp_path / "impostor.sock"), "before": []}, ["/bin/true"]) is None
    impostor = ("import _socket, os, sys, time\n"
                "if sys.argv[1] == 'replace': os.unlink(sys.argv[2])\n"
                "s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)\n"
                "s.bind(sys.argv[2]); s.listen(1); print('bound', flush=True); time.sleep(float(sys.argv[3]))\n")
    job = [setpriv, f"--bounding-set=-{dockerexec.KEPT_ONLY}", "--", sys.executable, "-c", impostor]
    planted = subprocess.Popen(["docker", "exec", node.name, *job, "beside", "/tmp/impostor.sock", "30"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert planted.stdout.readline() == "bound\n"
        assert run_resident({**server, "socket": f"/proc/{init}/root/tmp/impostor.sock", "before": []},
                            ["/bin/true"]) is None
    finally:
        planted.kill()
        planted.wait()
    # A job's socket in place of the server's, left behind: refused (docker exec then), and the server
    # binds its socket again (nodeserver.CHECK) and serves the host as before.
    code, out = node.exec_run([*job, "replace", dockerexec.SERVER_SOCKET, "0"])
    assert (code, out) == (0, b"bound\n")
    wait_until(lambda: run_resident({**server, "before": []}, ["/bin/true"]) == 0, 15, "the server's socket is back")
