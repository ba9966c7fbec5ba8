"""The remote-launch agent: `amlemu-agent <host> <command...>`, run as `ssh <host> <command>` would be.

mpirun (on the host) runs it once per node with the node's MPI daemon command (MPI jobs, in place
of ssh); the supervisor runs it once per process of a job whose nodes start their processes
themselves (pytorch, tensorflow, a single process: runs/launchers.py). The agent looks the host
up in its configuration (agent-config.json, named by AMLEMU_AGENT_CONFIG, written by the run's
supervisor, owner-only) and runs the command on that node as the configuration's backend says
(`agent_argv` on its class in emulator/backends/: `docker exec -i` into a container, or a process
node's sandbox in namespaces of its own).

The job is untrusted code, so nothing it declared touches the host side: the agent runs the
programs the configuration names by absolute path, with an environment fixed by the platform (its
`host_env`), never the job's. The job's variables reach only the node, through the env file the
supervisor wrote on the node's disk, which the node's shell sources before running the command.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

# Only the registry and the one backend module the configuration names: the agent starts once per node.
from amlemu.backends import backend_class
from amlemu.backends.base import NodeBackend
from amlemu.errors import ConfigError
from amlemu.home import AGENT_CONFIG_VARIABLE


class AgentError(RuntimeError):
    pass


def _backend(config: dict[str, Any], host: str) -> type[NodeBackend]:
    if host not in config["hosts"]:
        raise AgentError(f"host {host} is not a node of this run ({', '.join(config['hosts'])})")
    try:
        return backend_class(config["backend"])
    except ConfigError:
        raise AgentError(f"unknown backend {config['backend']!r} in the agent's configuration") from None


def agent_command(config: dict[str, Any], host: str, command: str) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) that run `command` on `host` as the configuration describes it."""
    return _backend(config, host).agent_argv(config, host, command), dict(config["host_env"])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print("usage: amlemu-agent <host> <command...>", file=sys.stderr)
        return 2
    config_path = os.environ.get(AGENT_CONFIG_VARIABLE)
    if not config_path:
        print(f"amlemu-agent: {AGENT_CONFIG_VARIABLE} is not set (the agent is started by a run's mpirun)",
              file=sys.stderr)
        return 2
    try:
        config = json.loads(Path(config_path).read_text())
        command, env = agent_command(config, argv[0], " ".join(argv[1:]))
    except (OSError, ValueError, KeyError, AgentError) as exc:
        print(f"amlemu-agent: {exc}", file=sys.stderr)
        return 2
    _backend(config, argv[0]).before_agent_exec(config, argv[0])
    os.execve(command[0], command, env)  # an absolute path: no PATH lookup
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
