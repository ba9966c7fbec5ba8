"""The test rig: a second Docker engine on this machine, as a second "machine" the first reaches
over a real network link.

It runs in a network namespace of its own, bound at a file under /run/amlemu/rig/<home id>/ (as
the process backend's are, backends/netns.py; not with `ip netns add`, whose /run/netns mount
would outlive the rig), joined to this machine by a veth pair on a private /30 no address or route here uses, with its default route via
this machine's end. Its dockerd is entered with `nsenter --net=` (not `ip netns exec`, which
remounts /sys in a new mount namespace and hides the cgroup mounts: "Devices cgroup isn't
mounted"), with its own socket, data root, exec root, pidfile and config, no default bridge, and
the engine labels amlemu=1, amlemu.home=<home id>. It sees this machine's files, so the docker
backend's mirror image (this machine's software mounted read-only) works on it as on the first. It
also serves tcp://<its address>:2376 with TLS (a CA of its own, clients verified): reached there, it
is added as a machine on another host would be, its nodes' folders shipped (backends/shipping.py).

Everything it makes is named after the home's id and recorded in <home>/rig/rig.json; `down`
removes it all (the engine's containers, the engine by its pid and its helpers by theirs, mounts
left under its folders, the veth, the namespace, the folders) and works without that record too.
Needs root. `python -m amlemu.machines.rig up|down|status|check --home DIR` prints JSON.
"""
from __future__ import annotations

import argparse
import fcntl
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization

from amlemu import servicekeys, statefile
from amlemu.backends.base import LABEL
from amlemu.errors import AmlEmuError, BackendError
from amlemu.backends import netns
from amlemu.home import Home
from amlemu.machines import rigproc

RUNTIME_ROOT = Path("/run/amlemu/rig")  # <home id>/: the socket, exec root and pidfile (short paths)
POOL = ipaddress.ip_network("100.72.0.0/16")  # shared address space (RFC 6598): no Docker pool, rarely a LAN
TOOLS = ("ip", "nsenter", "dockerd", "umount", "unshare")
READY_S = 30.0
TLS_PORT, TLS_DAYS = 2376, 30  # its engine's TCP socket (Docker's TLS port), and how long the rig's certificates last


@dataclass(frozen=True)
class Layout:
    """The names and paths of one home's rig (pure)."""

    rig_id: str  # the home's id
    rig_dir: Path  # <home>/rig: its record, log, config and data root

    @property
    def runtime(self) -> Path:
        return RUNTIME_ROOT / self.rig_id

    @property
    def socket(self) -> Path:
        return self.runtime / "docker.sock"

    @property
    def address(self) -> str:
        return f"unix://{self.socket}"

    @property
    def exec_root(self) -> Path:
        return self.runtime / "exec"

    @property
    def pidfile(self) -> Path:
        return self.runtime / "dockerd.pid"

    @property
    def data_root(self) -> Path:
        return self.rig_dir / "data"

    @property
    def state_file(self) -> Path:
        return self.rig_dir / "rig.json"

    @property
    def log(self) -> Path:
        return self.rig_dir / "dockerd.log"

    @property
    def config(self) -> Path:
        return self.rig_dir / "daemon.json"  # empty: this machine's /etc/docker/daemon.json is the first engine's

    @property
    def tls_dir(self) -> Path:
        return self.rig_dir / "tls"  # its engine's TCP socket's CA, certificates and keys (tls_files)

    @property
    def netns(self) -> Path:
        return self.runtime / "netns"  # the namespace's binding

    @property
    def veth_host(self) -> str:
        return f"am2h{self.rig_id}"  # an interface name: 15 characters at most

    @property
    def veth_node(self) -> str:
        return f"am2n{self.rig_id}"


def layout(home: str | Path | None) -> Layout:
    found = Home.at(home)
    return Layout(rig_id=found.id, rig_dir=found.root / "rig")


def used_networks(addresses: Iterable[dict[str, Any]], routes: Iterable[dict[str, Any]]) -> list[Any]:
    """The IPv4 networks this machine has, from `ip -j addr` and `ip -j route` (pure)."""
    found = [ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False)
             for link in addresses for a in link.get("addr_info", []) if a.get("family") == "inet"]
    for route in routes:
        dst = route.get("dst", "")
        if dst and dst != "default" and ":" not in dst:
            found.append(ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False))
    return found


def pick_subnet(used: Iterable[Any]) -> ipaddress.IPv4Network:
    """The first /30 of POOL that overlaps nothing in `used` (pure)."""
    taken = list(used)
    for subnet in POOL.subnets(new_prefix=30):
        if not any(subnet.overlaps(net) for net in taken):
            return subnet
    raise BackendError(f"rig: every /30 of {POOL} is in use on this machine; remove unused rigs (`down`)")


def ends(subnet: ipaddress.IPv4Network) -> tuple[str, str]:
    """This machine's address and the rig's, on the link (pure)."""
    first, second = list(subnet.hosts())[:2]
    return str(first), str(second)


def link_argvs(lay: Layout, subnet: ipaddress.IPv4Network) -> list[list[str]]:
    """The veth pair, the addresses and the rig's default route, once its namespace is bound (pure)."""
    host, node = ends(subnet)
    ns = ["nsenter", f"--net={lay.netns}", "--", "ip"]
    return [["ip", "link", "add", lay.veth_host, "type", "veth", "peer", "name", lay.veth_node, "netns", str(lay.netns)],
            ["ip", "link", "set", "dev", lay.veth_host, "alias", f"{LABEL}.home={lay.rig_id}"],
            ["ip", "addr", "add", f"{host}/{subnet.prefixlen}", "dev", lay.veth_host],
            ["ip", "link", "set", "dev", lay.veth_host, "up"],
            [*ns, "addr", "add", f"{node}/{subnet.prefixlen}", "dev", lay.veth_node],
            [*ns, "link", "set", "dev", lay.veth_node, "up"],
            [*ns, "route", "add", "default", "via", host]]


def unlink_argv(lay: Layout) -> list[str]:
    """The veth pair removed (both ends go with one; pure)."""
    return ["ip", "link", "del", "dev", lay.veth_host]


def dockerd_argv(lay: Layout, tcp_addr: str | None = None) -> list[str]:
    """The second engine, entered into the rig's network namespace only (pure). With `tcp_addr`
    (the rig's end of the link) it also serves tcp://<addr>:2376 with TLS, clients verified: reached
    there, it is an engine on another host as `machine add` takes one (tests/test_multimachine.py)."""
    tls = [] if tcp_addr is None else [
        "--host", f"tcp://{tcp_addr}:{TLS_PORT}", "--tlsverify", "--tlscacert", str(lay.tls_dir / "ca.pem"),
        "--tlscert", str(lay.tls_dir / "server.pem"), "--tlskey", str(lay.tls_dir / "server-key.pem")]
    return ["nsenter", f"--net={lay.netns}", "--", "dockerd",
            "--config-file", str(lay.config), "--host", lay.address, *tls, "--data-root", str(lay.data_root),
            "--exec-root", str(lay.exec_root), "--pidfile", str(lay.pidfile), "--bridge", "none",
            "--label", f"{LABEL}=1", "--label", f"{LABEL}.home={lay.rig_id}"]


def tls_files(lay: Layout, tcp_addr: str) -> dict[str, str]:
    """A CA of the rig's own, the engine's certificate for `tcp_addr` and a client's, written under
    the rig (keys owner-only); the client's files, as `machine add --tls-ca/--tls-cert/--tls-key`
    takes them (Docker's "Protect the Docker daemon socket", with a CA made here)."""
    ca, ca_key = servicekeys.make_ca(f"amlemu rig {lay.rig_id}", TLS_DAYS)
    server, server_key = servicekeys.issue_server_cert(ca, ca_key, [tcp_addr], TLS_DAYS)
    client, client_key = servicekeys.issue_client_cert(ca, ca_key, f"amlemu {lay.rig_id}", TLS_DAYS)
    folder = lay.tls_dir
    statefile.write_bytes(folder / "ca.pem", ca.public_bytes(serialization.Encoding.PEM))
    statefile.write_bytes(folder / "server.pem", server)
    statefile.write_text(folder / "server-key.pem", server_key, owner_only=True)
    statefile.write_bytes(folder / "client.pem", client)
    statefile.write_text(folder / "client-key.pem", client_key, owner_only=True)
    return {"ca": str(folder / "ca.pem"), "cert": str(folder / "client.pem"), "key": str(folder / "client-key.pem")}


def missing() -> str | None:
    """Why this process cannot make a rig here, or None."""
    if os.geteuid() != 0:
        return "rig: needs root (a network namespace, a veth pair and a second dockerd); run it as root"
    absent = [tool for tool in TOOLS if not shutil.which(tool)]
    if absent:
        return f"rig: missing {', '.join(absent)}; install iproute2, util-linux and docker.io (scripts/setup.sh does)"
    done = subprocess.run(["unshare", "--net", "--", "true"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return f"rig: this machine does not allow network namespaces ({done.stderr.strip() or done.returncode})"
    return None


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BackendError(f"rig: {what} failed: {' '.join(argv)}: {(done.stderr or done.stdout).strip()}")


def _ip_json(*args: str) -> list[dict[str, Any]]:
    return json.loads(subprocess.run(["ip", "-j", *args], capture_output=True, text=True, check=True).stdout or "[]")


def read_state(lay: Layout) -> dict[str, Any] | None:
    try:
        return json.loads(lay.state_file.read_text())
    except (OSError, ValueError):
        return None


def client(state: dict[str, Any]) -> Any:
    """A client of the rig's engine."""
    import docker  # noqa: PLC0415

    return docker.DockerClient(base_url=state["address"], timeout=30)


def up(home: str | Path | None) -> dict[str, Any]:
    """Make the rig (idempotent: a running one is returned as it is); its record."""
    why = missing()
    if why:
        raise BackendError(why)
    lay = layout(home)
    state = read_state(lay)
    if state and rigproc.answers(lay, state.get("pid")):
        return state
    down(home)  # what a failed or killed rig left
    began = time.monotonic()
    lay.rig_dir.mkdir(parents=True, exist_ok=True)
    lay.runtime.mkdir(parents=True, exist_ok=True)
    lay.config.write_text("{}\n")
    try:
        with open(RUNTIME_ROOT / ".lock", "a") as lock:  # two rigs at once must not pick one subnet
            fcntl.flock(lock, fcntl.LOCK_EX)
            subnet = pick_subnet(used_networks(_ip_json("addr"), _ip_json("route")))
            netns.create(lay.netns)  # with its loopback up
            for argv in link_argvs(lay, subnet):
                _run(argv, "making the rig's link")
        host, node = ends(subnet)
        lay.tls_dir.mkdir(parents=True, exist_ok=True)
        state = {"rig_id": lay.rig_id, "home": str(lay.rig_dir.parent), "address": lay.address,
                 "netns": str(lay.netns), "veth_host": lay.veth_host, "veth_node": lay.veth_node, "subnet": str(subnet),
                 "host_addr": host, "node_addr": node, "data_root": str(lay.data_root),
                 "exec_root": str(lay.exec_root), "log": str(lay.log), "labels": {LABEL: "1", f"{LABEL}.home": lay.rig_id},
                 "tcp_address": f"tcp://{node}:{TLS_PORT}", "tls": tls_files(lay, node)}
        started = time.monotonic()
        engine = rigproc.start(dockerd_argv(lay, node), lay)
        state["pid"] = engine.pid
        lay.state_file.write_text(json.dumps(state, indent=1))  # recorded before waiting: down finds it
        rig = rigproc.wait_ready(lay, engine, READY_S)
        state["engine_start_s"] = round(time.monotonic() - started, 3)
        rigproc.import_mirror(rig)
        state["up_s"] = round(time.monotonic() - began, 3)
    except BaseException:
        down(home)
        raise
    lay.state_file.write_text(json.dumps(state, indent=1))
    return state


def down(home: str | Path | None) -> list[str]:
    """Remove everything the home's rig made (idempotent); a line per thing removed."""
    lay = layout(home)
    state = read_state(lay) or {}
    done = rigproc.stop(lay, state.get("pid"))
    done += rigproc.unmount_under([lay.exec_root, lay.data_root])
    if subprocess.run(unlink_argv(lay), capture_output=True, check=False).returncode == 0:
        done.append(f"removed veth {lay.veth_host}")
    if lay.netns.exists():
        netns.remove(lay.netns)
        done.append(f"removed network namespace {lay.netns}")
    for folder in (lay.runtime, lay.rig_dir):
        if folder.exists():
            shutil.rmtree(folder)
            done.append(f"removed {folder}")
    return done


def stop_engine(home: str | Path | None, kill: bool = False) -> list[str]:
    """The rig's dockerd stopped as a machine's engine stops (SIGTERM: its containers stop; `kill`:
    SIGKILL, as the machine crashing, its containers' processes ended with it), its link, namespace
    and data root kept: a machine whose engine went away (tests)."""
    lay = layout(home)
    return rigproc.halt(lay, (read_state(lay) or {}).get("pid"), kill=kill)


def start_engine(home: str | Path | None) -> dict[str, Any]:
    """The rig's dockerd started again after stop_engine, on its data root as it was (its
    containers, its swarm membership); its record."""
    lay = layout(home)
    state = read_state(lay)
    if not state:
        raise BackendError(f"rig: no rig in {lay.rig_dir} (`up` makes one)")
    if rigproc.answers(lay, state.get("pid")):
        return state
    engine = rigproc.start(dockerd_argv(lay, state["node_addr"] if state.get("tls") else None), lay)
    state["pid"] = engine.pid
    lay.state_file.write_text(json.dumps(state, indent=1))  # before waiting: down finds it
    rigproc.wait_ready(lay, engine, READY_S).close()
    return state


def status(home: str | Path | None) -> dict[str, Any]:
    lay = layout(home)
    state = read_state(lay)
    return {"rig_id": lay.rig_id, "up": bool(state and rigproc.answers(lay, state.get("pid"))),
            "netns": netns.exists(lay.netns), **({"state": state} if state else {})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m amlemu.machines.rig", description=__doc__.splitlines()[0])
    parser.add_argument("verb", choices=("up", "down", "status", "check"))
    parser.add_argument("--home", default=None, help="the home whose rig it is (default: $AMLEMU_HOME)")
    args = parser.parse_args(argv)
    try:
        if args.verb == "check":
            why = missing()
            if why:
                raise BackendError(why)
            from amlemu.machines.swarm import ipsec_missing  # noqa: PLC0415

            result: Any = {"ok": True, "encrypted_overlays": ipsec_missing() or "available"}
        else:
            result = {"up": up, "down": down, "status": status}[args.verb](args.home)
    except AmlEmuError as exc:
        print(f"amlemu: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
