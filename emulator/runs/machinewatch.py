"""A run's nodes on other machines (issue 31), watched while its job runs: a machine cut off from
this one (its link down: its engine may still answer, its job processes still run, but no packet
crosses) ends the run as a lost node does on AmlCompute, with the nodes named and the machine said.

A job cut off that way does not end by itself: its ranks wait on TCP for minutes. The sign is the
swarm's own: the manager (this machine's engine) marks a machine down once its heartbeats stop
(machines.swarm.HEARTBEAT_S; about 3 missed). Read at most once a CHECK_S, only for a run with a
node on another machine; a run on one machine never asks.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from amlemu.backends import NodeRequest
from amlemu.backends.dockerapi import connect
from amlemu.cluster import spanning
from amlemu.errors import AmlEmuError

CHECK_S = 1.0


class Machines:
    """The watch's question (`cut_off`: has a machine of the run been cut off?) and, once the run
    ended, what to say of each node it lost (`why`)."""

    def __init__(self, requests: Iterable[NodeRequest], clock: Callable[[], float] = time.monotonic,
                 manager: Callable[[], Any] = connect) -> None:
        self.remote = {r.name: r for r in requests if r.engine}
        self.home_id = next((r.home_id for r in self.remote.values()), "")
        self.cut: dict[str, str] = {}  # node -> why its machine is cut off
        self._clock, self._manager, self._client = clock, manager, None
        self._next = 0.0

    def cut_off(self) -> bool:
        """True once the swarm's manager has marked a machine of the run's nodes down."""
        if self.cut or not self.remote or self._clock() < self._next:
            return bool(self.cut)
        self._next = self._clock() + CHECK_S
        try:
            self._client = self._client or self._manager()
            down = spanning.down_now(self._client, self.home_id)
        except Exception:  # noqa: BLE001 - this machine's engine busy or restarting: asked again next time
            return False
        self.cut = {name: f"machine {r.machine} was cut off from this one (the swarm: {down[r.machine]})"
                    for name, r in self.remote.items() if r.machine in down}
        return bool(self.cut)

    def why(self, lost: Iterable[str]) -> dict[str, str]:
        """For each lost node on another machine: its machine cut off, or its engine not answering."""
        found = {}
        for name in lost:
            request = self.remote.get(name)
            if request is None:
                continue
            found[name] = self.cut.get(name) or (
                f"machine {request.machine}'s engine does not answer" if not _answers(request) else
                f"on machine {request.machine}")
        return found


def _answers(request: NodeRequest) -> bool:
    try:
        connect(request.engine, request.engine_tls).close()
    except AmlEmuError:
        return False
    return True
