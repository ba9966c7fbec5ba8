"""Before a job starts on nodes that span machines: every node resolves every other node's name to
that node's address, as AmlCompute's nodes do when their job starts.

On one engine's bridge Docker's embedded DNS knows a container once it is attached. On a swarm's
overlay, an engine learns a container of another engine through the swarm's gossip (networkdb,
7946/tcp+udp), the same messages that give it the way to that container (the overlay's VXLAN
peers). On a loaded 2-core machine that took over a minute once, and a lookup before then fails
("Temporary failure in name resolution": the engine does not know the name, and its forward of it
outside finds no server). So the docker backend asks each node with `getent hosts` (the job's own
resolver: /etc/hosts, then the engine's DNS) until every peer resolves to its address, with a
deadline; an answer with another address (a node's earlier container, still gossiped) is not taken.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from amlemu.backends.base import NodeRequest
from amlemu.errors import BackendError

PEERS_KNOWN_S = 120.0  # a deadline: the gossip's periodic full exchange (every 30 s) has had its turns by then
POLL_S = 0.25
# Each name given and the first address it resolves to ("-": none); exit 3 where the node has no getent.
LOOKUP = 'command -v getent >/dev/null || exit 3; for n do a=$(getent hosts "$n") || a=-; echo "$n ${a%% *}"; done'
NOT_ASKED = frozenset({3, 126, 127})  # no getent, no /bin/sh: the node's image cannot be asked
Found = dict[str, str | None]  # peer -> the address it resolved to (None: none), for the peers not yet right


def lookup_argv(names: Sequence[str]) -> list[str]:
    """What a node runs to look its peers up (pure): the names are arguments, never script text."""
    return ["/bin/sh", "-c", LOOKUP, "lookup", *names]


def parse(output: str) -> dict[str, str]:
    """name -> address from the lookup's lines; a name that did not resolve is left out (pure)."""
    found: dict[str, str] = {}
    for fields in (line.split() for line in output.splitlines()):
        if len(fields) >= 2 and fields[1] != "-":
            found.setdefault(fields[0], fields[1])
    return found


def wrong(expected: Mapping[str, str], found: Mapping[str, str]) -> Found:
    """The peers not resolved to their address, with what they resolved to (pure)."""
    return {name: found.get(name) for name, address in expected.items() if found.get(name) != address}


def _ask(container: Any, expected: Mapping[str, str]) -> Found | None:
    """What `container` resolves wrong of `expected` now; None: it cannot be asked."""
    import docker  # noqa: PLC0415 - loaded by whoever made the container's client

    try:
        code, out = container.exec_run(lookup_argv(sorted(expected)))
    except docker.errors.APIError as exc:
        raise BackendError(f"node {container.name} could not be asked for its peers' names: "
                           f"{exc.explanation or exc}") from None
    if code in NOT_ASKED:
        return None
    found = parse(out.decode(errors="replace")) if code == 0 else {}  # another failure: asked again
    return wrong(expected, found)


def never(node: str, machine: str, found: Found, expected: Mapping[str, str], limit: float) -> str:
    """The one-line error naming the peers that never became resolvable on `node` (pure)."""
    peers = ", ".join(f"{peer} (its address {expected[peer]}; {'not known' if got is None else f'resolved to {got}'})"
                      for peer, got in sorted(found.items()))
    return (f"{peers} never became resolvable on node {node} (machine {machine}) within {limit:g} s: the swarm's "
            "gossip between the machines (7946/tcp+udp) did not tell its engine; check those ports (docs/swarm.md) "
            "and submit again")


def until_resolvable(containers: Mapping[str, Any], addresses: Mapping[str, str],
                     machines: Mapping[str, str] | None = None, limit: float = PEERS_KNOWN_S) -> list[str]:
    """Wait until each node (`containers`: node name -> its container) resolves every other node's
    name to its address (`addresses`: node name -> address); the nodes that could not be asked
    (their image has no getent: not waited on). Past `limit` seconds: BackendError naming the peers
    one node never resolved."""
    deadline = time.monotonic() + limit
    pending = {node: {p: a for p, a in addresses.items() if p != node} for node in containers}
    not_asked: list[str] = []
    with ThreadPoolExecutor(max(1, len(containers))) as pool:
        while True:
            asked = dict(zip(pending, pool.map(lambda node: _ask(containers[node], pending[node]), pending)))
            not_asked += [node for node, found in asked.items() if found is None]
            left = {node: found for node, found in asked.items() if found}
            if not left:
                return not_asked
            if time.monotonic() >= deadline:
                node, found = sorted(left.items())[0]
                raise BackendError(never(node, (machines or {}).get(node, "local"), found, addresses, limit))
            pending = {node: {p: addresses[p] for p in found} for node, found in left.items()}
            time.sleep(POLL_S)


def for_nodes(container: Callable[[NodeRequest], Any], requests: Sequence[NodeRequest], addresses: Sequence[str],
              log: Callable[[str], None], limit: float = PEERS_KNOWN_S) -> bool:
    """The docker backend's until_peers_known: nodes on an overlay only (on a bridge the engine's
    DNS knows each node once it is made); whether it waited."""
    if len(requests) < 2 or not any(r.overlay for r in requests):
        return False
    names = [r.name for r in requests]
    for node in until_resolvable(dict(zip(names, map(container, requests))), dict(zip(names, addresses)),
                                 {r.name: r.machine for r in requests}, limit):
        log(f"notice: node {node} has no getent: whether it resolves the other nodes was not checked")
    return True
