"""The remote-launch agent Open MPI calls instead of ssh: `amlemu-agent <host> <command...>`.

mpirun (on the host) runs it once per node with the node's MPI daemon command, as it would run
`ssh <host> <command>`. The agent looks the host up in the run's launch plan (a JSON file named by
AMLEMU_AGENT_PLAN, written by the run's supervisor, owner-only) and runs the command on that node:

- docker nodes: `docker exec -i` into the node's container;
- process nodes: a sandbox (emulator/runs/sandbox.sh) in new mount, UTS and PID namespaces whose root
  holds only this machine's software (read-only), the node's own disk and its read-only cache,
  entered with every capability dropped.

The job is untrusted code, so nothing it declared touches the host side: the agent runs the
programs the plan names by absolute path, with an environment fixed by the platform (the plan's
`host_env`), never the job's. The job's variables reach only the node, through the env file the
supervisor wrote on the node's disk, which the node's shell sources before running the command.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

PLAN_VARIABLE = "AMLEMU_AGENT_PLAN"
SANDBOX = Path(__file__).with_name("sandbox.sh")
# Inside the node: the run's environment, then the command (as sshd would run it, in a shell).
NODE_EXEC = '. "$1" && exec /bin/sh -c "$2"'


class AgentError(RuntimeError):
    pass


def agent_command(plan: dict[str, Any], host: str, command: str) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) that run `command` on `host` as the plan describes it."""
    try:
        node = plan["hosts"][host]
    except KeyError:
        raise AgentError(f"host {host} is not a node of this run ({', '.join(plan['hosts'])})") from None
    tools, env_file = plan["tools"], plan["env_file"]
    if plan["backend"] == "docker":
        argv = [tools["docker"], "exec", "-i", node["container"], "/bin/sh", "-c", NODE_EXEC, "amlemu-node",
                env_file, command]
    elif plan["backend"] == "process":
        unshare = [tools["unshare"], "--mount", "--uts", "--pid", "--kill-child=SIGKILL", "--propagation", "private"]
        if not plan.get("as_root", True):
            unshare.append("--map-root-user")
        argv = [*unshare, tools["sh"], str(SANDBOX), host, node["node_dir"], node["cache_dir"], plan["sandbox_root"],
                env_file, command, *plan["software"]]
    else:
        raise AgentError(f"unknown backend {plan['backend']!r} in the launch plan")
    return argv, dict(plan["host_env"])


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
    except (OSError, ValueError, KeyError, AgentError) as exc:
        print(f"amlemu-agent: {exc}", file=sys.stderr)
        return 2
    if plan["backend"] == "process":
        from emulator.backends.process import record_agent  # noqa: PLC0415 - psutil only where needed

        record_agent(plan["hosts"][argv[0]]["state_dir"])
    os.execve(command[0], command, env)  # an absolute path: no PATH lookup
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
