"""This machine, closed to its docker nodes: packet filter rules on each cluster network's bridge.

Why: a container reaches its host at every address the host has (the bridge's gateway, the
machine's own interfaces), so a job on a docker node reached every service of this machine that
listens on all interfaces (a developer's database, another home's exposed service) although
loopback ones were out of its reach. AmlCompute's nodes reach the workspace's services and the
internet, not the machine that hosts them. So each docker cluster's bridge gets, in the INPUT
chain (what arrives for this machine, not what it forwards: node to node and node to the outside
are unchanged), at the top:

    ACCEPT  replies to connections this machine opened (the relays to a run's services)
    ACCEPT  tcp to the gateway at each port a run opened for its nodes (its service link,
            mpirun's daemons calling back), for that run's lifetime only
    REJECT  everything else (refused at once: a node trying the host's other addresses moves on)

and IPv6 is refused outright (the nodes' networks are IPv4; the bridge still has a link-local
address). Each rule carries a comment `amlemu:<home>:<cluster>[:<run>]`, from which it is found
again and removed (with its cluster, by a run's end, by the reaper); nothing else is kept.

Needs root and the iptables tools, and the bridge on this machine (an engine elsewhere has its own
host): otherwise nothing is changed, and the dry run's notice says what a job can then reach.
"""
from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from amlemu.actions import Action

TAG = "amlemu"
TOOLS = ("iptables", "ip6tables")


def bridge_name(network_id: str) -> str:
    """The interface Docker makes for a user-defined bridge network: br-<first 12 of its id>."""
    return f"br-{network_id[:12]}"


def comment(home: str | None = None, cluster: str | None = None, run: str | None = None) -> str:
    """A rule's tag, and the prefix its home's, cluster's or run's rules are found by."""
    return ":".join(part for part in (TAG, home, cluster, run) if part)


def supported(bridge: str) -> str | None:
    """None when the guard can be set for `bridge`, else why not (for the dry run's notice)."""
    if os.geteuid() != 0:
        return "closing this machine to them needs root"
    if not all(shutil.which(tool) for tool in TOOLS):
        return "closing this machine to them needs iptables (Debian: the iptables package)"
    if not Path("/sys/class/net", bridge).exists():
        return "their Docker engine is on another machine"
    return None


def guard_rules(bridge: str, tag: str) -> list[tuple[str, list[str]]]:
    """(tool, rule) for a cluster's bridge, top first (pure)."""
    mark = ["-m", "comment", "--comment", tag]
    return [("iptables", ["-i", bridge, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", *mark, "-j", "ACCEPT"]),
            ("iptables", ["-i", bridge, *mark, "-j", "REJECT", "--reject-with", "icmp-port-unreachable"]),
            ("ip6tables", ["-i", bridge, *mark, "-j", "REJECT"])]


def port_rule(bridge: str, address: str, port: int, tag: str) -> list[str]:
    """The rule that lets the bridge's nodes reach `address`:`port` (pure)."""
    return ["-i", bridge, "-p", "tcp", "-d", address, "--dport", str(port),
            "-m", "comment", "--comment", tag, "-j", "ACCEPT"]


def insert_argv(tool: str, rule: list[str]) -> list[str]:
    return [tool, "-w", "-I", "INPUT", "1", *rule]


def check_argv(tool: str, rule: list[str]) -> list[str]:
    return [tool, "-w", "-C", "INPUT", *rule]


def delete_argvs(tool: str, listing: str, prefix: str) -> list[list[str]]:
    """The commands that delete each INPUT rule of `iptables -S INPUT`'s `listing` whose comment
    is `prefix` or starts with `prefix:` (pure)."""
    found = []
    for line in listing.splitlines():
        words = shlex.split(line)
        if words[:2] != ["-A", "INPUT"] or "--comment" not in words:
            continue
        tag = words[words.index("--comment") + 1]
        if tag == prefix or tag.startswith(prefix + ":"):
            found.append([tool, "-w", "-D", "INPUT", *words[2:]])
    return found


def note(network_id: str | None) -> str:
    """What the dry run says of a cluster's guard."""
    why = supported(bridge_name(network_id)) if network_id else supported("lo")
    if why is None:
        return ("this machine refuses the cluster's nodes everything but their run's service link and mpirun's "
                "port (iptables INPUT rules on the cluster's bridge); nodes reach each other and the outside")
    return (f"the nodes reach services listening on this machine's interfaces other than loopback: {why}; "
            "run the emulator as root on the engine's machine to close them")


SWARM_PORTS = (("tcp", 2377), ("tcp", 7946), ("udp", 7946), ("udp", 4789))  # what a swarm's engines use


def source_rules(source: str, tag: str) -> list[tuple[str, list[str]]]:
    """(tool, rule) closing this machine to another machine's traffic (its address `source`: its
    engine and, masqueraded, its nodes), top first: replies, the swarm's ports, then REJECT (pure).
    Its nodes reach the swarm's ports too: those are the swarm's (mutual TLS; VXLAN where the
    overlays are not encrypted, docs/swarm.md)."""
    mark = ["-m", "comment", "--comment", tag]
    return [("iptables", ["-s", source, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", *mark, "-j", "ACCEPT"]),
            *(("iptables", ["-s", source, "-p", proto, "--dport", str(port), *mark, "-j", "ACCEPT"])
              for proto, port in SWARM_PORTS),
            ("iptables", ["-s", source, *mark, "-j", "REJECT", "--reject-with", "icmp-port-unreachable"])]


def source_port_rule(source: str, address: str, port: int, tag: str) -> list[str]:
    """The rule that lets another machine's nodes reach `address`:`port` here (pure)."""
    return ["-s", source, "-p", "tcp", "-d", address, "--dport", str(port),
            "-m", "comment", "--comment", tag, "-j", "ACCEPT"]


def close_source(source: str, home: str, cluster: str) -> None:
    """source_rules set once (inserted at the top in reverse: the replies end up first)."""
    for tool, rule in reversed(source_rules(source, comment(home, cluster))):
        if not run_argv(check_argv(tool, rule)):
            run_argv(insert_argv(tool, rule))


def open_source_port(source: str, address: str | None, port: int, home: str, cluster: str, run: str) -> None:
    rule = source_port_rule(source, address or "0.0.0.0/0", port, comment(home, cluster, run))
    run_argv(insert_argv("iptables", rule))


def closed_sources(listing: str, tag: str) -> list[str]:
    """The machines' addresses closed under exactly `tag` (a cluster's), from `iptables -S INPUT` (pure)."""
    found = []
    for line in listing.splitlines():
        words = shlex.split(line)
        if "-s" in words and "REJECT" in words and "--comment" in words and words[words.index("--comment") + 1] == tag:
            found.append(words[words.index("-s") + 1].removesuffix("/32"))
    return found


def sources(home: str, cluster: str) -> list[str]:
    """The other machines this machine is closed to for the cluster (their rules are the record)."""
    listed = subprocess.run(["iptables", "-w", "-S", "INPUT"], capture_output=True, text=True, timeout=60)
    return closed_sources(listed.stdout, comment(home, cluster)) if listed.returncode == 0 else []


def run_argv(argv: list[str]) -> bool:
    return subprocess.run(argv, capture_output=True, timeout=60).returncode == 0


def close(bridge: str, home: str, cluster: str) -> None:
    """Set the cluster's guard (once: a rule already there is not added again). Rules are inserted
    at the top, so the last inserted is first: REJECT, then the replies above it."""
    tag = comment(home, cluster)
    for tool, rule in reversed(guard_rules(bridge, tag)):
        if not run_argv(check_argv(tool, rule)):
            run_argv(insert_argv(tool, rule))


def open_port(bridge: str, address: str, port: int, home: str, cluster: str, run: str) -> None:
    run_argv(insert_argv("iptables", port_rule(bridge, address, port, comment(home, cluster, run))))


def rules(prefix: str) -> list[list[str]]:
    """The commands that would remove every rule under `prefix` (a home, a cluster or a run)."""
    if os.geteuid() != 0 or not shutil.which("iptables"):
        return []
    found = []
    for tool in filter(shutil.which, TOOLS):
        listed = subprocess.run([tool, "-w", "-S", "INPUT"], capture_output=True, text=True, timeout=60)
        found += delete_argvs(tool, listed.stdout, prefix) if listed.returncode == 0 else []
    return found


def plan_remove(prefix: str) -> list[Action]:
    """The reaper's step: the rules under `prefix` listed now, and removed as found when it runs
    (a supervisor stopped by the same cleanup may have opened a run's port after this listing)."""
    listed = [" ".join(argv[4:]) for argv in rules(prefix)]
    return [Action("remove", "firewall rules", prefix, {"rules": listed}, run=functools.partial(remove, prefix),
                   always=True)] if listed else []


def remove(prefix: str) -> int:
    """Remove every rule under `prefix`; how many were removed."""
    return sum(run_argv(argv) for argv in rules(prefix))
