"""How the platform runs a command on a docker node (pure): `docker exec` into the node's
container, whose shell sources the run's env file, as sshd would run it.

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
"""
from __future__ import annotations

import os
import shutil

NODE_EXEC = '. "$1" && exec /bin/sh -c "$2"'
KEPT_ONLY = "audit_write"  # in Docker's default set, dropped for everything a job runs


def setpriv_path() -> str | None:
    """This machine's setpriv, by the path a host-mirror node sees it at (its /usr, bound read-only)."""
    found = shutil.which("setpriv")
    return os.path.realpath(found) if found else None


def exec_argv(docker: str, engine_options: list[str], container: str, setpriv: str | None, env_file: str,
              command: str) -> list[str]:
    """`command` in the node's shell after the run's env file; below the kept processes' capabilities
    where the node has this machine's setpriv (a host-mirror node)."""
    drop = [setpriv, f"--bounding-set=-{KEPT_ONLY}", "--"] if setpriv else []
    return [docker, *engine_options, "exec", "-i", container, *drop, "/bin/sh", "-c", NODE_EXEC, "amlemu-node",
            env_file, command]
