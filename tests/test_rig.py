"""Past one machine (issue 31): the second engine rig, the swarm and a cluster's overlay network.

The argv and spec builders are pure and checked as data; the swarm's reaping plan against fake
engines; then once for real: this machine's engine and the rig's, one swarm, one overlay per
cluster, a node container on each engine that reaches the other by name, and nothing left after."""
from __future__ import annotations

import ipaddress
import textwrap
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import docker
import pytest
from rigfixture import SecondEngine

from amlemu.actions import document, execute
from amlemu.backends import overlaypeers
from amlemu.backends.base import LABEL
from amlemu.backends.software import software_paths
from amlemu.backends.dockerplan import MIRROR_IMAGE
from amlemu.machines import rig, rigproc, swarm


# --- the rig's commands, as data ------------------------------------------------------------------
def test_the_rig_picks_a_link_subnet_nothing_here_uses() -> None:
    addresses = [{"addr_info": [{"family": "inet", "local": "100.72.0.1", "prefixlen": 30},
                                {"family": "inet6", "local": "fd00::2", "prefixlen": 64}]}]
    routes = [{"dst": "100.72.0.4/30"}, {"dst": "default"}, {"dst": "100.72.0.9"}]
    used = rig.used_networks(addresses, routes)
    assert rig.pick_subnet(used) == ipaddress.ip_network("100.72.0.12/30")
    assert rig.ends(ipaddress.ip_network("100.72.0.12/30")) == ("100.72.0.13", "100.72.0.14")
    with pytest.raises(rig.BackendError, match="every /30 of 100.72.0.0/16 is in use"):
        rig.pick_subnet([ipaddress.ip_network("100.72.0.0/16")])


def test_the_rig_link_and_engine_commands() -> None:
    lay = rig.Layout(rig_id="0123abcd", rig_dir=Path("/h/rig"))
    assert max(len(lay.veth_host), len(lay.veth_node)) <= 15  # the kernel's limit on interface names
    argvs = rig.link_argvs(lay, ipaddress.ip_network("100.72.0.4/30"))
    assert argvs[0][-2:] == ["netns", "/run/amlemu/rig/0123abcd/netns"]  # the rig's end, moved into its namespace
    assert ["ip", "addr", "add", "100.72.0.5/30", "dev", "am2h0123abcd"] in argvs
    assert argvs[-1] == ["nsenter", "--net=/run/amlemu/rig/0123abcd/netns", "--", "ip", "route", "add", "default",
                         "via", "100.72.0.5"]
    assert rig.unlink_argv(lay) == ["ip", "link", "del", "dev", "am2h0123abcd"]
    argv = rig.dockerd_argv(lay)
    # nsenter --net, not `ip netns exec` (which remounts /sys and hides the cgroups from dockerd)
    assert argv[:4] == ["nsenter", "--net=/run/amlemu/rig/0123abcd/netns", "--", "dockerd"]
    options = dict(zip(argv[4::2], argv[5::2]))
    assert options["--host"] == "unix:///run/amlemu/rig/0123abcd/docker.sock"
    assert (options["--data-root"], options["--exec-root"]) == ("/h/rig/data", "/run/amlemu/rig/0123abcd/exec")
    assert (options["--bridge"], options["--config-file"]) == ("none", "/h/rig/daemon.json")
    assert f"{LABEL}.home=0123abcd" in argv
    tls = rig.dockerd_argv(lay, "100.72.0.6")  # also over tcp://, clients verified by the rig's own CA
    hosts = [tls[i + 1] for i, a in enumerate(tls) if a == "--host"]
    assert hosts == ["unix:///run/amlemu/rig/0123abcd/docker.sock", "tcp://100.72.0.6:2376"] and "--tlsverify" in tls
    assert tls[tls.index("--tlscacert") + 1] == "/h/rig/tls/ca.pem" and tls[tls.index("--tlskey") + 1] == "/h/rig/tls/server-key.pem"


def test_mounts_left_under_the_rig_are_unmounted_deepest_first() -> None:
    info = textwrap.dedent("""\
        22 1 8:1 / / rw - ext4 /dev/vda rw
        90 22 0:50 / /h/rig/data/overlay2/abc/merged rw - overlay overlay rw
        91 22 0:4 net:[1] /run/amlemu/rig/0123abcd/exec/netns/x\\040y rw - nsfs nsfs rw
        92 22 0:51 / /h/rig-other rw - tmpfs tmpfs rw
        93 22 0:52 / /h/rig/data rw - tmpfs tmpfs rw
        """)
    found = rigproc.mounts_under([Path("/h/rig/data"), Path("/run/amlemu/rig/0123abcd")], info)
    assert found == ["/run/amlemu/rig/0123abcd/exec/netns/x y", "/h/rig/data/overlay2/abc/merged", "/h/rig/data"]
    assert rigproc.umount_argv("/p", lazy=True) == ["umount", "--lazy", "/p"]


def test_the_rig_engine_is_known_by_its_argv_even_while_it_execs(tmp_path: Path) -> None:
    """nsenter execs dockerd: for a moment inside execve the pid's argv reads empty, which once
    made a starting rig look exited (CI). Each process here is looked up at once after it starts."""
    import subprocess
    import sys

    lay = rig.Layout("race0000", tmp_path)
    script = "import time; time.sleep(5)"
    for _ in range(60):
        child = subprocess.Popen(["env", sys.executable, "-c", script, lay.address])
        try:
            assert rigproc.ours(lay, child.pid) is not None
        finally:
            child.kill()
            child.wait()


def test_a_rig_engine_that_exits_at_once_is_reported_with_its_status_and_log(tmp_path: Path) -> None:
    lay = rig.Layout("exit0000", tmp_path)
    engine = rigproc.start(["sh", "-c", "echo 'failed to start daemon: no space'; exit 3"], lay)
    with pytest.raises(rigproc.BackendError, match=r"exited with status 3 .*failed to start daemon: no space"):
        rigproc.wait_ready(lay, engine, 10.0)


def test_the_rig_needs_root_and_says_so_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rig.os, "geteuid", lambda: 1000)
    why = rig.missing()
    assert why is not None and "needs root" in why and "\n" not in why
    assert rig.main(["up", "--home", "/nonexistent-home"]) == 1


def test_an_engine_that_does_not_start_fails_in_one_line_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rig, "dockerd_argv", lambda lay, tcp_addr=None: ["nsenter", f"--net={lay.netns}", "--", "false",
                                                                         lay.address])
    with pytest.raises(rig.BackendError, match="the second dockerd exited") as failed:
        rig.up(tmp_path)
    assert "\n" not in str(failed.value)
    lay = rig.layout(tmp_path)
    assert not lay.rig_dir.exists() and not lay.runtime.exists()
    assert not Path("/sys/class/net", lay.veth_host).exists()
    assert rig.down(tmp_path) == []  # down again: nothing to do


def test_up_again_is_the_same_engine(second_engine: SecondEngine) -> None:
    assert rig.up(second_engine.home)["pid"] == second_engine.state["pid"]
    assert rig.status(second_engine.home)["up"]


# --- the swarm's specs and its reaping plan --------------------------------------------------------
def test_swarm_specs_listen_on_the_link_only_and_label_what_amlemu_makes() -> None:
    assert swarm.init_spec("100.72.0.1", "h1") == {
        "advertise_addr": "100.72.0.1", "listen_addr": "100.72.0.1:2377", "labels": {LABEL: "1", f"{LABEL}.home": "h1"},
        "dispatcher_heartbeat_period": swarm.HEARTBEAT_S * 10**9}  # a machine cut off is seen down in seconds
    assert swarm.join_spec("TOKEN", "100.72.0.1:2377", "100.72.0.2") == {
        "remote_addrs": ["100.72.0.1:2377"], "join_token": "TOKEN", "advertise_addr": "100.72.0.2",
        "listen_addr": "100.72.0.2:2377"}
    plain = swarm.overlay_spec("n", {LABEL: "1"}, encrypted=False, note="the kernel lacks IPsec")
    assert plain["driver"] == "overlay" and plain["attachable"] and plain["options"] == {}
    assert plain["labels"][f"{LABEL}.encryption_note"] == "the kernel lacks IPsec"
    assert swarm.overlay_spec("n", {}, encrypted=True, note=None)["options"] == {"encrypted": "true"}
    assert swarm.ipsec_probe_argv()[1:3] == ["--net", "--"]  # a throwaway namespace: nothing changes here


class _Engine:
    """A fake engine: its swarm role, swarm labels, nodes, overlays and services, and what was done to it."""

    def __init__(self, node: str, manager: bool, swarm_labels: dict[str, str] | None = None,
                 nodes: list[tuple[str, str, dict[str, str]]] = (), overlays: list[tuple[str, dict]] = ()) -> None:
        self.done: list[str] = []
        self._info = {"Swarm": {"NodeID": node, "LocalNodeState": "active", "ControlAvailable": manager}}
        self.swarm = SimpleNamespace(reload=lambda: None, attrs={"Spec": {"Labels": swarm_labels or {}}},
                                     leave=lambda force: self.done.append("leave"))
        self.nodes = SimpleNamespace(list=lambda: [SimpleNamespace(
            id=i, attrs={"Spec": {"Labels": lab}, "Status": {"State": st}, "Description": {"Hostname": i}},
            remove=lambda force, i=i: self.done.append(f"node rm {i}")) for i, st, lab in nodes])
        self.services = SimpleNamespace(list=lambda: [])
        self._overlays = [SimpleNamespace(id=name, name=name, attrs={"Labels": lab}) for name, lab in overlays]
        self.networks = SimpleNamespace(list=self._list, get=lambda n: SimpleNamespace(
            remove=lambda: self.done.append(f"rm {n}"), disconnect=lambda endpoint, force: None))

    def info(self) -> dict[str, Any]:
        return self._info

    def _list(self, filters: dict[str, str]) -> list[Any]:
        key, _, value = filters.get("label", "=").partition("=")
        return [n for n in self._overlays if not key or n.attrs["Labels"].get(key) == value]


OURS = {LABEL: "1", f"{LABEL}.home": "h1"}


def test_reaping_an_amlemu_swarm_nothing_else_uses_takes_every_engine_out() -> None:
    manager = _Engine("M", True, OURS, nodes=[("M", "ready", {}), ("W", "ready", OURS)],
                      overlays=[(INGRESS := swarm.INGRESS, {}), ("amlemu-h1-c1", OURS)])
    worker = _Engine("W", False)
    plan = swarm.plan_reap({"local": manager, "m2": worker}, "h1")
    assert [a.line() for a in plan] == [
        "remove overlay network amlemu-h1-c1 (machine local)", "leave swarm m2 (as worker)",
        "leave swarm local (as manager: the swarm amlemu made ends)",
        f"remove network {swarm.GWBRIDGE} (machine m2)", f"remove network {swarm.GWBRIDGE} (machine local)"]
    assert document(plan)["dry_run"] and INGRESS not in str(document(plan))
    execute(plan)
    assert manager.done == ["rm amlemu-h1-c1", "leave", f"rm {swarm.GWBRIDGE}"]
    assert worker.done == ["leave", f"rm {swarm.GWBRIDGE}"]


def test_reaping_keeps_a_swarm_in_use_or_not_amlemus() -> None:
    busy = _Engine("M", True, OURS, nodes=[("M", "ready", {}), ("X", "ready", {})],
                   overlays=[("amlemu-h1-c1", OURS), ("amlemu-h2-c1", {LABEL: "1", f"{LABEL}.home": "h2"})])
    plan = swarm.plan_reap({"local": busy}, "h1")
    assert plan[0].line() == "remove overlay network amlemu-h1-c1 (machine local)"
    assert plan[1].verb == "keep" and "network amlemu-h2-c1" in plan[1].detail["why"] and "node X" in plan[1].detail["why"]
    theirs = _Engine("M", True, {"team": "infra"}, nodes=[("M", "ready", {}), ("W", "down", OURS), ("Y", "down", {})])
    plan = swarm.plan_reap({"local": theirs}, None)
    assert [a.line() for a in plan] == ["remove swarm node W (machine local, why amlemu joined it; it is down)"]


# --- for real: two engines, one swarm, a cluster's overlay ------------------------------------------
PROBE = """
import socket, sys, time, urllib.request
deadline = time.monotonic() + 60  # a deadline, not a wait: the other node's server may still be starting (the
# name resolves by now: the test waited for it as a job's start does)
while True:
    try:
        print(socket.gethostbyname(sys.argv[1]), urllib.request.urlopen(f"http://{sys.argv[1]}:8000/", timeout=5).status)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.1)
"""


def _node(client: Any, home_id: str, network: str, name: str, command: list[str]) -> Any:
    """A node container as the docker backend makes one: the mirror image, on the cluster's network
    under its node name."""
    api = client.api
    created = api.create_container(
        MIRROR_IMAGE, command=command, name=f"amlemu-{home_id}-c1-{name}", hostname=name,
        labels={**swarm.labels(home_id), f"{LABEL}.cluster": "c1", f"{LABEL}.node": name},
        host_config=api.create_host_config(binds={p: {"bind": p, "mode": "ro"} for p in software_paths()},
                                           read_only=True, tmpfs={"/tmp": "mode=1777"}),
        networking_config=api.create_networking_config({network: api.create_endpoint_config(aliases=[name])}))
    api.start(created["Id"])
    return client.containers.get(created["Id"])


def _labelled(client: Any, home_id: str) -> list[str]:
    label = {"label": f"{LABEL}.home={home_id}"}
    return [c.name for c in client.containers.list(all=True, filters=label)] + \
        [n.name for n in client.networks.list(filters=label)]


@pytest.mark.xdist_group("second-engine")  # one swarm on this machine's engine: its tests in turn (test_multimachine)
def test_nodes_on_two_engines_reach_each_other_on_their_clusters_overlay(second_engine: SecondEngine) -> None:
    local, remote, state = docker.from_env(), second_engine.client, second_engine.state
    rigproc.import_mirror(local)  # the node image, where no earlier test of this session made it
    home_id = f"t{uuid.uuid4().hex[:7]}"
    made = swarm.ensure_swarm(local, state["host_addr"], home_id)
    try:
        node_id = swarm.join(remote, made.worker_token, made.manager_addr, state["node_addr"])
        swarm.label_node(local, node_id, home_id)
        overlay = swarm.create_overlay(local, f"amlemu-{home_id}-c1", {**swarm.labels(home_id), f"{LABEL}.cluster": "c1"},
                                       encrypted=True)
        assert overlay.encrypted or overlay.note == swarm.ipsec_missing()  # plain only with the kernel's reason
        server = _node(local, home_id, overlay.name, "node-0", ["/usr/bin/python3", "-m", "http.server", "8000"])
        client = _node(remote, home_id, overlay.name, "node-1", ["/usr/bin/tini", "--", "/bin/sleep", "infinity"])
        for container in (server, client):
            container.reload()
        addresses = {c.attrs["Config"]["Hostname"]: c.attrs["NetworkSettings"]["Networks"][overlay.name]["IPAddress"]
                     for c in (server, client)}
        # As a job's start waits (the docker backend's until_peers_known): the other engine's node is
        # known through the swarm's gossip, which on a loaded 2-core machine came after a minute.
        assert overlaypeers.until_resolvable({"node-0": server, "node-1": client}, addresses) == []
        code, out = client.exec_run(["/usr/bin/python3", "-c", PROBE, "node-0"])
        assert code == 0 and out.decode().split() == [addresses["node-0"], "200"], out.decode()[-2000:]
        code, out = server.exec_run(["getent", "hosts", "node-1"])  # and back, by name across the link
        assert code == 0 and out.decode().split()[0] == addresses["node-1"]
        for container in (server, client):
            container.remove(force=True)
    finally:
        for engine in (local, remote):
            for container in engine.containers.list(all=True, filters={"label": f"{LABEL}.home={home_id}"}):
                container.remove(force=True)
        plan = swarm.plan_reap({"local": local, "m2": remote}, home_id)
        execute(plan)
    if made.created_now:  # our swarm, and nothing else used it: gone from both engines
        assert [a.verb for a in plan].count("leave") == 2
        assert (local.info()["Swarm"]["LocalNodeState"], remote.info()["Swarm"]["LocalNodeState"]) == ("inactive",) * 2
        assert [n.name for n in local.networks.list(names=[swarm.GWBRIDGE])] == []
    assert _labelled(local, home_id) == [] and _labelled(remote, home_id) == []
