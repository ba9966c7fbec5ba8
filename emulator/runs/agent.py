"""The remote-launch agent: `amlemu-agent <host> <command...>`, run as `ssh <host> <command>` would be.

mpirun (on the host) runs it once per node with the node's MPI daemon command (MPI jobs, in place
of ssh); the supervisor runs it once per process of a job whose nodes start their processes
themselves (pytorch, tensorflow, a single process: runs/launchers.py). The agent looks the host
up in its configuration (agent-config.marshal, named by AMLEMU_AGENT_CONFIG, written by the run's
supervisor, owner-only), where the supervisor has put, for each host, the argv that runs a command
on that node as its backend says (`agent_argv` on its class in emulator/backends/: `docker exec -i`
into a container, or a process node's sandbox in namespaces of its own): the agent puts the command
in its place and becomes that program.

The job is untrusted code, so nothing it declared touches the host side: the agent runs the
programs the configuration names by absolute path, with an environment fixed by the platform (its
`host_env`), never the job's. The job's variables reach only the node, through the env file the
supervisor wrote on the node's disk, which the node's shell sources before running the command.

Where a docker node has its resident agent (backends/nodeserver.py), the agent asks it instead of
starting `docker exec`: it hands the node's argv and its own stdin, stdout and stderr over the
server's socket, waits for the command's end and exits with its status, forwarding the signals
it gets. It does so only after checking that the socket's peer is the node's own server: in the
node's PID namespace (recorded by the supervisor) and still holding the capability no job process
has (dockerexec.KEPT_ONLY). A job can unlink or replace that socket; then, as where the server is
not running, the agent falls back to `docker exec`.

It starts once per node on every launch (`python -SI`), so it imports nothing that is not built
into the interpreter or beside it: the backends, resolved by the supervisor once per run, cost
~45 ms more per node, and json (its `re` and `enum`) ~17 ms; the configuration is in `marshal`'s
format, written by the same interpreter (the supervisor's, which runs mpirun with this file:
runs/plan.py).
"""
import _signal
import marshal
import os
import sys

# The configuration: {"exec": {host: {"before", "after", "record", "resident"}}, "host_env": {...}};
# "resident": {"socket", "pidns", "before"} where the node's resident agent may run the command.
Config = dict
CAP_AUDIT_WRITE = 29  # dockerexec.CAP_AUDIT_WRITE: what the node's server keeps and its jobs lack
LOST = 255  # as ssh answers a connection lost before the command's end

CONFIG_VARIABLE = "AMLEMU_AGENT_CONFIG"  # amlemu.home.AGENT_CONFIG_VARIABLE (tests/test_contract.py keeps them one)


class AgentError(RuntimeError):
    pass


def agent_command(config: Config, host: str, command: str) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) that run `command` on `host` as the configuration describes it."""
    table = config.get("exec") or {}
    if host not in table:
        raise AgentError(f"host {host} is not a node of this run ({', '.join(table)})")
    entry = table[host]
    return [*entry["before"], command, *entry["after"]], dict(config["host_env"])


def record(path: str) -> None:
    """This process's pid and start time (as psutil computes create_time) in `path`, before it becomes
    the node's sandbox (same pid after exec): so that stopping the node finds it, and never a reused pid."""
    with open("/proc/self/stat") as stat:
        start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
    with open("/proc/stat") as machine:
        boot = next(int(line.split()[1]) for line in machine if line.startswith("btime "))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as out:
        out.write(f"{os.getpid()}:{boot + start_ticks / os.sysconf('SC_CLK_TCK')}\n")


def _peer_is_server(sock, pidns: int) -> bool:  # type: ignore[no-untyped-def]
    import _socket  # noqa: PLC0415 - only where a resident agent is configured

    pid = int.from_bytes(sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)[:4], sys.byteorder)
    with open(f"/proc/{pid}/status") as fh:
        bounding = next((int(line.split()[1], 16) for line in fh if line.startswith("CapBnd:")), 0)
    return pid > 0 and os.stat(f"/proc/{pid}/ns/pid").st_ino == pidns and bool(bounding >> CAP_AUDIT_WRITE & 1)


def run_resident(resident: dict, argv: list[str]) -> int | None:
    """`argv` run by the node's resident agent with this process's stdin, stdout and stderr; its
    exit status (128 + N for signal N), or None where the server is not there, or not the node's:
    nothing was sent, and the caller falls back to `docker exec`."""
    import _socket  # noqa: PLC0415

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    try:
        sock.settimeout(1.0)
        sock.connect(resident["socket"])
        if not _peer_is_server(sock, resident["pidns"]):
            raise OSError("not the node's server")
        fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))
        sock.sendmsg([b"\0".join(os.fsencode(a) for a in argv)], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
    except (OSError, ValueError, StopIteration):
        sock.close()
        return None
    sock.settimeout(None)

    def forward(signum: int, _frame: object) -> None:
        try:
            sock.send(b"kill %d" % signum)
        except OSError:
            pass
    for signum in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(signum, forward)
    try:
        message = sock.recv(64)
    except OSError:
        message = b""
    kind, _, value = message.partition(b" ")
    if not value.isdigit():
        return LOST
    return int(value) if kind == b"exit" else 128 + int(value)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print("usage: amlemu-agent <host> <command...>", file=sys.stderr)
        return 2
    config_path = os.environ.get(CONFIG_VARIABLE)
    if not config_path:
        print(f"amlemu-agent: {CONFIG_VARIABLE} is not set (the agent is started by a run's mpirun)", file=sys.stderr)
        return 2
    try:
        with open(config_path, "rb") as fh:
            config = marshal.load(fh)
        command, env = agent_command(config, argv[0], " ".join(argv[1:]))
        entry = config["exec"][argv[0]]  # there: agent_command checked the host
        if resident := entry.get("resident"):
            status = run_resident(resident, [*resident["before"], " ".join(argv[1:]), *entry["after"]])
            if status is not None:
                return status
        recorded = entry.get("record")
        if recorded:
            record(recorded)
    except (OSError, ValueError, EOFError, TypeError, KeyError, AgentError) as exc:
        print(f"amlemu-agent: {exc}", file=sys.stderr)
        return 2
    os.execve(command[0], command, env)  # an absolute path: no PATH lookup
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
