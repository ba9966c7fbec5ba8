"""Past one machine (issue 31): a docker cluster whose nodes span this machine's engine and a second
one (the rig: tests/rigfixture.py), on one overlay network.

Placement into node requests, the agent's argv addressed to a node's engine and the firewall's
rules for another machine are checked as data; then once for real: two machines, two nodes on
each, an MPI allreduce across them (and a torch+Horovod allreduce between a node of each), the
second machine cut off (its link down) and then its engine stopped under running jobs, and nothing
left on either engine after a cleanup without the home's state database."""
from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import docker
import pytest
from conftest import FULL, REPO, STARTUP, JobFactory, assert_nothing_left, wait_until
from rigfixture import SecondEngine

from amlemu.actions import execute
from amlemu.api import Emulator
from amlemu.backends import dockerengines, hostguard, overlaypeers
from amlemu.backends.base import LABEL, NodeRequest
from amlemu.backends.docker import DockerBackend
from amlemu.backends.dockerplan import container_plan
from amlemu.cluster import autoscale, placing
from amlemu.errors import BackendError, CapacityError, ConfigError
from amlemu.home import Home
from amlemu.machines import registry, rig, swarm
from amlemu.machines.address import TlsFiles
from amlemu.machines.registry import Machine
from amlemu.specs import ClusterSpec
from amlemu.specs import RunStatus

GIB = 1 << 30


def _machine(name: str, cores: float, gpus: tuple[str, ...] = (), address: str = "") -> Machine:
    return Machine(name, address or f"unix:///run/{name}.sock", cores, 32 * GIB, gpus, time.time(),
                   service_address="100.72.0.1", advertise_address="100.72.0.2")


# --- placement into node requests ------------------------------------------------------------------
def test_a_clusters_nodes_are_placed_index_by_index_and_share_small_machines() -> None:
    two = (_machine("local", 2), _machine("m2", 2))
    spread = placing.plan(ClusterSpec("c1", "STANDARD_D2_V2", max_nodes=4, machines=("local", "m2")), two)
    assert spread.by_index == ("local", "m2", "local", "m2") and spread.spans
    assert spread.scale == pytest.approx(2.0)  # 4 nodes of 2 cores on 4 cores: each shares its machine by 2
    assert [spread.ordinal(i) for i in range(4)] == [0, 0, 1, 1]
    pack = placing.plan(ClusterSpec("c1", "STANDARD_D2_V2", max_nodes=4, machines=("local", "m2"), placement="pack"),
                        two)
    assert pack.by_index == ("local", "local", "m2", "m2")
    one = placing.plan(ClusterSpec("c1", "STANDARD_D2_V2", max_nodes=2, machines=("local", "m2"), placement="pack"),
                       (_machine("local", 8), _machine("m2", 8)))
    assert one.by_index == ("local", "local") and not one.spans and one.scale == 1.0  # one machine: its bridge
    # GPUs are never shared: too few is refused in one line naming the shortfall
    gpus = (_machine("local", 8), _machine("m2", 8, gpus=("GPU-1",)))
    with pytest.raises(CapacityError, match="2 nodes of Standard_NC6 need 2 GPUs"):
        placing.plan(ClusterSpec("g1", "STANDARD_NC6", max_nodes=2, machines=("local", "m2")), gpus)


def test_node_requests_name_their_machine_engine_and_overlay(tmp_path: Path) -> None:
    emu = Emulator(home=tmp_path / "home", backend="docker")
    try:
        execute(registry.plan_add(emu.store, _machine("m2", 2, gpus=("GPU-a", "GPU-b"), address="unix:///run/m2.sock")))
        spec = ClusterSpec("c1", "STANDARD_D2_V2", max_nodes=2, machines=("m2", "local"))
        first, second = (autoscale.node_request(emu.home, spec, i, host_gpus=("0",)) for i in range(2))
        overlay = placing.overlay_name(emu.home.id, "c1")
        assert (first.machine, first.engine, first.overlay) == ("m2", "unix:///run/m2.sock", overlay)
        assert (first.service_address, first.advertise, first.cpus) == ("100.72.0.1", "100.72.0.2", 2.0)
        assert first.labels[f"{LABEL}.machine"] == "m2"
        assert (second.machine, second.engine, second.overlay, second.service_address) == ("local", "", overlay, None)
        assert second.advertise == "100.72.0.1"  # this machine, as m2 reaches it: where the swarm is advertised
        assert f"{LABEL}.machine" not in second.labels  # a node of this machine is labelled as before
        gpus = ClusterSpec("g1", "STANDARD_NC6", max_nodes=2, machines=("m2",))  # each node its own GPU there
        there = [autoscale.node_request(emu.home, gpus, i, host_gpus=("0",)) for i in range(2)]
        assert [r.gpus for r in there] == [("GPU-a",), ("GPU-b",)]
        assert there[0].overlay == placing.overlay_name(emu.home.id, "g1")  # on another machine only: its overlay too
        plain = autoscale.node_request(emu.home, ClusterSpec("c2", max_nodes=2), 1, host_gpus=())
        assert (plain.machine, plain.engine, plain.overlay) == ("local", "", None)
        # a machine added without its network addresses cannot take part in a spanning cluster
        execute(registry.plan_add(emu.store, Machine("m3", "unix:///run/m3.sock", 2, 32 * GIB)))
        with pytest.raises(ConfigError, match="machine m3 has no service or advertise address"):
            autoscale.node_request(emu.home, ClusterSpec("c3", max_nodes=2, machines=("local", "m3")), 1, host_gpus=())
    finally:
        emu.store.close()


def test_a_node_on_another_host_gets_volumes_of_its_engine_not_this_machines_folders(tmp_path: Path) -> None:
    """An engine over ssh:// or tcp://, or one added with --files shipped, is another host: Docker there
    would make this machine's folders empty ones. Its nodes' disk, cache and environment are volumes
    on its engine, named and labelled as the node; nothing of this machine's node folders is bound.
    A unix:// engine is taken to be this machine's, as before, unless added as shipped."""
    emu = Emulator(home=tmp_path / "home", backend="docker")
    try:
        for name, address, files in (("gpu2", "ssh://me@gpu2.lan", ""), ("ci3", "tcp://ci3.lan:2376", ""),
                                     ("m2", "unix:///run/m2.sock", ""), ("m3", "unix:///run/m3.sock", "shipped"),
                                     ("m4", "ssh://me@m4.lan", "shared")):
            execute(registry.plan_add(emu.store, replace(_machine(name, 2, address=address), files=files)))
        shipped = {}
        for name in ("gpu2", "ci3", "m2", "m3", "m4"):
            spec = ClusterSpec(f"c{name}", "STANDARD_D2_V2", max_nodes=2, machines=("local", name))
            local, there = (autoscale.node_request(emu.home, spec, i, host_gpus=()) for i in range(2))
            assert not local.ships_files and there.machine == name
            shipped[name] = there.ships_files
        assert shipped == {"gpu2": True, "ci3": True, "m2": False, "m3": True, "m4": False}
        spec = ClusterSpec("c1", "STANDARD_D2_V2", max_nodes=2, machines=("local", "gpu2"))
        there = replace(autoscale.node_request(emu.home, spec, 1, host_gpus=()), python_env="/opt/envs/e1")
        plan = container_plan(there, False, False, "amlemu-h-c1-node-1", "overlay", "note")
        here = {str(there.node_dir), str(there.cache_dir / "data"), "/opt/envs/e1"}
        assert here.isdisjoint(plan.volumes), plan.volumes
        assert {k: v for k, v in plan.volumes.items() if not k.startswith("/")} == {
            "amlemu-h-c1-node-1-disk": {"bind": "/mnt/azureml", "mode": "rw"},
            "amlemu-h-c1-node-1-cache": {"bind": "/mnt/amlemu/cache", "mode": "ro"},
            "amlemu-h-c1-node-1-env": {"bind": "/opt/envs/e1", "mode": "ro"}}
        image = container_plan(there, True, False, "amlemu-h-c1-node-1", "overlay", "note")  # the job's image: its own Python
        assert "amlemu-h-c1-node-1-env" not in image.volumes and "amlemu-h-c1-node-1-disk" in image.volumes
        listed = [m for m in registry.stored(emu.store) if m.name in ("gpu2", "m3")]
        assert [m.ships_files for m in listed] == [True, True]
    finally:
        emu.store.close()


def test_nodes_know_this_machines_name_where_mpirun_runs() -> None:
    """mpirun runs on this machine; its daemons on the nodes look its host up by name, which a node's
    DNS may not know (the rig's: each failed lookup waited out the resolver, 5-6 s of a launch)."""
    hosts = dockerengines.extra_hosts("amlemu-service.blob.internal", "100.72.0.1")
    assert hosts == {"amlemu-service.blob.internal": "100.72.0.1", socket.gethostname(): "100.72.0.1"}
    assert dockerengines.extra_hosts("amlemu-service.blob.internal", None) == {"amlemu-service.blob.internal": None}


def test_the_agent_reaches_a_node_through_its_own_machines_engine() -> None:
    config = {"tools": {"docker": "/usr/bin/docker"}, "env_file": "/mnt/env", "hosts": {
        "c1-node-0": {"container": "amlemu-h-c1-node-0"},
        "c1-node-1": {"container": "amlemu-h-c1-node-1", "engine": "tcp://m2:2376", "tls": ["ca", "cert", "key"]},
        "c1-node-2": {"container": "amlemu-h-c1-node-2", "engine": "unix:///run/m3.sock", "tls": None}}}
    here, there, ssh = (DockerBackend.agent_argv(config, f"c1-node-{i}", "hostname") for i in range(3))
    assert here[:4] == ["/usr/bin/docker", "exec", "-i", "amlemu-h-c1-node-0"]
    assert there[:12] == ["/usr/bin/docker", "-H", "tcp://m2:2376", "--tlsverify", "--tlscacert", "ca", "--tlscert",
                          "cert", "--tlskey", "key", "exec", "-i"]
    assert ssh[:5] == ["/usr/bin/docker", "-H", "unix:///run/m3.sock", "exec", "-i"]
    assert here[-1] == there[-1] == "hostname"
    assert dockerengines.stop_argv()[:2] == ["/bin/sh", "-c"]


def test_a_lost_machines_engine_is_reported_not_raised(tmp_path: Path) -> None:
    """A machine whose engine stopped answering: its nodes are not listed (a run counts them lost),
    removing one does not fail, and the reaper says what it had to keep."""
    home = Home.at(tmp_path / "home")
    backend = DockerBackend(home)
    gone = f"unix://{tmp_path}/gone/docker.sock"
    backend.engines.client("")  # this machine's engine answers
    backend.engines._remember(gone, None)  # noqa: SLF001 - as a node placed there before it was lost
    assert backend.engines.recorded() == {gone: None}
    assert backend.list_nodes() == []
    plan = backend.plan_reap()
    assert plan[0].line() == f"keep engine {gone} (why it does not answer; run cleanup again once it does)"
    request = replace(NodeRequest(home.id, "c1", 1, 2.0, GIB, 1.0, tmp_path / "n", tmp_path / "c"), machine="m2",
                      engine=gone)
    backend.remove_node(request)
    assert backend.stop_processes(request) == 0


def test_a_swarm_advertised_on_an_address_gone_from_this_machine_is_refused() -> None:
    """Joined workers would get no overlay packet to this machine (a test rig's link removed after
    its swarm was made): said in one line, before any node is made."""
    from amlemu.cluster import spanning  # noqa: PLC0415
    from amlemu.errors import BackendError  # noqa: PLC0415

    spanning._check_advertised(swarm.SwarmState("n", True, False, "127.0.0.1:2377", "t"))  # noqa: SLF001
    with pytest.raises(BackendError, match="this machine's swarm advertises 192.0.2.99, which is no longer an address"):
        spanning._check_advertised(swarm.SwarmState("n", True, False, "192.0.2.99:2377", "t"))  # noqa: SLF001


class _Node:
    """A fake node container that answers the peers' lookup with each of `answers` in turn (the last
    one for good): (exit code, {name: address}); the names it was asked for are kept."""

    def __init__(self, name: str, *answers: tuple[int, dict[str, str]]) -> None:
        self.name, self.answers, self.asked = name, list(answers), []

    def exec_run(self, argv: list[str]) -> tuple[int, bytes]:
        names = argv[argv.index("lookup") + 1:]
        self.asked.append(names)
        code, known = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return code, "".join(f"{n} {known.get(n, '-')}\n" for n in names).encode()


def test_the_peers_lookup_is_the_nodes_own_resolver_and_its_answer_is_read_as_data() -> None:
    argv = overlaypeers.lookup_argv(["c1-node-0", "c1-node-1"])
    assert argv[:2] == ["/bin/sh", "-c"] and argv[-3:] == ["lookup", "c1-node-0", "c1-node-1"]  # names: arguments
    assert overlaypeers.parse("c1-node-0 10.0.1.2\nc1-node-1 -\nc1-node-2 10.0.1.4\tc1-node-2\n\n") == {
        "c1-node-0": "10.0.1.2", "c1-node-2": "10.0.1.4"}
    assert overlaypeers.wrong({"a": "10.0.1.2", "b": "10.0.1.3", "c": "10.0.1.4"}, {"a": "10.0.1.2", "b": "10.0.1.9"}) \
        == {"b": "10.0.1.9", "c": None}
    found = overlaypeers.parse(subprocess.run(overlaypeers.lookup_argv(["localhost"]), capture_output=True, text=True,
                                              check=True).stdout)  # the script itself, by this machine's getent
    assert found.get("localhost") in {"127.0.0.1", "::1"}, found


def test_a_job_on_an_overlay_starts_once_every_node_resolves_every_other_at_its_address() -> None:
    """Across machines an engine learns another's nodes through the swarm's gossip, late under load:
    each node is asked again (only for what it lacks) until every peer resolves to its own address;
    an earlier container's address is not taken."""
    addresses = {"c1-node-0": "10.0.1.2", "c1-node-1": "10.0.1.3"}
    stale = {"c1-node-0": "10.0.1.9"}
    here = _Node("amlemu-h-c1-node-0", (0, addresses))
    there = _Node("amlemu-h-c1-node-1", (0, {}), (0, stale), (0, addresses))
    assert overlaypeers.until_resolvable({"c1-node-0": here, "c1-node-1": there}, addresses, limit=60) == []
    assert here.asked == [["c1-node-1"]] and there.asked == [["c1-node-0"]] * 3
    bare = _Node("amlemu-h-c1-node-1", (127, {}))  # a job image without getent: not asked again, said so
    assert overlaypeers.until_resolvable({"c1-node-0": here, "c1-node-1": bare}, addresses, limit=60) == ["c1-node-1"]
    assert len(bare.asked) == 1
    base = NodeRequest("h", "c1", 0, 2.0, GIB, 1.0, Path("/n"), Path("/c"))  # on one engine's bridge: no wait
    assert overlaypeers.for_nodes(lambda r: 1 / 0, [base, replace(base, index=1)], list(addresses.values()), print) is False


def test_a_peer_that_never_becomes_resolvable_fails_the_start_naming_it() -> None:
    addresses = {"c1-node-0": "10.0.1.2", "c1-node-1": "10.0.1.3", "c1-node-2": "10.0.1.4"}
    base = NodeRequest("h", "c1", 0, 2.0, GIB, 1.0, Path("/n"), Path("/c"), overlay="amlemu-h-c1-overlay")
    requests = [base, replace(base, index=1, machine="m2", engine="unix:///m2.sock"), replace(base, index=2)]
    nodes = {"c1-node-0": _Node("n0", (0, addresses)), "c1-node-2": _Node("n2", (0, addresses)),
             "c1-node-1": _Node("n1", (0, {"c1-node-2": "10.0.1.4", "c1-node-0": "10.0.1.9"}))}
    with pytest.raises(BackendError) as failed:  # a deadline of 0: asked once
        overlaypeers.for_nodes(lambda r: nodes[r.name], requests, list(addresses.values()), print, limit=0)
    assert str(failed.value) == (
        "c1-node-0 (its address 10.0.1.2; resolved to 10.0.1.9) never became resolvable on node c1-node-1 "
        "(machine m2) within 0 s: the swarm's gossip between the machines (7946/tcp+udp) did not tell its engine; "
        "check those ports (docs/swarm.md) and submit again")


def test_a_machine_the_swarm_marks_down_ends_a_run_naming_its_nodes() -> None:
    """A machine cut off (its link down: its engine may still answer and its ranks still run) is
    seen as the swarm's manager sees it, at most once a second; the run's nodes there are lost and
    the reason says what became of their machine."""
    from amlemu.cluster import spanning  # noqa: PLC0415
    from amlemu.runs import machinewatch  # noqa: PLC0415
    from amlemu.runs.outcome import Outcome, Watch  # noqa: PLC0415
    from amlemu.runs.runlogs import failure_reason  # noqa: PLC0415

    def node(home: str, machine: str | None, state: str) -> dict[str, Any]:
        labels = {f"{LABEL}.home": home, **({f"{LABEL}.machine": machine} if machine else {})}
        return {"Spec": {"Labels": labels}, "Status": {"State": state, "Message": "heartbeat failure"}}

    nodes = [node("h", "m2", "down"), node("h", "m3", "ready"), node("other", "m4", "down"), node("h", None, "down")]
    assert spanning.machines_down(nodes, "h") == {"m2": "heartbeat failure"}
    attrs = [node("h", "m2", "ready")]
    manager = type("Manager", (), {"info": lambda self: {"Swarm": {"ControlAvailable": True}},
                                   "nodes": type("Nodes", (), {"list": lambda self: [
                                       type("N", (), {"attrs": a})() for a in attrs]})()})()
    base = NodeRequest("h", "c1", 0, 2.0, GIB, 1.0, Path("/n"), Path("/c"))
    requests = [base, replace(base, index=1, machine="m2", engine="unix:///m2.sock"),
                replace(base, index=3, machine="m2", engine="unix:///m2.sock")]
    now = [0.0]
    watched = machinewatch.Machines(requests, clock=lambda: now[0], manager=lambda: manager)
    assert not watched.cut_off()
    attrs[0] = node("h", "m2", "down")
    assert not watched.cut_off()  # asked again only a second later
    now[0] = 1.5
    assert watched.cut_off() and sorted(watched.cut) == ["c1-node-1", "c1-node-3"]
    assert Watch(canceled=lambda: False, preempted=lambda: False, partitioned=lambda: False, preempt=lambda n: None,
                 machine_cut=watched.cut_off).stopping(1.0) is Outcome.MACHINE_CUT
    why = watched.why(["c1-node-1", "c1-node-3"])
    reason = failure_reason("", [], Path("/nonexistent"), -9, ["c1-node-1", "c1-node-3"], frozenset(), None, why)
    assert reason == ("node c1-node-1, c1-node-3 was lost (machine m2 was cut off from this one (the swarm: heartbeat "
                      "failure)) while the job ran; the job was stopped on all nodes")
    assert machinewatch.Machines(requests[:1], manager=lambda: 1 / 0).cut_off() is False  # one machine: never asks


def test_another_machines_traffic_is_refused_but_the_swarms_and_a_runs_ports() -> None:
    rules = hostguard.source_rules("100.72.0.2", "amlemu:h:c1")
    assert rules[0][1][:2] == ["-s", "100.72.0.2"] and "ESTABLISHED,RELATED" in rules[0][1]
    assert [(r[r.index("-p") + 1], r[r.index("--dport") + 1]) for _, r in rules[1:-1]] == [
        ("tcp", "2377"), ("tcp", "7946"), ("udp", "7946"), ("udp", "4789")]
    assert rules[-1][1][-4:] == ["-j", "REJECT", "--reject-with", "icmp-port-unreachable"]
    listing = "\n".join(f"-A INPUT {' '.join(rule)}".replace("amlemu:h:c1", '"amlemu:h:c1"') for _, rule in rules)
    assert hostguard.closed_sources(listing.replace("-s 100.72.0.2", "-s 100.72.0.2/32"), "amlemu:h:c1") == ["100.72.0.2"]
    assert hostguard.closed_sources(listing, "amlemu:h:c2") == []


# --- for real: this machine's engine and the rig's, one cluster over both ---------------------------
ALLREDUCE = """
import os, socket, sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.rank + 1)
hosts = comm.allgather(socket.gethostname())
addresses = [socket.gethostbyname(h) for h in hosts]  # each node's name resolves on every machine
os.makedirs("outputs", exist_ok=True)
with open(f"outputs/rank-{comm.rank}.txt", "w") as fh:
    fh.write(f"{total} {socket.gethostname()}")
print("rank", comm.rank, "total", total, "hosts", ",".join(hosts), "addresses", len(set(addresses)), flush=True)
data, copied, result = sys.argv[1:4]  # a prefetched input, a downloaded one, an output uploaded at the end
open("/tmp/left-by-the-job", "w").write("scratch")  # emptied before the node's next job, on either machine
with open(os.path.join(data, "a.txt")) as a, open(copied) as b, open(os.path.join(result, f"rank-{comm.rank}.txt"), "w") as out:
    out.write(a.read() + b.read())
if comm.rank < 2:  # Horovod (torch, over MPI) on node 0 here and node 1 on the other machine: 2 imports of torch, not 4
    import torch
    import horovod.torch as hvd
    hvd.init(comm=[0, 1])
    summed = hvd.allreduce(torch.full((1024,), float(hvd.rank() + 1)), op=hvd.Sum, name="across")
    peers = hvd.allgather_object(socket.gethostname())
    print("horovod", hvd.rank(), "of", hvd.size(), "sum", int(summed[0]), "all", int((summed == 3).sum()),
          "peers", ",".join(peers), flush=True)
"""


def _ours(client: Any, home_id: str) -> list[str]:
    label = {"label": f"{LABEL}.home={home_id}"}
    return [c.name for c in client.containers.list(all=True, filters=label)] + \
        [n.name for n in client.networks.list(filters=label)] + [v.name for v in client.volumes.list(filters=label)]


REACH = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10).close()
    print("reached")
except OSError as exc:
    print(type(exc).__name__)
"""


def _closed_to_the_nodes(local: Any, remote: Any, home_id: str, host_addr: str) -> None:
    """A service of this machine that listens on every interface is out of reach of the cluster's
    nodes on both machines (refused at once, not left to time out)."""
    gateway = dockerengines.gateway(local, swarm.GWBRIDGE)
    with socket.create_server(("0.0.0.0", 0)) as server:
        port = str(server.getsockname()[1])
        for client, node, address in ((local, "c1-node-0", gateway), (remote, "c1-node-1", host_addr)):
            container = client.containers.get(f"amlemu-{home_id}-{node}")
            code, out = container.exec_run(["/usr/bin/python3", "-c", REACH, address, port])
            assert out.decode().strip() == "ConnectionRefusedError", (node, address, out.decode()[-500:])


LOOP = """
import time
from mpi4py import MPI
comm = MPI.COMM_WORLD
for step in range(100000):
    comm.allreduce(1)
    if step == 0:
        print("started", flush=True)
    time.sleep(0.02)
"""


# Ranks that start (MPI_Init: through mpirun's daemons, which call this machine back on its
# address) and then wait without sending to each other: a job on m2's new nodes that does not
# depend on the overlay's gossip having caught up after the link came back (docs/swarm.md).
HOLD = """
import time
from mpi4py import MPI
print("started", MPI.COMM_WORLD.rank, flush=True)
time.sleep(600)
"""


def _start(emu: Emulator, tmp_path: Path, script: str, nodes: int = 4) -> Any:
    run = emu.submit(JobFactory(tmp_path / "jobs")(script, nodes=nodes))
    wait_until(lambda: all("started" in run.logs(rank) for rank in range(nodes)) or run.status.is_terminal, STARTUP,
               "every rank started")
    return run


def _fails_naming(emu: Emulator, run: Any, what: str, within: float, nodes: int = 4) -> str:
    """The run fails as a lost node fails it on AmlCompute: the second machine's nodes (the odd
    ones) named, what became of that machine said, within `within` seconds (a deadline, not a
    wait); those nodes go."""
    wait_until(lambda: run.status.is_terminal, within, f"the run ends once {what}")
    reason = run.events()[-1][2]
    lost, kept = ", ".join(f"c1-node-{i}" for i in range(1, nodes, 2)), [f"c1-node-{i}" for i in range(0, nodes, 2)]
    assert run.status is RunStatus.FAILED and f"node {lost} was lost (machine m2" in reason, reason
    assert sorted(n.name for n in emu.store.nodes("c1")) == kept
    return reason


def _a_machine_cut_off_fails_the_run(emu: Emulator, rig_state: dict[str, Any], tmp_path: Path) -> None:
    """The second machine's link goes down under an allreduce loop (its engine still answers, its
    ranks still run: nothing ends by itself): the swarm marks it down and the run fails; the link is
    put back after (and the machine takes nodes again: the next step)."""
    run = _start(emu, tmp_path, LOOP)
    link = ["ip", "link", "set", "dev", rig_state["veth_host"]]
    subprocess.run([*link, "down"], check=True)
    try:
        reason = _fails_naming(emu, run, "the second machine is cut off", 60)
        assert "machine m2 was cut off from this one (the swarm: heartbeat failure)" in reason, reason
    finally:
        subprocess.run([*link, "up"], check=True)


def _an_engine_stopped_fails_the_run(emu: Emulator, engine: SecondEngine, tmp_path: Path, nodes: int) -> None:
    """The second machine's dockerd dies under a running job (SIGKILL, its nodes' processes with it:
    the machine crashed): the run fails naming the machine; its nodes' containers stay on it, which
    no one could remove while it did not answer, for the cleanup to find once it is back."""
    run = _start(emu, tmp_path, HOLD, nodes)
    rig.stop_engine(engine.home, kill=True)
    _fails_naming(emu, run, "the second machine's engine stopped", 60, nodes)
    assert "machine m2's engine does not answer" in run.events()[-1][2]
    engine.state.update(rig.start_engine(engine.home))  # the session's rig, with its new pid
    left = engine.client.containers.list(all=True, filters={"label": f"{LABEL}.home={emu.home.id}"})
    assert sorted(c.labels[f"{LABEL}.node"] for c in left) == [f"c1-node-{i}" for i in range(1, nodes, 2)]


def _cleanup_without_state(emu: Emulator) -> None:
    """The home's state database unreadable (its machines' registry and run records with it):
    `amlemu cleanup --reset-state` still finds what the home left on every machine (the engines it
    recorded placing nodes on), its supervisors by their command line, and the swarm amlemu made."""
    from click.testing import CliRunner  # noqa: PLC0415

    from amlemu.cli import cli  # noqa: PLC0415

    emu.store.close()
    for db in emu.home.root.glob("amlemu.db-*"):
        db.unlink()
    emu.home.db.write_bytes(b"not a database " * 512)
    done = CliRunner().invoke(cli, ["--home", str(emu.home.root), "cleanup", "--yes", "--reset-state"],
                              env={"AMLEMU_TARGET": "", "AMLEMU_DEBUG": ""})
    assert done.exit_code == 0, done.output


def _add_rig(emu: Emulator, rig_engine: SecondEngine, over_tcp: bool = False) -> None:
    """The rig as the home's machine m2, its cores and memory as its engine reports them: by its
    socket (an engine of this machine, sharing its files), or `over_tcp` as another host is added,
    at tcp://<its address>:2376 with TLS (its nodes' folders shipped through its engine)."""
    state, info = rig_engine.state, rig_engine.client.info()
    where = {"address": state["tcp_address"], "tls": TlsFiles(**state["tls"])} if over_tcp else {"address": state["address"]}
    machine = Machine("m2", cores=float(info["NCPU"]), memory_bytes=int(info["MemTotal"]), added=time.time(),
                      service_address=state["host_addr"], advertise_address=state["node_addr"], **where)
    assert machine.ships_files is over_tcp
    execute(registry.plan_add(emu.store, machine))


WS = "azureml://datastores/workspaceblobstore/paths"
DATA = f"""
inputs:
  data: {{path: {WS}/shipped, mode: ro_mount}}
  copied: {{type: uri_file, path: {WS}/shipped/b.txt, mode: download}}
outputs:
  result: {{path: {WS}/results, mode: upload}}
"""


@pytest.mark.xdist_group("second-engine")
def test_an_mpi_job_across_two_machines(second_engine: SecondEngine, tmp_path: Path) -> None:
    state, remote = second_engine.state, second_engine.client
    emu = Emulator(home=tmp_path / "home", backend="docker")
    local = docker.from_env()
    swarm_before = local.info()["Swarm"]["LocalNodeState"]
    try:
        _add_rig(emu, second_engine, over_tcp=True)  # as another host: TLS, nothing of this machine's node folders there
        emu.create_compute(ClusterSpec("c1", "STANDARD_D2_V2", max_nodes=4, machines=("local", "m2"),
                                       idle_seconds_before_scaledown=600))
        fs, root = emu.datastores.filesystem("workspaceblobstore")
        fs.pipe({f"{root}/shipped/a.txt": b"A", f"{root}/shipped/b.txt": b"B"})
        run = emu.submit(JobFactory(tmp_path / "jobs")(ALLREDUCE, nodes=4, extra=DATA,
                                                       args="${{inputs.data}} ${{inputs.copied}} ${{outputs.result}}"))
        assert run.wait(timeout=180) is RunStatus.COMPLETED, (run.events()[-1][2], run.logs(0)[-2000:])
        assert [fs.cat(f"{root}/results/rank-{rank}.txt") for rank in range(4)] == [b"AB"] * 4  # from both machines
        lifecycle = (run.dir / "system_logs" / "lifecycle.txt").read_text()
        assert "c1-node-1: the run's folder shipped to machine m2, and 2 new file(s) of its cache" in lifecycle
        node = remote.containers.get(f"amlemu-{emu.home.id}-c1-node-1")
        assert {m["Destination"]: m["Type"] for m in node.attrs["Mounts"]}["/mnt/azureml"] == "volume"
        assert node.exec_run(["ls", "-A", "/tmp", "/mnt/azureml"]).output.decode().split() == ["/mnt/azureml:", "/tmp:"]
        for rank in range(4):  # every rank's log, from both machines' nodes, agrees
            assert f"rank {rank} total 10 hosts c1-node-0,c1-node-1,c1-node-2,c1-node-3 addresses 4" in run.logs(rank)
        assert sorted(p.read_text() for p in run.outputs.glob("rank-*.txt")) == [f"10 c1-node-{i}" for i in range(4)]
        for rank in range(2):  # Horovod's allreduce between a node of each machine
            assert f"horovod {rank} of 2 sum 3 all 1024 peers c1-node-0,c1-node-1" in run.logs(rank), run.logs(rank)[-2000:]
        on_m2 = sorted(c.labels[f"{LABEL}.node"] for c in remote.containers.list(
            filters={"label": f"{LABEL}.home={emu.home.id}"}))
        assert on_m2 == ["c1-node-1", "c1-node-3"]  # spread: the odd nodes on the second machine, idle there now
        _closed_to_the_nodes(local, remote, emu.home.id, state["host_addr"])
        _a_machine_cut_off_fails_the_run(emu, state, tmp_path)  # its engine stopped: the seed's test (make test-full)
    finally:
        second_engine.state.update(rig.start_engine(second_engine.home))  # as it was, whatever failed
        _cleanup_without_state(emu)
    assert_nothing_left(emu, "docker")
    assert _ours(local, emu.home.id) == [] and _ours(remote, emu.home.id) == []
    if swarm_before == "inactive":  # the swarm amlemu made for the cluster is gone from both engines
        assert local.info()["Swarm"]["LocalNodeState"] == remote.info()["Swarm"]["LocalNodeState"] == "inactive"
        assert local.networks.list(names=[swarm.GWBRIDGE]) == []


@FULL
@pytest.mark.xdist_group("second-engine")
def test_the_seeds_job_with_a_node_on_each_machine(second_engine: SecondEngine, mnist_subset: Path,
                                                    tmp_path: Path) -> None:
    """The seed's job (trainer/job.yml: Horovod MNIST, 2 nodes x 1 process, MPI), unchanged, with
    node 0 on this machine's engine and node 1 on the rig's, reading MNIST from workspaceblobstore:
    it learns (2,000 images, 2 epochs: ~0.58; chance 0.1) and both ranks end with the same
    parameters. Then the rig's dockerd stopped under a job on the warm nodes: the run fails naming
    the machine, and once the engine is back `cleanup` removes the stopped node left on it.
    `make test-full` (the 2-machine allreduce in make test covers Horovod's path and a machine cut off)."""
    remote = second_engine.client
    emu = Emulator(home=tmp_path / "home", backend="docker")
    try:
        _add_rig(emu, second_engine)
        emu.create_compute(ClusterSpec("c1", "STANDARD_D2_V2", max_nodes=2, machines=("local", "m2"),
                                       idle_seconds_before_scaledown=600))
        emu.datastores.upload(mnist_subset, "azureml://datastores/workspaceblobstore/paths/mnist")
        run = emu.submit(REPO / "trainer" / "job.yml", overrides=["compute=c1"])
        assert run.wait(timeout=900) is RunStatus.COMPLETED, run.record.error
        summary = json.loads((run.outputs / "summary.json").read_text())
        assert summary["world_size"] == 2 and summary["params_in_sync"] is True, summary
        assert summary["test_accuracy"] >= 0.5, summary
        assert "parameters identical on all 2 ranks: True" in run.logs(0)
        assert [c.labels[f"{LABEL}.node"] for c in remote.containers.list(  # idle there now, for 10 minutes
            all=True, filters={"label": f"{LABEL}.home={emu.home.id}"})] == ["c1-node-1"]
        _an_engine_stopped_fails_the_run(emu, second_engine, tmp_path, nodes=2)
    finally:
        second_engine.state.update(rig.start_engine(second_engine.home))  # as it was, whatever failed
        emu.cleanup()  # with the state database: the leftovers on the machine whose engine came back
        emu.store.close()
    assert_nothing_left(emu, "docker")
    assert _ours(remote, emu.home.id) == []


def test_machine_add_takes_the_machines_network_addresses(home: Path) -> None:
    from click.testing import CliRunner  # noqa: PLC0415

    from amlemu.cli import cli  # noqa: PLC0415

    def amlemu(*argv: str) -> Any:
        return CliRunner().invoke(cli, ["--home", str(home), *argv], env={"AMLEMU_TARGET": "", "AMLEMU_DEBUG": ""})

    socket_address = "unix:///var/run/docker.sock"
    done = amlemu("machine", "add", "m2", socket_address, "--service-address", "100.72.0.1", "--advertise-address",
                  "100.72.0.2", "--dry-run", "-o", "json")
    assert done.exit_code == 0, done.stderr
    [action] = json.loads(done.stdout)["actions"]
    assert (action["service_address"], action["advertise_address"], action["files"]) == ("100.72.0.1", "100.72.0.2", "")
    done = amlemu("machine", "add", "m2", socket_address, "--service-address", "gpu2.lan")
    assert done.exit_code == 1 and "--service-address: 'gpu2.lan' is not an IP address" in done.stderr
    # an engine of this machine added as another host would be: its nodes' folders shipped, listed so
    assert amlemu("machine", "add", "m2", socket_address, "--files", "shipped").exit_code == 0
    listed = {m["name"]: m["files"] for m in json.loads(amlemu("machine", "list", "-o", "json").stdout)}
    assert listed == {"local": "shared", "m2": "shipped"}
    done = amlemu("machine", "add", "m3", socket_address, "--files", "copied")
    assert done.exit_code == 2 and "'copied' is not one of 'shared', 'shipped'" in done.stderr


def test_the_backend_reaches_an_ssh_engine_through_the_sdks_ssh_transport() -> None:
    """An ssh:// machine's engine: the SDK's paramiko transport is used (a server that is not ssh
    fails its handshake: SSHException), and the failure is one line naming the address."""
    from amlemu.backends.dockerapi import connect  # noqa: PLC0415
    from amlemu.errors import BackendError  # noqa: PLC0415

    def not_ssh() -> None:  # answers as a web server would: paramiko finds no ssh banner at once
        with contextlib.suppress(OSError):
            conn, _ = server.accept()
            conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n")
            conn.close()

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        server.settimeout(10)
        answering = threading.Thread(target=not_ssh)
        answering.start()
        with pytest.raises(BackendError) as failed:
            connect(f"ssh://me@127.0.0.1:{port}")
        answering.join()
    assert str(failed.value).startswith(f"the Docker engine at ssh://me@127.0.0.1:{port} does not answer (SSHException)")
