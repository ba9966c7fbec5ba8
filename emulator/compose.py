"""A compose file of an emulated cluster, made from the docker backend's dry run: the same
containers, network, labels, mounts and limits (the VM size's) the docker backend makes, for
people who want to see or drive the nodes with docker-compose.

    python -m amlemu.compose [--nodes 2] > compose/cluster-2nodes.yml
    python -m amlemu.compose --import-image   # the offline node image `up` needs (no registry has it)

Machine-specific paths and the home's id become variables (AMLEMU_HOME, AMLEMU_HOME_ID,
AMLEMU_VENV, AMLEMU_PYTHON), each with a default (compose 2.4's `${NAME:-default}`), so the file
is the same on every machine and works with no variable set.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from amlemu.backends import dockerexec
from amlemu.backends.docker import DockerBackend
from amlemu.backends.dockerplan import ContainerPlan
from amlemu.cluster.autoscale import node_request
from amlemu.home import Home
from amlemu.skus import GIB
from amlemu.specs import ClusterSpec

PLACEHOLDER_HOME = Path("/amlemu-home-placeholder")
# Without variables: a home of its own under ~/.amlemu (never a workspace's node folders), the id
# `compose` (its containers and network are amlemu-compose-...), this repository's .venv (relative
# to compose/, where the file is) seen at /opt/amlemu/venv in the nodes, and /usr/local as the
# Python (already inside the /usr mount: set AMLEMU_PYTHON only for a Python outside /usr).
REPO = Path(__file__).resolve().parent.parent  # emulator/ is the package's folder
HOME_VAR = "${AMLEMU_HOME:-~/.amlemu/compose}"
HOME_ID_VAR = "${AMLEMU_HOME_ID:-compose}"
VENV_HOST_VAR = "${AMLEMU_VENV:-../.venv}"
VENV_NODE_VAR = "${AMLEMU_VENV:-/opt/amlemu/venv}"
PYTHON_VAR = "${AMLEMU_PYTHON:-/usr/local}"


def compose_from_plans(plans: list[dict[str, Any]]) -> dict[str, Any]:
    """docker backend node plans (its dry run) -> a compose (file format 2.4) document. Pure."""
    network = plans[0]["network"]
    services = {}
    for plan in plans:
        volumes = plan["volumes"]
        service = {
            "image": plan["image"], "container_name": plan["name"], "hostname": plan["hostname"],
            "command": plan["command"], "init": plan["init"], "environment": plan["environment"],
            "labels": plan["labels"],
            "volumes": volumes if isinstance(volumes, list) else
            [f"{src}:{spec['bind']}:{spec['mode']}" for src, spec in volumes.items()],
            "cpu_period": plan["cpu_period"], "cpu_quota": plan["cpu_quota"],
            "mem_limit": plan["mem_limit"], "shm_size": plan["shm_size"],
            "read_only": plan["read_only"], "tmpfs": [f"{d}:{o}" for d, o in plan["tmpfs"].items()],
            "security_opt": plan["security_opt"],
            "networks": {"cluster": {"aliases": plan["aliases"]}},
        }
        if plan["gpus"]:
            service["device_requests"] = [{"device_ids": plan["gpus"], "capabilities": [["gpu"]]}]
        services[plan["hostname"]] = service
    labels = {k: v for k, v in plans[0]["labels"].items() if k in ("amlemu", "amlemu.home", "amlemu.cluster")}
    return {"version": "2.4", "services": services,
            "networks": {"cluster": {"name": network, "driver": "bridge", "labels": labels}}}


def portable(plan: ContainerPlan, home: Home) -> dict[str, Any]:
    """A mirror-image node's plan with this machine's paths as variables with defaults. The Python
    and venv mounts are always written (the same file whichever Python made it); the venv may be
    seen at another path in the node than on the host when AMLEMU_VENV is unset."""
    venv, python = str(Path(sys.prefix).resolve()), str(Path(sys.base_prefix).resolve())
    volumes = []
    for src, spec in plan.volumes.items():
        if src == venv or (src == python and src != "/usr"):  # a Python in /usr is the /usr mount
            continue
        if src.startswith(str(home.root)):
            src = HOME_VAR + src.removeprefix(str(home.root))
        elif src in dockerexec.server_volume():  # the resident agent's script: this repository's, beside compose/
            src = f"../{Path(src).relative_to(REPO)}"
        # rslave serves mounts a supervisor makes in a node's disk: none here (and a plain folder refuses it)
        volumes.append(f"{src}:{spec['bind']}:{spec['mode'].removesuffix(',rslave')}")
    at = next(i for i, v in enumerate(volumes) if v.startswith(HOME_VAR))
    volumes[at:at] = [f"{PYTHON_VAR}:{PYTHON_VAR}:ro", f"{VENV_HOST_VAR}:{VENV_NODE_VAR}:ro"]
    env = dict(plan.environment)
    env["PATH"] = env["PATH"].replace(str(Path(sys.prefix, "bin")), f"{VENV_NODE_VAR}/bin", 1)
    # Its command starts no resident agent: this machine's Python may not be at the same path where
    # the file is used; the platform starts one where it can (dockerexec.ensure_server).
    command = [plan.command[0], plan.command[1], *plan.command[-2:]]
    return {**plan.to_dict(), "volumes": volumes, "environment": env, "command": command}


def cluster_compose(nodes: int = 2, name: str = "cluster", vm_size: str = "STANDARD_D2_V2") -> str:
    """The compose file of an emulated `nodes`-node cluster, as the docker backend would create it."""
    home = Home(PLACEHOLDER_HOME)
    spec = ClusterSpec(name, vm_size, max_nodes=nodes)
    size = spec.size
    # The size's own CPUs and memory (the emulator scales them to the machine it runs on).
    requests = [replace(node_request(home, spec, i, host_gpus=()), cpus=float(size.vcpus),
                        memory_bytes=int(size.memory_gib * GIB)) for i in range(nodes)]
    plans = [portable(DockerBackend(home).plan_node(r), home) for r in requests]
    header = ("# Generated by `python -m amlemu.compose` from the docker backend's dry run; a test keeps\n"
              "# it equal. Works with no variable set; each has a default (`${NAME:-default}`):\n"
              "#   AMLEMU_HOME     the home whose node folders the nodes mount   (~/.amlemu/compose)\n"
              "#   AMLEMU_HOME_ID  in container, network and label names         (compose)\n"
              "#   AMLEMU_VENV     the venv, mounted at the same path in nodes   (../.venv, seen at /opt/amlemu/venv)\n"
              "#   AMLEMU_PYTHON   the venv's base Python when outside /usr      (/usr/local)\n"
              "# The image is imported, not pulled: `python -m amlemu.compose --import-image` first.\n")
    text = yaml.safe_dump(compose_from_plans(plans), sort_keys=False, width=200)
    return header + text.replace(home.id, HOME_ID_VAR)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m amlemu.compose", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--import-image", action="store_true",
                        help="import the nodes' offline image into the engine if it lacks it (before `up`)")
    args = parser.parse_args(argv)
    if args.import_image:
        DockerBackend(Home(PLACEHOLDER_HOME)).ensure_mirror_image()
        return 0
    sys.stdout.write(cluster_compose(args.nodes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
