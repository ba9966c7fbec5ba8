"""How the platform runs a command on a docker node: `docker exec` into the node's container, or
its resident agent, whose shell sources the run's env file, as sshd would run it (the argvs are
pure; the resident agent's checks read /proc).

A node's container outlives its jobs (a warm node runs the next job of its cluster) and so do two of
its processes: its init (tini) and the `sleep` it waits on. A job's processes are root in the
container, as on AmlCompute, and the kernel lets a process trace, or read the environment of,
another of the same user whose capabilities are no more than its own. So a job could have planted
itself in the kept processes and read or changed the next job on that node (its variables, its
secrets). The job's processes therefore run with one capability fewer than the kept ones
(`KEPT_ONLY`, which no training job uses: writing the kernel's audit log): then tracing them, or
reading their /proc files, needs CAP_SYS_PTRACE, which nodes never have. On AmlCompute's Ubuntu
hosts, Yama (ptrace_scope 1) forbids that tracing as well. A job image's container is made anew for
every job instead (docker.py `fits`), as AmlCompute starts each job's container from its image, so
nothing of it is kept; `setpriv` is this machine's, which only the host-mirror node has.

A mirror node on this machine's engine also keeps a resident agent (nodeserver.py): the node's
command starts it, with the kept processes' capabilities, and it runs a launch's argv without
`docker exec` (~120 ms per node and launch), then becomes the node's idle `sleep` after
SERVER_IDLE seconds without one; the platform starts another by `docker exec` for the next run
that finds none answering. The launch agent falls back to `docker exec` wherever it is not there or
not the node's own (runs/agent.py). It lives on a small tmpfs of the node's (AGENT_DIR), which the
host reaches through the node's init (/proc/<pid>/root).
"""
from __future__ import annotations

import _socket
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

NODE_EXEC = '. "$1" && exec /bin/sh -c "$2"'
KEPT_ONLY = "audit_write"  # in Docker's default set, dropped for everything a job runs
CAP_AUDIT_WRITE = 29  # its bit in /proc/<pid>/status CapBnd
AGENT_DIR = "/var/lib/amlemu"  # the node's tmpfs for its resident agent (not a scratch folder: kept across jobs)
AGENT_TMPFS = "size=64k,mode=0700"  # a socket and nothing else: a job cannot fill memory through it
SERVER_SCRIPT = f"{AGENT_DIR}/nodeserver.py"
SERVER_SOCKET = f"{AGENT_DIR}/agent.sock"
SERVER_WAIT = 1.0  # seconds a launch waits for a resident agent that is starting (else: docker exec)
SERVER_IDLE = 120  # seconds a resident agent waits for a launch before it leaves (AmlCompute's default idle before scale-down)


def setpriv_path() -> str | None:
    """This machine's setpriv, by the path a host-mirror node sees it at (its /usr, bound read-only)."""
    found = shutil.which("setpriv")
    return os.path.realpath(found) if found else None


def node_argv(setpriv: str | None, env_file: str, command: str) -> list[str]:
    """`command` in the node's shell after the run's env file; below the kept processes' capabilities
    where the node has this machine's setpriv (a host-mirror node)."""
    drop = [setpriv, f"--bounding-set=-{KEPT_ONLY}", "--"] if setpriv else []
    return [*drop, "/bin/sh", "-c", NODE_EXEC, "amlemu-node", env_file, command]


def exec_argv(docker: str, engine_options: list[str], container: str, setpriv: str | None, env_file: str,
              command: str) -> list[str]:
    """The same through `docker exec -i` into the node's container."""
    return [docker, *engine_options, "exec", "-i", container, *node_argv(setpriv, env_file, command)]


def server_argv() -> list[str]:
    """The resident agent as the node runs it: this machine's interpreter, on the node's mirrored /usr
    or prefix, without site (nodeserver.py imports only what is built in)."""
    return [os.path.realpath(sys.executable), "-SI", SERVER_SCRIPT, SERVER_SOCKET, str(SERVER_IDLE)]


def server_volume() -> dict[str, dict[str, str]]:
    return {str(Path(__file__).with_name("nodeserver.py")): {"bind": SERVER_SCRIPT, "mode": "ro"}}


def is_server(cmdline: list[str]) -> bool:
    return cmdline[2:4] == [SERVER_SCRIPT, SERVER_SOCKET]


def platform_started(pid: int) -> bool:
    """Whether a node's process was started by the platform, not by a job: its bounding set still
    holds CAP_AUDIT_WRITE, which every job process loses and none can regain. A command line is no
    proof: a job can orphan a process whose argv ends in `sleep infinity`."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    bounding = next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith("CapBnd:")), 0)
    return bool(bounding >> CAP_AUDIT_WRITE & 1)


def server_answers(init_pid: int) -> bool:
    """Whether the node's own resident agent listens on its socket (the check runs/agent.py makes)."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    try:
        sock.settimeout(1.0)
        sock.connect(f"/proc/{init_pid}/root{SERVER_SOCKET}")
        pid = int.from_bytes(sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)[:4], sys.byteorder)
        return pid > 0 and os.stat(f"/proc/{pid}/ns/pid").st_ino == os.stat(f"/proc/{init_pid}/ns/pid").st_ino \
            and platform_started(pid)
    except OSError:
        return False
    finally:
        sock.close()


def start_server(api: Any, container: str) -> None:
    """Start the node's resident agent, detached, with the node's own capabilities (a job's are fewer)."""
    exec_id = api.exec_create(container, server_argv(), user="0", stdout=False, stderr=False)["Id"]
    api.exec_start(exec_id, detach=True)


def ensure_server(api: Any, container: str, init_pid: int) -> dict[str, Any] | None:
    """The node's resident agent as the launch agent reaches it (its socket through the node's init,
    the node's PID namespace), started first where it does not answer (a node made before resident
    agents, one idle past SERVER_IDLE, or one a job killed); None where the node is gone, or where
    this user cannot look into the node's root (not root: docker exec then)."""
    if os.geteuid() != 0:
        return None
    try:
        if not server_answers(init_pid):
            if not _starting(init_pid):  # the node's command is not starting one (a new node's is)
                start_server(api, container)
            deadline = time.monotonic() + SERVER_WAIT  # ~30 ms quiet, where a launch by docker exec costs ~120
            while not server_answers(init_pid) and time.monotonic() < deadline:
                time.sleep(0.01)
        return {"socket": f"/proc/{init_pid}/root{SERVER_SOCKET}", "pidns": os.stat(f"/proc/{init_pid}/ns/pid").st_ino}
    except Exception:  # noqa: BLE001 - the node gone, or its engine refusing: docker exec then
        return None


def _starting(init_pid: int) -> bool:
    """Whether the node's init runs its resident agent (the node's command, still starting)."""
    try:
        children = Path(f"/proc/{init_pid}/task/{init_pid}/children").read_text().split()
        return any(is_server(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0"))
                   for pid in children)
    except OSError:
        return False


def resident(server: dict[str, Any], setpriv: str | None, env_file: str, command: str) -> dict[str, Any]:
    """What the launch agent sends the resident agent (runs/agent.py `run_resident`): the node's argv
    before `command`, beside `server` (ensure_server)."""
    argv = node_argv(setpriv, env_file, command)
    return {**server, "before": argv[:argv.index(command)]}
