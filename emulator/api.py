"""The Python API, in the spirit of the Azure ML SDK: an emulated workspace with computes and runs.

    emu = Emulator()                                   # AMLEMU_HOME or ~/.amlemu
    emu.create_compute(ClusterSpec("cpu-cluster", "STANDARD_D2_V2", max_nodes=2))
    run = emu.submit("trainer/job.yml")
    run.wait(show_output=True)
    run.metrics()["test_accuracy"]
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from amlemu import forkserver, statefile, workspacerules
from amlemu.actions import Action, execute
from amlemu.backends import get_backend, resolve_backend
from amlemu.cluster import autoscale
from amlemu.cluster import pools, teardown
from amlemu.cluster.faults import FaultInjector
from amlemu.cluster.store import Cluster, Node, Store
from amlemu.envs.software import plan_software
from amlemu.errors import ConfigError
from amlemu.home import Home, default_cache, new_run_id
from amlemu.jobs import gitcode
from amlemu.jobs.jobspec_io import job_to_record
from amlemu.jobs.sdkjobs import to_cluster, to_job
from amlemu.machines import registry as machine_registry
from amlemu.runs.handle import Run
from amlemu.runs.timeline import Timeline
from amlemu.runs import recovery
from amlemu.runs.jobplan import job_launch, node_plans, node_requests
from amlemu.specs import ClusterSpec, DataInput, JobSpec, RunStatus
from amlemu.storage.assets import Assets
from amlemu.storage.datastores import Datastores
from amlemu.sweeps import submit as sweeps
from amlemu.pipelines import submit as pipelines


class Emulator:
    def __init__(self, home: str | Path | None = None, backend: str | None = None) -> None:
        self.home = Home.at(home)
        self.store = Store(self.home.db)
        self.default_backend = backend or os.environ.get("AMLEMU_BACKEND", "auto")
        self.datastores = Datastores(self.store, self.home.root, default_cache())
        self.assets = Assets(self.store, self.datastores)  # data and model assets (storage/assets.py)
        self.faults = FaultInjector(self.home, self.store)

    # --- workspace ---------------------------------------------------------------------------
    def workspace(self) -> dict[str, str]:
        return self.store.workspace()

    # --- computes ----------------------------------------------------------------------------
    def plan_compute(self, spec: Any, backend: str | None = None, name: str | None = None) -> dict[str, Any]:
        """Dry run of create_compute. `spec`: a ClusterSpec, an azure.ai.ml AmlCompute, or a v1
        provisioning configuration with its `name`."""
        spec = self._on_machines(to_cluster(spec, name))
        pools.check_user_compute(spec)
        chosen, why = resolve_backend(backend or self.default_backend)
        machine_registry.check_backend(spec.machines, chosen)
        be = get_backend(chosen, self.home)
        requests = [autoscale.node_request(self.home, spec, i) for i in range(spec.min_nodes)]
        limits = autoscale.limits_here(spec)
        return {"compute": {**spec.__dict__, "vm_priority": spec.vm_priority.value}, "backend": chosen,
                "backend_note": why, "node_limits": {"cpus": limits.cpus, "cpu_share": limits.cpu_share,
                                                      "memory_bytes": limits.memory_bytes},
                "notice": limits.notice, "nodes_now": [be.plan_node(r).to_dict() for r in requests]}

    def _on_machines(self, spec: ClusterSpec) -> ClusterSpec:
        """Its machines checked against the home's (`all`: every one known now); nodes are placed on
        them by the backend."""
        return replace(spec, machines=machine_registry.resolve(self.store, spec.machines)) if spec.machines else spec

    def create_compute(self, spec: Any, backend: str | None = None, name: str | None = None) -> Cluster:
        spec = self._on_machines(to_cluster(spec, name))
        plan = self.plan_compute(spec, backend)
        created = self.store.add_cluster(spec, plan["backend"])
        be = get_backend(plan["backend"], self.home)
        be.create_cluster(spec.name)
        if spec.min_nodes:  # min_nodes are up from the start and never scale down
            now = time.time()
            nodes = [Node(spec.name, i, f"{spec.name}-node-{i}", "creating", None, None, now, None)
                     for i in range(spec.min_nodes)]
            requests = [autoscale.node_request(self.home, spec, n.idx) for n in nodes]
            with self.store.transaction() as db:
                for node in nodes:
                    self.store.set_node(db, node)
            try:
                autoscale.create_nodes(self.store, be, requests)
            except BaseException:
                for request in requests:  # nothing half-created stays behind
                    be.remove_node(request)
                self.delete_compute(spec.name)
                raise
            with self.store.transaction() as db:
                for node in self.store.nodes(spec.name, db):
                    self.store.set_node(db, replace(node, state="idle"))
        return created

    def computes(self) -> list[Cluster]:
        return self.store.clusters()

    def compute(self, name: str) -> Cluster:
        return self.store.cluster(name)

    def delete_compute(self, name: str) -> list[str]:
        """Remove the compute's nodes, network, records and folders; says what went."""
        return execute(self.plan_delete_compute(name))

    # --- jobs --------------------------------------------------------------------------------
    def _job(self, job: Any, overrides: list[str] | None = None) -> JobSpec:
        return self.assets.bind(to_job(job, overrides))  # azureml:<asset> inputs: datastore URIs

    def _check(self, job: JobSpec, probe: bool) -> Cluster:
        """The workspace's rules (amlemu/workspacerules.py), the first error raised as `job validate`
        words it; the job's cluster (a pool not made yet: what submit makes). `probe`: URL inputs are
        read (a submit; a dry run reads nothing from the network and creates nothing)."""
        cluster = workspacerules.check(job, self, probe=probe).raise_first_error().cluster
        if cluster is None:  # not reached: a job without a cluster has an error, raised above
            raise NotFoundError("compute", job.compute or "")
        return cluster

    def _make_cluster(self, spec: ClusterSpec, backend: str) -> Cluster:
        made = self.store.add_cluster(spec, backend)
        get_backend(backend, self.home).create_cluster(spec.name)
        return made

    def job_cluster(self, job: JobSpec, make: Any = None) -> Cluster:
        """The cluster `job` runs on: its named compute, or the serverless or local pool (made by `make`)."""
        return pools.cluster_for(self.store, job, os.environ, lambda: resolve_backend(self.default_backend)[0], make)

    def plan_job(self, job: Any, run_id: str = "<run id>",
                 overrides: list[str] | None = None) -> dict[str, Any]:
        """Dry run, creating nothing: the launch plan the supervisor will execute (runs.plan), on
        the cluster's first nodes with placeholder addresses (allocation decides both), what the
        backend would create for each node, and the software they run (built already or not)."""
        job = self._job(job, overrides)
        cluster = self._check(job, probe=False)
        run_id = job.name or run_id
        backend = get_backend(cluster.backend, self.home)
        software = plan_software(job.environment, job.environment_def, self.store.environment, default_cache(),
                                 has_image=backend.has_image)  # what will run, built or not: nothing is built
        requests = node_requests(self.home, cluster.spec, range(job.instance_count), job, software)
        plan = job_launch(job, run_id, backend, requests, [f"<address of {r.name}>" for r in requests],
                          self.workspace(), software)
        return {**plan.to_dict(), "nodes": [n.to_dict() for n in node_plans(backend, requests, software)],
                "software": software.to_dict(), **pools.describe(self.store, cluster)}

    def submit(self, job: Any, overrides: list[str] | None = None, parent: str | None = None) -> Run:
        """`job`: a CLI v2 YAML path (a command or sweep job), a JobSpec or SweepSpec, an azure.ai.ml
        command job or an SDK v1 ScriptRunConfig / estimator. Snapshot the code, queue the run, and hand
        it to its own supervisor process (a sweep: to its driver, emulator/sweeps/). `parent`: the sweep
        a trial belongs to."""
        started = time.time()  # the run's timeline counts from here (runs/timeline.py)
        if sweeps.is_sweep(job):
            return sweeps.submit(self, sweeps.load(job, overrides))
        if pipelines.is_pipeline(job):  # to its driver, emulator/pipelines/; each step a child job
            return pipelines.submit(self, pipelines.load(self, job, overrides))
        job = self._job(job, overrides)
        self._check(job, probe=True)  # before anything is created
        self.reconcile()
        run_id = job.name or new_run_id()
        run_dir = self.home.run_dir(run_id)
        # The snapshot: later edits of the source do not change a queued or running job.
        try:
            gitcode.take_snapshot(job, run_dir / "snapshot")  # code: git+...: cloned now, then removed
        except BaseException:
            shutil.rmtree(run_dir, ignore_errors=True)  # no run folder without a run record
            raise
        timeline = Timeline.begin(run_dir, started)
        timeline.mark("submit: job read, bound and checked; code snapshot taken")
        cluster = self.job_cluster(job, self._make_cluster)  # a serverless pool is made now, after every check
        self.store.add_run(run_id, job.experiment_name, cluster.spec.name, job_to_record(job), parent=parent)
        self.store.set_status(run_id, RunStatus.QUEUED, "submitted")
        data = bool(job.outputs) or any(isinstance(v, DataInput) for v in job.inputs.values())
        self.start_owner(run_id, "amlemu.runs.supervisor", "supervisor.txt", warm=data)
        timeline.mark("submit: queued, supervisor started")
        return Run(self.store, self.home, run_id, self.reconcile)

    def start_owner(self, run_id: str, module: str, log_name: str, warm: bool = False) -> None:
        """The process that carries a queued run to its end (`<module>.main([home, run id])`: a run's
        supervisor, a sweep's or pipeline's driver), in a session of its own, forked by the home's fork
        server (emulator/forkserver.py), its output in the run's system_logs/<log_name>; recorded as the
        run's supervisor_pid and supervisor_started (reconcile and cleanup find it there). `warm`: the
        run uses a datastore (the server then imports the storage modules for the runs after it)."""
        logs = self.home.run_dir(run_id) / "system_logs"
        logs.mkdir(parents=True, exist_ok=True)
        owner = forkserver.start_owner(self.home.root, module, run_id, logs / log_name, self._supervisor_env(), warm)
        self.store.update_run(run_id, supervisor_pid=owner.pid, supervisor_started=owner.started)

    def _supervisor_env(self) -> dict[str, str]:
        """The submitter's environment less every variable holding a datastore secret: the
        supervisor and all it starts live as long as the run, and any process of the same user
        can read their /proc/<pid>/environ. The secrets reach the supervisor from the home's
        owner-only files, never through its environment."""
        folder = self.home.root / "secrets"
        secrets = [p.read_text().strip() for p in folder.iterdir() if p.is_file()] if folder.is_dir() else []
        secrets = [s for s in secrets if len(s) >= 8]  # a short value would match innocent variables
        return {k: v for k, v in os.environ.items() if not any(s in v for s in secrets)}

    def run(self, run_id: str) -> Run:
        self.store.run(run_id)
        return Run(self.store, self.home, run_id, self.reconcile)

    def runs(self, experiment: str | None = None, parent: str | None = None) -> list[Run]:
        """The runs (of one experiment; a sweep's trials, with `parent`), oldest first."""
        return [Run(self.store, self.home, r.id, self.reconcile) for r in self.store.runs(experiment=experiment, parent=parent)]

    # --- housekeeping ------------------------------------------------------------------------
    def reconcile(self) -> list[str]:
        """Runs whose supervisor died (killed, machine restarted) are failed and their nodes freed."""
        fixed = []
        for record in self.store.runs():  # a run's watchdog has usually done this already
            if recovery.claim(self.store, record):
                recovery.recover(self.home, self.store, record)
                fixed.append(record.id)
        return fixed

    def cleanup(self, all_homes: bool = False) -> list[str]:
        """Stop every run and server, remove every node, network, run and cluster of this home."""
        return execute(self.plan_cleanup(all_homes))

    # --- dry runs: what the verbs above do, as Actions (emulator/actions.py) ------------------
    def plan_delete_compute(self, name: str) -> list[Action]:
        return teardown.plan_delete_compute(self.home, self.store, name)

    def plan_cleanup(self, all_homes: bool = False) -> list[Action]:
        return teardown.plan_cleanup(self.home, self.store, self.datastores.azurite, all_homes)

    def plan_write_config(self, path: str | Path) -> list[Action]:
        ws = self.workspace()
        config = {key: ws[key] for key in ("subscription_id", "resource_group", "workspace_name")}
        if Path(path).is_symlink():  # writing through it would overwrite whatever file it points at
            raise ConfigError("--path", f"{path} is a symbolic link (to {os.readlink(path)}); amlemu does not write "
                              "through links", "remove the link, or give --path a file of its own")

        def write() -> None:  # staged, then renamed: a link made meanwhile is replaced, never followed
            statefile.write_text(Path(path), json.dumps(config, indent=2) + "\n")
        return [Action("write", "file", str(path), {"config": config}, run=write)]

    def plan_cancel(self, run_id: str) -> list[Action]:
        """Cancel = the status CancelRequested; the run's supervisor then stops the job (Canceled)."""
        status = self.store.run(run_id).status
        if status.is_terminal:
            return [Action("leave", "run", run_id, {"status": status.value, "why": "it has ended"})]

        def request() -> None:
            self.store.set_status(run_id, RunStatus.CANCEL_REQUESTED, "cancel requested")
        return [Action("set status", "run", run_id, {"from": status.value, "to": RunStatus.CANCEL_REQUESTED.value},
                       run=request)]

    def cancel(self, run_id: str) -> list[str]:
        return execute(self.plan_cancel(run_id))
