"""The remote-launch agent Open MPI calls instead of ssh: `amlemu-agent <host> <command...>`.

mpirun (on the host) runs it once per node with the node's MPI daemon command, as it would run
`ssh <host> <command>`. The agent looks the host up in the run's launch plan (a JSON file named by
AMLEMU_AGENT_PLAN, written by the run's supervisor) and runs the command on that node:

- docker nodes: `docker exec -i` into the node's container;
- process nodes: a new UTS + mount namespace with the node's hostname, its local disk at
  /mnt/azureml and the run records at /mnt/amlemu/runs (the same view a container has).

Either way the node's processes get the run's and the node's environment. Values travel in the
environment, never in argv, so no secret shows in a process listing.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

PLAN_VARIABLE = "AMLEMU_AGENT_PLAN"

# Runs inside the new namespaces: $1 host, $2 node disk, $3 run records, $4 blob cache, $5 the command.
# The cache is bound read-only (a write fails with EROFS), as the docker backend mounts it.
NODE_SETUP = ('mount -t tmpfs amlemu-node /mnt && mkdir -p /mnt/azureml /mnt/amlemu/runs /mnt/amlemu/cache'
              ' && mount --bind "$2" /mnt/azureml && mount --bind "$3" /mnt/amlemu/runs'
              ' && mount --bind "$4" /mnt/amlemu/cache && mount -o remount,bind,ro /mnt/amlemu/cache'
              ' && hostname "$1" && exec /bin/sh -c "$5"')


class AgentError(RuntimeError):
    pass


def agent_command(plan: dict[str, Any], host: str, command: str) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) that run `command` on `host` as the plan describes it."""
    try:
        node = plan["hosts"][host]
    except KeyError:
        raise AgentError(f"host {host} is not a node of this run ({', '.join(plan['hosts'])})") from None
    env = {**plan.get("env", {}), **node.get("env", {})}
    if plan["backend"] == "docker":
        names = [arg for name in sorted(env) for arg in ("-e", name)]
        return ["docker", "exec", "-i", *names, node["container"], "/bin/sh", "-c", command], env
    if plan["backend"] == "process":
        unshare = ["unshare", "--mount", "--uts", "--propagation", "private"]
        if not plan.get("as_root", True):
            unshare.append("--map-root-user")
        return [*unshare, "/bin/sh", "-c", NODE_SETUP, "amlemu-node", host, node["node_dir"],
                plan["runs_dir"], node["cache_dir"], command], env
    raise AgentError(f"unknown backend {plan['backend']!r} in the launch plan")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print("usage: amlemu-agent <host> <command...>", file=sys.stderr)
        return 2
    plan_path = os.environ.get(PLAN_VARIABLE)
    if not plan_path:
        print(f"amlemu-agent: {PLAN_VARIABLE} is not set (the agent is started by a run's mpirun)",
              file=sys.stderr)
        return 2
    try:
        plan = json.loads(Path(plan_path).read_text())
        command, env = agent_command(plan, argv[0], " ".join(argv[1:]))
    except (OSError, ValueError, AgentError) as exc:
        print(f"amlemu-agent: {exc}", file=sys.stderr)
        return 2
    if plan["backend"] == "process":
        from .backends.process import record_agent  # noqa: PLC0415 - psutil only where needed

        record_agent(plan["hosts"][argv[0]]["node_dir"])
    os.execvpe(command[0], command, {**os.environ, **env})
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
