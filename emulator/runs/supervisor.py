"""One process per run, detached from whoever submitted it: it waits for nodes (Queued), prepares
them (Preparing), launches the job the way AmlCompute does (Running), collects outputs and logs
(Finalizing), sets the final status, and then stays to scale idle nodes down.

    python -m amlemu.runs.supervisor <home> <run id>
"""
from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time

from amlemu import statefile
from amlemu.backends import NodeRequest, cpugroup, get_backend
from amlemu.cluster import autoscale
from amlemu.cluster.faults import MAX_PREEMPTIONS, PARTITION_TIMEOUT, FaultInjector, policy_schedule
from amlemu.cluster.store import Store
from amlemu.envs.software import missing_import, plan_software, realize
from amlemu.errors import AmlEmuError
from amlemu.home import AGENT_CONFIG_VARIABLE, Home, default_cache
from amlemu.jobs.jobspec_io import job_from_record
from amlemu.runs import homestore, machinewatch, memwatch, mpi, nodework, rundisk, servicelink, servicerun, statuswrite, watchdog
from amlemu.runs.gang import Gang
from amlemu.runs.metrics import plot_run
from amlemu.runs.mounts import RunData
from amlemu.runs.outcome import POLL, Attempt, Outcome, Watch, ending
from amlemu.runs.jobplan import job_launch, node_requests
from amlemu.runs.plan import LaunchPlan, agent_config, agent_file
from amlemu.runs.runfiles import AGENT_CONFIG
from amlemu.runs.runlogs import RunLogs, failure_reason
from amlemu.runs.timeline import Timeline
from amlemu.specs import JobSpec, RunStatus
from amlemu.storage.datastores import Datastores
from amlemu.storage.nodecache import policy_from_env

KILL_GRACE = 2.0


class Supervisor:
    def __init__(self, home: Home, run_id: str) -> None:
        self.home, self.run_id, self.store = home, run_id, Store(home.db)
        record = self.store.run(run_id)
        self.job: JobSpec = job_from_record(record.job)
        self.cluster = self.store.cluster(record.cluster)
        self.backend = get_backend(self.cluster.backend, home)
        self.run_dir = home.run_dir(run_id)
        self.logs = RunLogs(self.run_dir, self.job.process_count, self.job.log_layout)
        self.requests: list[NodeRequest] = []
        self.data: RunData | None = None
        self.attempt_since = 0.0
        self.quiesced = False  # no job process left on the nodes (quiesce ran since the launch)
        self.plan: LaunchPlan | None = None
        self.gang_failure: tuple[int | None, int] | None = None  # (rank, exit code) of the first to fail
        self.memory_reason: str | None = None  # why the job was stopped, when it drove this machine out of memory
        self.faults = FaultInjector(home, self.store)
        self.link: servicelink.RunLink | None = None  # to the home's Azure ML service, while it runs
        self.ending: tuple[RunStatus, str, dict] | None = None  # the final status, once decided
        self.timeline = Timeline.resume(self.run_dir)  # the submit began it
        self.logs.on_first_output = lambda: self.mark("first output of the job")

    # --- helpers -----------------------------------------------------------------------------
    def status(self) -> RunStatus:
        return self.store.run(self.run_id).status

    def set(self, status: RunStatus, detail: str = "", **fields) -> None:  # type: ignore[no-untyped-def]
        if status.is_terminal:  # plotted first, ports closed first: whoever sees the run ended finds them so
            self.ending = (status, detail, fields)  # the job's own outcome: no later error replaces it
            self.close_ports()
            homestore.end_run(self.run_dir, status.value, self.logs.platform)
            plot_run(self.run_dir, f"{self.run_id} ({self.job.experiment_name}): {status.value}", self.logs.platform)
        statuswrite.write_status(self.store, self.run_id, status, detail, self.logs.platform, **fields)
        self.logs.platform(f"status {status.value}" + (f": {detail.splitlines()[0]}" if detail else ""))

    def mark(self, stage: str, at: float | None = None) -> None:
        if self.timeline is not None:
            self.timeline.mark(stage, at)

    def close_ports(self) -> None:
        if self.requests:  # the run's service link and mpirun's port (backends' open_port)
            self.backend.close_ports(self.requests[0], self.run_id)

    def canceled(self) -> bool:
        return self.status() is RunStatus.CANCEL_REQUESTED

    # --- lifecycle ---------------------------------------------------------------------------
    def run(self) -> None:
        try:
            while True:  # one pass per attempt: a preempted run goes round again
                allocation = self.wait_for_nodes()
                plan = self.prepare(allocation) if allocation else None
                if not plan or not self.execute(plan):
                    break
        except AmlEmuError as exc:  # bad data, a node that would not start: the message says it all
            self.logs.platform(f"error: {exc}")
            self.end_with_error(str(exc))
        except Exception as exc:  # noqa: BLE001 - whatever broke, the run must end in a terminal state
            self.logs.platform(f"emulator error: {type(exc).__name__}: {exc}")
            self.end_with_error(f"the emulator failed while running the job: {type(exc).__name__}: {exc}")
        finally:
            if self.link:
                self.link.stop()
            self.close_ports()
            self.logs.close()
        self.linger()

    def wait_for_nodes(self) -> autoscale.Allocation | None:
        self.attempt_since = time.time()  # faults recorded from now on concern this attempt
        self.logs.platform(f"waiting for {self.job.instance_count} node(s) of {self.cluster.spec.name}")
        while True:
            if self.canceled():
                self.set(RunStatus.CANCELED, "canceled while queued")
                return None
            allocation = autoscale.try_allocate(self.store, self.cluster.spec, self.run_id, self.job.instance_count)
            if allocation:
                self.mark(f"nodes allocated ({len(allocation.new)} to create)")
                return allocation
            time.sleep(POLL)

    def prepare(self, allocation: autoscale.Allocation) -> LaunchPlan | None:
        spec, self.software = self.cluster.spec, realize(plan_software(  # as the dry run planned it, built now
            self.job.environment, self.job.environment_def, self.store.environment, default_cache(),
            has_image=self.backend.has_image), default_cache(), self.logs.platform)
        self.mark("environment ready")
        self.requests = node_requests(self.home, spec, [n.idx for n in allocation.nodes], self.job, self.software)
        new = [r for r in self.requests if r.index in {n.idx for n in allocation.new}]
        for request in nodework.unfit(self.backend, [r for r in self.requests if r not in new]):
            self.logs.platform(f"node {request.name} is made again for this job (its /dev/shm size, environment, "
                               "hosts entry differ, or it runs a job image: a new container for each job)")
            self.backend.remove_node(request)
            new.append(request)
        addresses = nodework.create(self.store, self.backend, spec.name, new, self.requests, self.logs.platform, self.mark)
        self.plan = job_launch(self.job, self.run_id, self.backend, self.requests,
                               [addresses[r.name] or "127.0.0.1" for r in self.requests], self.store.workspace(),
                               self.software)
        for notice in self.plan.notices:
            self.logs.platform(f"notice: {notice}")
        self.mark("launch planned")
        self.link = self.link or servicelink.attach(self.home.root, self.run_id, self.backend, self.requests[0],
                                                    self.logs.platform)
        self.mark("service link open" if self.link else "offline (no service)")
        online = {**self.link.env, **homestore.online_env(  # in the nodes' env files only, not in the plan
            self.home.root, self.run_dir, self.link.env, self.job.experiment_name, self.run_id,
            self.job.display_name or self.run_id, self.logs.platform)} if self.link else {}
        if self.link:
            self.mark("MLflow run made")
        rundisk.lay_out_nodes([r.node_dir for r in self.requests], self.run_id, self.run_dir,
                              [{**self.plan.node_environment(n), **online} for n in self.plan.nodes],
                              self.store.run(self.run_id).preemptions > 0, self.job.experiment_name,
                              self.job.display_name or self.run_id, rundisk.platform_files(self.job, self.link))
        self.mark("node folders and env files laid out")
        self.prepare_data()
        self.mark("inputs ready")
        if nodework.ship_in(self.backend, self.requests, self.run_id, self.logs.platform):
            self.mark("node folders shipped to other machines")
        config = agent_config(self.backend, self.requests, self.run_id, self.home.root / "process-nodes" / ".root")
        statefile.write_bytes(self.run_dir / AGENT_CONFIG, agent_file(config), owner_only=True)
        if self.canceled():
            self.set(RunStatus.CANCELED, "canceled while preparing")
            self.cleanup_nodes(dead=set())
            return None
        return self.plan

    def prepare_data(self) -> None:
        """Inputs into every node's cache (or disk), output folders made; nodes in parallel."""
        policy, _ = policy_from_env(self.job.environment_variables, job_start=time.time())  # notices: in the plan
        self.data = RunData(Datastores(self.store, self.home.root, default_cache()), self.job, self.run_id,
                            policy, self.logs.platform)
        self.data.prepare_nodes(self.requests, self.backend, self.run_dir)  # the data runtime's mounts too

    def execute(self, plan: LaunchPlan) -> bool:
        """Run the plan to its end; True when the run was preempted and must be restarted."""
        if self.preempted():  # taken away while preparing
            return self.restart()
        # What ran, as the dry run shows it; owner-only: the job's variables may hold secrets.
        statefile.write_json(self.run_dir / "system_logs" / "launch.json", plan.to_dict(), owner_only=True, indent=2)
        env = {**mpi.platform_env(dict(os.environ)), **plan.launch_env, AGENT_CONFIG_VARIABLE: str(self.run_dir / AGENT_CONFIG)}
        port = self.backend.callback_port(self.requests[0], self.run_id) if plan.launcher == "mpirun" else None
        if port:  # the one port of this machine its nodes' MPI daemons may call back to, on their network
            env.update(OMPI_MCA_oob_tcp_static_ipv4_ports=str(port), **self.backend.callback_mca(self.requests[0]))
        # Running is set before the launch: a cancel racing with it then finds nothing started.
        self.set(RunStatus.RUNNING, f"launching {self.job.process_count} process(es) on {len(plan.nodes)} node(s)"
                 + (" (mpirun)" if plan.launcher == "mpirun" else " (started by each node)"))
        self.mark("launching: " + ("mpirun" if plan.launcher == "mpirun" else  # before: the job's output may come at once
                                   f"{len(plan.processes)} process(es) started by their nodes"))
        gang = Gang(plan, env, self.logs)
        services = servicerun.start(self, plan, env, gang)  # beside the job, stopped with it
        self.store.update_run(self.run_id, launch_pid=gang.pgid)
        stop_refresh = threading.Event()
        refresher = threading.Thread(target=self.data.refresh_while if self.data else None,
                                     args=(self.requests, stop_refresh, self.backend), daemon=True)
        refresher.start()
        mirror = threading.Thread(target=rundisk.mirror_stores, daemon=True,
                                  args=(self.backend, self.requests, self.run_id, self.run_dir, stop_refresh))
        mirror.start()
        memory = memwatch.start(self.backend, self.requests, list(plan.ranks), stop_refresh, self.logs.platform)
        cpugroup.start(lambda: self.backend.cpu_sharer(self.requests), stop_refresh)  # docker: one CPU group a cluster
        self.machines = machinewatch.Machines(self.requests)  # a node's machine cut off: its nodes are lost
        watch = Watch(canceled=self.canceled, preempted=lambda: bool(self.preempted()), partitioned=self.partitioned_too_long,
                      preempt=self.policy_preempt, machine_cut=self.machines.cut_off, limit=self.job.max_run_duration_seconds,
                      due=policy_schedule(self.store, self.cluster.spec.name, self.run_id, [r.name for r in self.requests]),
                      out_of_memory=lambda: memory.reason is not None, sleep=gang.nap)
        outcome = watch.until_done(gang.poll)
        for request in [r for r in self.requests if r.name in self.machines.cut]:
            self.backend.cut_off(request)  # its nodes are lost: nothing below waits on its engine
        if outcome is not Outcome.EXITED or gang.poll():  # a failed process: the others go, as mpirun stops its ranks
            self.stop(gang)
        exit_code = gang.wait()
        services.stop()
        stop_refresh.set()
        refresher.join(timeout=30)
        mirror.join(timeout=3)  # live copies only (merged from the nodes below): one may wait on a machine cut off
        memwatch.keep(self.home.root, self.job, self.run_id, memory)
        self.memory_reason = memory.reason
        if outcome is Outcome.EXITED and self.preempted():  # the kill ended the job before a poll saw the fault
            outcome = Outcome.PREEMPTED
        if outcome is Outcome.PREEMPTED and not self.canceled():
            self.stop(gang)
            return self.restart()
        # A node with a kill recorded, or on a machine cut off, is lost even if its engine still says running.
        killed = {f["node"] for f in self.store.faults(self.run_id, "kill", since=self.attempt_since)} | set(self.machines.cut)
        lost = [r.name for r, alive in zip(self.requests, self.node_states()) if not alive or r.name in killed]
        self.gang_failure = gang.failure
        self.finalize(outcome, exit_code, lost)
        return False

    # --- faults ------------------------------------------------------------------------------
    def preempted(self) -> list[str]:
        return sorted({f["node"] for f in self.store.faults(self.run_id, "preempt", since=self.attempt_since)})

    def partitioned_too_long(self) -> bool:
        return any(time.time() - f["ts"] > PARTITION_TIMEOUT
                   for f in self.store.faults(self.run_id, "partition", since=self.attempt_since))

    def restart(self) -> bool:
        """Preempted: outputs and logs so far are kept, the run's nodes go, and the run waits for
        fresh nodes (or fails past the cluster's limit). True when it is to be started again."""
        victims = self.preempted()
        self.logs.platform(f"preempted: node(s) {', '.join(victims)} taken away (low priority)")
        self.quiesce()
        self.upload_outputs()
        self.collect()
        self.cleanup_nodes(dead={r.name for r in self.requests})
        count = self.store.run(self.run_id).preemptions + 1
        policy = self.store.preemption_policy(self.cluster.spec.name)
        limit = policy["max_preemptions"] if policy else MAX_PREEMPTIONS
        if self.canceled():
            self.set(RunStatus.CANCELED, "canceled by request", preemptions=count)
            return False
        if count > limit:
            reason = (f"preempted {count} times, more than the {limit} restarts allowed (set them with "
                      f"`amlemu compute preemption-policy --max-preemptions`); outputs so far are kept")
            self.set(RunStatus.FAILED, reason, error=reason, preemptions=count)
            return False
        self.set(RunStatus.QUEUED, f"preempted (node(s) {', '.join(victims)}); restart {count} of at most "
                 f"{limit} on fresh nodes", preemptions=count)
        return True

    def stop(self, gang: Gang) -> None:
        """End the launch on the host, then every job process left on the nodes."""
        gang.stop(grace=KILL_GRACE)
        nodework.each_node(self.requests, self.backend.stop_processes)

    def node_states(self) -> list[bool]:
        alive = {n.name: n.running for n in self.backend.list_nodes() if n.cluster == self.cluster.spec.name}
        return [alive.get(r.name, False) for r in self.requests]

    def finalize(self, outcome: Outcome, exit_code: int, lost: list[str]) -> None:
        if self.canceled():  # a cancel that came as the job was ending still wins
            outcome = Outcome.CANCELED
        if outcome is not Outcome.CANCELED:
            self.set(RunStatus.FINALIZING, f"exit code {exit_code}")
        self.quiesce()
        upload_error = self.upload_outputs()
        self.collect()
        cut_off = sorted({f["node"] for f in self.store.faults(self.run_id, "partition", since=self.attempt_since)})
        self.cleanup_nodes(dead=set(lost) | set(cut_off))  # a node cut off from its cluster is no use to the next job
        end = ending(Attempt(outcome, exit_code, tuple(lost), upload_error, self.job.max_run_duration_seconds,
                             tuple(cut_off), PARTITION_TIMEOUT, self.memory_reason), explain=lambda: self.explain(exit_code, lost))
        self.set(end.status, end.detail, exit_code=exit_code, **({"error": end.error} if end.error else {}))

    def explain(self, exit_code: int, lost: list[str]) -> str:
        """Why the job failed by itself: the failing rank, node and exit code, from the logs."""
        mpi_log = self.logs.mpi_path.read_text(errors="replace")
        killed = frozenset(f["node"] for f in self.store.faults(self.run_id, "kill", since=self.attempt_since))
        reason = failure_reason(mpi_log, list(self.plan.ranks), self.run_dir, exit_code, lost, killed,
                                self.gang_failure[0] if self.gang_failure else None, self.machines.why(lost))
        return reason + (f"\n{hint}" if (hint := missing_import(reason, self.software, self.logs.platform)) else "")

    def policy_preempt(self, node: str) -> None:
        try:
            self.faults.preempt(self.cluster.spec.name, node, reason="the cluster's preemption policy")
        except AmlEmuError as exc:  # the node went meanwhile: nothing to preempt
            self.logs.platform(f"preemption policy: {exc}")

    def end_with_error(self, reason: str) -> None:
        """Nodes cleaned before the terminal status, as in finalize: a run that has ended has left
        nothing on its nodes (whoever waits for it may look at once). A final status already decided
        (the job's own, whose writing failed) is written again, never replaced by the error."""
        try:
            self.cleanup_nodes(dead=set())
        finally:
            if self.ending is not None:
                statuswrite.write_status(self.store, self.run_id, *self.ending[:2], self.logs.platform, **self.ending[2])
            elif not self.status().is_terminal:
                self.set(RunStatus.CANCELED if self.canceled() else RunStatus.FAILED, reason, error=reason)

    def upload_outputs(self) -> str | None:
        """rw_mount / upload outputs to their datastore, whatever the ending; an error is returned."""
        if self.data is None:
            return None
        try:
            self.data.upload_outputs({r.name: r.node_dir for r in self.requests})
        except AmlEmuError as exc:
            self.logs.platform(f"error: {exc}")
            return f"uploading the outputs failed: {exc}"
        return None

    def quiesce(self) -> None:
        nodework.quiesce(self.backend, self.requests, self.run_id, self.run_dir, self.logs.platform)
        self.quiesced = True

    def collect(self) -> None:
        nodework.collect(self.requests, self.run_id, self.run_dir, self.logs.platform)

    def cleanup_nodes(self, dead: set[str]) -> None:
        nodework.clean(self.home, self.store, self.backend, self.cluster.spec, self.run_id, self.requests, dead,
                       stop=not self.quiesced, log=self.logs.platform)
        self.quiesced = False

    def linger(self) -> None:
        nodework.linger(self.home, self.store, self.backend, self.cluster.spec)


def main(argv: list[str] | None = None) -> int:
    home_root, run_id = (sys.argv[1:] if argv is None else argv)[:2]
    # `kill -USR1 <supervisor_pid>`: every thread's stack into system_logs/supervisor.txt (a stuck run)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    guard = watchdog.start(home_root, run_id)  # before any thread or connection exists: a clean fork
    supervisor = Supervisor(Home.at(home_root), run_id)
    supervisor.mark("supervisor ready (its imports, the run's record)")
    supervisor.run()
    watchdog.dismiss(guard)  # not reached when this process is killed or crashes: the watchdog then acts
    return 0


if __name__ == "__main__":
    sys.exit(main())
