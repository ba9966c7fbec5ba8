"""A run's services (runs/services.py) while its job runs: the supervisor starts them on their nodes
just after the job, relays each to a port of this machine's 127.0.0.1 (runs/relay.py), records
their state with the run, and stops them with the job.

The record (RECORD in the run's folder, owner-only) is what `amlemu job show` and the service's
job resource show under `services.<name>` (jobs/resource.py, through `rest_services`): type,
status (Starting, Running, Failed, Stopped), the endpoint and, for jupyter_lab, its token in the
endpoint's URL: the record is read by the home's owner (`amlemu job show`) and the service's job
route, which asks for the workspace's token; the run's own token (the job's) opens no such route.
The token never goes to a log, the launch plan or a command line (the node's shell reads it from
its standard input).

The services' processes on the host (one launch agent each) join the job's process group, so
whatever stops the job's launch (a cancel, a cleanup that finds launch_pid) stops them too; their
processes on the nodes end with the job's (the backend's stop_processes, at quiesce).
"""
from __future__ import annotations

import contextlib
import functools
import os
import secrets
import signal
import subprocess
import threading
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from amlemu import statefile
from amlemu.jobs.resource import SERVICES_RECORD as RECORD
from amlemu.runs.plan import AGENT, LaunchPlan
from amlemu.runs.services import MISSING_EXIT, ServicePlan, missing_notice, plan_services

if TYPE_CHECKING:
    from amlemu.runs import relay

LOGS = "system_logs/services"  # each service's output, per node (Jupyter masks a token it was given)
POLL = 0.2


class Services:
    def __init__(self, supervisor: Any, plans: tuple[ServicePlan, ...], env: dict[str, str], gang: Any) -> None:
        self.sup, self.plans, self.gang = supervisor, plans, gang
        self.log = supervisor.logs.platform
        self.relay: relay.Relay | None = None
        if plans:  # asyncio: only a run with services pays its import (~10 ms)
            from amlemu.runs.relay import Relay  # noqa: PLC0415

            self.relay = Relay()
        self.state: dict[str, dict[str, Any]] = {}  # by plan key: status, endpoint, error
        self.procs: dict[str, subprocess.Popen] = {}
        self._files: list[IO[str]] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        requests = {r.name: r for r in supervisor.requests}
        for plan in plans:
            try:
                self._start(plan, requests[plan.node], env)
            except OSError as exc:  # the job runs on without it
                error = f"services.{plan.name} ({plan.type}) could not start on {plan.node}: {exc}"
                self.state[plan.key] = {"status": "Failed", "endpoint": "", "error": error}
                self.log(f"notice: {error}")
        self._write()
        self._watcher = threading.Thread(target=self._watch, name="amlemu-services", daemon=True)
        if plans:
            self._watcher.start()

    def _start(self, plan: ServicePlan, request: Any, env: dict[str, str]) -> None:
        assert self.relay is not None
        port = self.relay.add(functools.partial(self.sup.backend.connect_node, request, plan.address, plan.port))
        token = secrets.token_hex(24) if plan.token else None
        endpoint = f"http://127.0.0.1:{port}{plan.url_path}" + (f"?token={token}" if token else "")
        self.state[plan.key] = {"status": "Starting", "endpoint": endpoint, "error": None}
        folder = Path(self.sup.run_dir, LOGS)
        folder.mkdir(parents=True, exist_ok=True)
        out = open(folder / f"{plan.name}_{plan.node}.txt", "a", buffering=1)
        self._files.append(out)
        try:  # in the job's process group: what stops the job's launch stops its services
            proc = subprocess.Popen(list(plan.launch), env=env, stdin=subprocess.PIPE, stdout=out,
                                    stderr=subprocess.STDOUT, text=True, process_group=self.gang.pgid)
        except OSError:  # the group is gone already (the job ended at once): a group of its own
            proc = subprocess.Popen(list(plan.launch), env=env, stdin=subprocess.PIPE, stdout=out,
                                    stderr=subprocess.STDOUT, text=True, process_group=0)
        self.procs[plan.key] = proc
        with contextlib.suppress(OSError):  # a service that ended at once: its status says so
            proc.stdin.write(f"{token or ''}\n")  # type: ignore[union-attr]
            proc.stdin.close()  # type: ignore[union-attr]
        self.log(f"service {plan.name} ({plan.type}) starting on {plan.node}, relayed to 127.0.0.1:{port}")

    def _watch(self) -> None:
        """Until the job ends: each service's status as it answers or exits; then stop them all."""
        requests = {r.name: r for r in self.sup.requests}
        while not self._stopped.wait(POLL):
            if self.gang.poll() is not None:
                self.stop()
                return
            for plan in [p for p in self.plans if p.key in self.procs]:
                state, proc = self.state[plan.key], self.procs[plan.key]
                code = proc.poll()
                if state["status"] in ("Starting", "Running") and code is not None and code >= 0:
                    error = missing_notice(plan) if code == MISSING_EXIT else (
                        f"services.{plan.name} ({plan.type}) on {plan.node} exited with code {code}; its output: "
                        f"{LOGS}/{plan.name}_{plan.node}.txt")
                    self._set(plan, "Failed", error)
                    self.log(f"notice: {error}")
                elif state["status"] == "Starting" and code is None and self._answers(plan, requests[plan.node]):
                    self._set(plan, "Running")
                    self.log(f"service {plan.name} ({plan.type}) running on {plan.node}: its endpoint is in "
                              "`amlemu job show`")

    def _answers(self, plan: ServicePlan, request: Any) -> bool:
        try:
            self.sup.backend.connect_node(request, plan.address, plan.port).close()
            return True
        except OSError:
            return False

    def _set(self, plan: ServicePlan, status: str, error: str | None = None) -> None:
        with self._lock:
            self.state[plan.key].update(status=status, error=error)
        self._write()

    def _write(self) -> None:
        if not self.plans:
            return
        by_name: dict[str, dict[str, Any]] = {}
        with self._lock:
            for plan in self.plans:
                entry = by_name.setdefault(plan.name, {"type": plan.type, "nodes": {}})
                entry["nodes"][plan.node] = dict(self.state[plan.key])
            statefile.write_json(Path(self.sup.run_dir, RECORD), by_name, owner_only=True)

    def stop(self) -> None:
        """Close the relay's ports and end the services' launches (idempotent)."""
        with self._lock:
            if self._stopped.is_set():
                return
            self._stopped.set()
        if self.relay is None:
            return
        self.relay.stop()
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGKILL)  # the agent: a process node's sandbox ends with it
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for out in self._files:
            out.close()
        with self._lock:
            for state in self.state.values():
                if state["status"] != "Failed":
                    state.update(status="Stopped", endpoint=state["endpoint"].split("?", 1)[0])
        self._write()
        self.log("services stopped with the job")


def start(supervisor: Any, plan: LaunchPlan, env: dict[str, str], gang: Any) -> Services:
    """The plan's services, started beside the job `gang` just launched; they stop with it (stop(),
    or by themselves once the gang has ended). Where a cluster's nodes share a network (process
    nodes), each gets a port free there now in place of the plan's."""
    requests = {r.name: r for r in supervisor.requests}
    ports = {s.key: _port(supervisor.backend, requests[s.node], s.port) for s in plan.services}
    plans = plan_services(supervisor.job, supervisor.run_id, plan.nodes, agent=AGENT, ports=ports)
    return Services(supervisor, plans, env, gang)



def _port(backend: Any, request: Any, default: int) -> int:
    try:
        return int(backend.node_port(request, default))
    except OSError:  # the plan's, then: a port taken meanwhile fails that service alone
        return default
