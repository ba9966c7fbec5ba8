"""The resident agent of a docker node: `python -SI nodeserver.py SOCKET IDLE_SECONDS [THEN...]`,
started in the node by the platform (dockerexec.py), so that a launch on a warm node needs no
`docker exec` (~120 ms per node and launch: the docker client, the engine, runc).

The launch agent on the host (runs/agent.py) connects to SOCKET (a SOCK_SEQPACKET socket on the
node's private tmpfs, which the host reaches through /proc/<init>/root), sends the argv to run and
its own stdin, stdout and stderr (SCM_RIGHTS), and waits: this server spawns the argv in a session
of its own with those descriptors, as `docker exec -i` would with the container's environment, and
answers `exit N` or `signal N` when it ends. `kill N` from the agent signals the session; an agent
gone before its command ended hangs the session up (SIGHUP), as sshd does.

A job is untrusted code and runs in this node, so:
- only a peer outside the node's PID namespace is served: the kernel reports its pid as 0
  (SO_PEERCRED), which no process in the node can be; everything else is closed unread;
- the server keeps the node's capabilities, which a job's processes have one fewer of
  (dockerexec.KEPT_ONLY): a job can neither trace it nor read its memory or environment, and the
  argv it is sent drops that capability itself before running anything of the job;
- a job may unlink or replace SOCKET: the host checks its peer (runs/agent.py) and falls back to
  `docker exec`; the server binds its socket again within CHECK seconds.

It imports only what is built into the interpreter or beside it, and leaves when idle for
IDLE_SECONDS, becoming THEN where given (the node's command starts it, and it becomes the node's
idle `sleep`: the node then holds only its init and sleep, and nothing of the server's ~4 MiB); the
platform starts it again for the next run that finds it gone. Another server found serving the
same socket (two started at once) is left to serve, and this one leaves once the commands it
started have ended.
"""
import _signal
import _socket
import os
import select
import sys
import time

CAP_AUDIT_WRITE = 29  # dockerexec.CAP_AUDIT_WRITE
CHECK = 2.0  # seconds between checks that SOCKET is still this server's
MAX_REQUEST = 1 << 16  # an argv: the MPI daemon's command line is ~3 KiB


def listen(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    server = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    server.bind(path)
    os.chmod(path, 0o600)
    server.listen(64)
    return server, os.stat(path).st_ino


def another_server(path):
    """Whether `path` is served by another process the platform started (its bounding set holds
    CAP_AUDIT_WRITE, which a job's processes lack: dockerexec.platform_started)."""
    probe = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
        pid = int.from_bytes(probe.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)[:4], sys.byteorder)
        with open(f"/proc/{pid}/status") as fh:
            bounding = next((int(line.split()[1], 16) for line in fh if line.startswith("CapBnd:")), 0)
        return pid > 0 and pid != os.getpid() and bool(bounding >> CAP_AUDIT_WRITE & 1)
    except (OSError, ValueError):
        return False
    finally:
        probe.close()


def from_outside(conn):
    """Whether the peer is outside this node's PID namespace (its pid reads 0 here)."""
    creds = conn.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    return int.from_bytes(creds[:4], sys.byteorder) == 0


def request(conn):
    """(argv, [stdin, stdout, stderr]) sent by the launch agent, or None."""
    data, ancillary, _flags, _addr = conn.recvmsg(MAX_REQUEST, _socket.CMSG_SPACE(3 * 4), _socket.MSG_CMSG_CLOEXEC)
    fds = []
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += [int.from_bytes(payload[i:i + 4], sys.byteorder) for i in range(0, len(payload) - 3, 4)]
    argv = data.split(b"\0") if data else []
    if len(fds) != 3 or not argv or not argv[0].startswith(b"/"):
        for fd in fds:
            os.close(fd)
        return None
    return argv, fds


def spawn(argv, fds):
    actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(fds)]
    try:
        return os.posix_spawn(argv[0], argv, os.environ, file_actions=actions, setsid=True)
    finally:
        for fd in fds:
            os.close(fd)


def signal_group(pid, signum):
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError, ValueError):
        pass


def answer(conn, status):
    code = os.waitstatus_to_exitcode(status)
    try:
        conn.send(b"signal %d" % -code if code < 0 else b"exit %d" % code)
    except OSError:
        pass


class Server:
    def __init__(self, path):
        self.path = path
        self.listener, self.inode = listen(path)
        self.conns = {}  # conn -> the pid it started (None: not yet)
        self.children = {}  # pid -> its conn (None: its agent is gone)

    def reap(self):
        while self.children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                answer(conn, status)
                self.conns.pop(conn, None)
                conn.close()

    def accept(self):
        conn = _socket.socket(fileno=self.listener._accept()[0])  # accept4(SOCK_CLOEXEC)
        if from_outside(conn):
            self.conns[conn] = None
        else:
            conn.close()

    def handle(self, conn):
        """A request (start its argv), a signal for its session, or its agent gone (hang it up)."""
        pid = self.conns[conn]
        try:
            if pid is None:
                got = request(conn)
                if got is None:
                    raise OSError("not a request")
                try:
                    self.conns[conn] = pid = spawn(*got)
                except OSError:
                    conn.send(b"exit 127")  # as a shell answers a program it cannot run
                    raise
                self.children[pid] = conn
                return
            message = conn.recv(64)
        except OSError:
            message = b""
        if message.startswith(b"kill ") and message[5:].isdigit():
            signal_group(pid, int(message[5:]))
            return
        self.conns.pop(conn)
        conn.close()
        if pid is not None and pid in self.children:
            self.children[pid] = None
            signal_group(pid, _signal.SIGHUP)

    def keep_socket(self):
        """The path ours again where it was unlinked or replaced (by a job); False where another
        server of the platform's serves it."""
        try:
            current = os.stat(self.path).st_ino
        except OSError:
            current = None
        if current != self.inode:
            if current is not None and another_server(self.path):
                return False
            self.listener.close()
            self.listener, self.inode = listen(self.path)
        return True


def serve(path, idle):
    os.chdir("/")
    server = Server(path)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    _signal.set_wakeup_fd(wake_w)
    _signal.signal(_signal.SIGCHLD, lambda *_: None)
    last = time.monotonic()
    while True:
        listening = [server.listener] if server.listener is not None else []
        ready = select.select([*listening, wake_r, *server.conns], [], [], CHECK)[0]
        if wake_r in ready:
            os.read(wake_r, 512)
            server.reap()
        if listening and server.listener in ready:
            server.accept()
        for conn in [c for c in ready if c in server.conns]:
            server.handle(conn)
        busy = bool(server.conns or server.children)
        if busy:
            last = time.monotonic()
        if listening and not server.keep_socket():  # another server listens: serve ours out, then leave
            server.listener.close()
            server.listener = None
        if server.listener is None and not busy:
            return
        if not busy and time.monotonic() - last > idle:
            os.unlink(path)
            return


def main(argv):
    try:
        serve(argv[1], float(argv[2]))
    finally:  # idle, another server serving, or a failure of this one: the node keeps its sleep
        if argv[3:]:
            os.execv(argv[3], argv[3:])


if __name__ == "__main__":
    main(sys.argv)
