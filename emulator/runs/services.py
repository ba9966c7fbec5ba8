"""A job's interactive services (`services:` in its YAML) as a plan: pure data, what the dry run
shows and the supervisor starts (runs/servicerun.py) beside the job, for the job's lifetime.

- jupyter_lab: `jupyter lab` in the job's working folder, no browser, with a token of the run's own
  that the node's shell reads from its standard input (never on a command line, a plan or a log:
  Jupyter prints a token it was given as `...`).
- tensor_board: `tensorboard --logdir <log_dir>`, log_dir relative to the job's working folder.

Each listens on its node's address (a process node's loopback in its cluster's network namespace,
a docker node's address on its cluster network), on the head node or, with `nodes: all`, on every
node; the host reaches it through a relay of the run's own on 127.0.0.1 (runs/relay.py). A node
whose environment lacks the program exits MISSING_EXIT before starting anything: the service is
skipped with `missing_notice`, naming the package to add; the job runs on. ssh, vs_code and the
rest are noticed in the JobSpec (specs.ServiceSpec.notice).
"""
from __future__ import annotations

import posixpath
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from amlemu.runs.contract import node_workdir
from amlemu.specs import JobSpec, ServiceSpec

MISSING_EXIT = 127  # the shell's own code for a command it cannot find
# type: (program looked up on the node's PATH, the package that brings it, first port, URL path)
KINDS: dict[str, tuple[str, str, int, str]] = {
    "jupyter_lab": ("jupyter", "jupyterlab", 8888, "/lab"),
    "tensor_board": ("tensorboard", "tensorboard", 6006, "/"),
}
TOKEN_VARIABLE = "JUPYTER_TOKEN"  # jupyter_server's: a token it was given, masked in its log


class Node(Protocol):  # NodeSlot and NodePlan alike
    name: str
    address: str


@dataclass(frozen=True)
class ServicePlan:
    """One service on one node."""

    name: str
    type: str
    node: str
    address: str  # where it listens on the node
    port: int  # on the node (the host's end of the relay is chosen when it starts)
    argv: tuple[str, ...]  # what runs on the node, in the job's working folder
    program: str  # looked up on the node's PATH first
    package: str  # what an environment without the program needs
    url_path: str  # what a browser opens: the endpoint's path
    token: bool  # reads its token from standard input (jupyter_lab)
    launch: tuple[str, ...]  # what the host runs: the launch agent, the node, the shell command

    @property
    def key(self) -> str:
        return f"{self.name}@{self.node}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "argv": list(self.argv), "launch": list(self.launch)}


def service_argv(kind: str, address: str, port: int, workdir: str, log_dir: str | None = None) -> list[str]:
    """The command of a service of `kind` listening on address:port of its node."""
    if kind == "jupyter_lab":
        return ["jupyter", "lab", "--no-browser", "--allow-root", f"--ip={address}", f"--port={port}",
                "--ServerApp.port_retries=0", f"--ServerApp.root_dir={workdir}"]
    if kind == "tensor_board":  # an absolute log_dir stays as it is
        return ["tensorboard", f"--logdir={posixpath.join(workdir, log_dir or '.')}", f"--host={address}",
                f"--port={port}"]
    raise ValueError(f"services of type {kind} do not run here")


def service_command(program: str, argv: Sequence[str], workdir: str, token: bool) -> str:
    """The shell command the launch agent runs on the node (after its shell sourced the run's env
    file): MISSING_EXIT when the node's environment lacks the program; the token from stdin."""
    steps = [f"command -v {shlex.quote(program)} >/dev/null 2>&1 || exit {MISSING_EXIT}"]
    if token:
        steps.append(f"read -r {TOKEN_VARIABLE} && export {TOKEN_VARIABLE}")
    steps.append(f"cd {shlex.quote(workdir)} && exec {shlex.join(argv)}")
    return "; ".join(steps[:1]) + "; " + " && ".join(steps[1:])


def missing_notice(plan: ServicePlan) -> str:
    return (f"services.{plan.name} ({plan.type}) is skipped on {plan.node}: the job's environment has no "
            f"`{plan.program}`; add {plan.package} to the environment (its conda file or image) to open it")


def default_ports(job: JobSpec, nodes: Sequence[Node]) -> dict[str, int]:
    """Each service's port on each node: its type's first port, then the next, unique in the run
    (a dry run's; where a cluster's nodes share a network the supervisor picks free ones)."""
    ports: dict[str, int] = {}
    used: dict[str, int] = {}
    for service, node in placements(job, nodes):
        ports[f"{service.name}@{node.name}"] = KINDS[service.type][2] + used.get(service.type, 0)
        used[service.type] = used.get(service.type, 0) + 1
    return ports


def placements(job: JobSpec, nodes: Sequence[Node]) -> list[tuple[ServiceSpec, Node]]:
    """(service, node) for each service that runs here: the head node, or every node with nodes: all."""
    return [(service, node) for service in job.services if service.type in KINDS
            for node in (nodes if service.nodes == "all" else nodes[:1])]


def plan_services(job: JobSpec, run_id: str, nodes: Sequence[Node], *, agent: str,
                  ports: Mapping[str, int] | None = None) -> tuple[ServicePlan, ...]:
    """Every service of the job on its nodes (pure). `ports`: "<name>@<node>" -> port on the node
    (default_ports for the rest)."""
    chosen = {**default_ports(job, nodes), **(ports or {})}
    workdir = node_workdir(run_id)
    found = []
    for service, node in placements(job, nodes):
        program, package, _, url_path = KINDS[service.type]
        port = chosen[f"{service.name}@{node.name}"]
        argv = tuple(service_argv(service.type, node.address, port, workdir, service.log_dir))
        token = service.type == "jupyter_lab"
        command = service_command(program, argv, workdir, token)
        found.append(ServicePlan(service.name, service.type, node.name, node.address, port, argv, program,
                                 package, url_path, token, (agent, node.name, command)))
    return tuple(found)
