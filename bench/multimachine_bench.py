"""A cluster over two machines against the same cluster on one (issue 31), measured in one run and
printed as ratios. Not a test: the figures are reported (docs/benchmarks.md).

    .venv/bin/python bench/multimachine_bench.py [--nodes 4] [--repeat 3] [--max-nodes 8]
        [--steps one,two,seed,largest] [--files shared|shipped]

The second machine is the test rig (amlemu.machines.rig: a second Docker engine on this machine in
its own network namespace, reached over a veth link; root only), registered as machine m2. Both
"machines" share this machine's cores, so the ratio is what the path between machines costs (the
swarm's VXLAN overlay, the veth link, the second engine's NAT), not more hardware. With
`--files shipped` m2 stands for another host: its nodes' folders are volumes there, shipped through
its engine before and after each job (backends/shipping.py), and each job reports that stage.

1. one: a --nodes cluster on this machine's engine (its bridge network), warm; each repeat runs
   an mpi4py job, one rank per node: 200 allreduces of one integer (latency) and 20 of 1 MiB of
   float64 (bandwidth), timed inside rank 0, and the job's submit-to-completed wall time;
2. two: the same cluster spread over this machine and m2 (half the nodes on each, one overlay);
3. seed: the seed's job (trainer/job.yml, Horovod MNIST, one epoch on 2 nodes) on this machine
   and over both machines (a node on each), samples/s, --repeat runs each, alternated;
4. largest: clusters over both machines of 4, 8, ... up to --max-nodes nodes, one rank per node
   (the mpi4py job), the seconds per size until one fails or runs over.
Everything it made is removed at the end (the cleanup, then the rig), interrupted or not.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common import Steps, bench_home, report  # noqa: E402 - bench/common.py

from amlemu.actions import execute  # noqa: E402
from amlemu.api import Emulator  # noqa: E402
from amlemu.machines import registry, rig  # noqa: E402
from amlemu.machines.registry import Machine  # noqa: E402
from amlemu.specs import ClusterSpec, RunStatus  # noqa: E402
from pytest_amlemu import mnist  # noqa: E402

ALLREDUCE = """
import json, time
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
comm.Barrier()
start = time.perf_counter()
for _ in range(200):
    comm.allreduce(1)
latency = (time.perf_counter() - start) / 200
data, total = np.ones(128 * 1024), np.empty(128 * 1024)
comm.Barrier()
start = time.perf_counter()
for _ in range(20):
    comm.Allreduce(data, total)
seconds = time.perf_counter() - start
assert int(total[0]) == comm.size
if comm.rank == 0:
    print("BENCH " + json.dumps({"allreduce_latency_us": round(latency * 1e6, 1),
                                 "allreduce_1mib_mb_s": round(20 * data.nbytes / seconds / 1e6, 1)}), flush=True)
"""


def write_job(folder: Path, cluster: str, nodes: int) -> Path:
    (folder / "src").mkdir(parents=True, exist_ok=True)
    (folder / "src" / "allreduce.py").write_text(textwrap.dedent(ALLREDUCE))
    job = folder / f"{cluster}-{nodes}.yml"
    job.write_text(f"code: src\ncommand: python allreduce.py\ncompute: azureml:{cluster}\nexperiment_name: bench\n"
                   f"resources:\n  instance_count: {nodes}\ndistribution:\n  type: mpi\n  process_count_per_instance: 1\n")
    return job


def run_job(emu: Emulator, job: Path) -> dict[str, float]:
    began = time.monotonic()
    run = emu.submit(job)
    status = run.wait(timeout=600)
    if status is not RunStatus.COMPLETED:
        raise RuntimeError(f"run {run.id} {status.value}: {run.events()[-1][2]}")
    line = next(line for line in run.logs(0).splitlines() if line.startswith("BENCH "))
    return {"wall_s": round(time.monotonic() - began, 2), **json.loads(line[len("BENCH "):]), **shipping_s(run)}


def shipping_s(run) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """The stage "node folders shipped" of the run's timeline (only where m2's files are shipped)."""
    for line in (run.dir / "system_logs" / "timeline.txt").read_text().splitlines():
        if "node folders shipped" in line:
            return {"shipping_s": float(line.split("(+")[1].split(")")[0])}
    return {}


def measure(emu: Emulator, work: Path, name: str, machines: tuple[str, ...], nodes: int, repeat: int) -> dict:
    emu.create_compute(ClusterSpec(name, "STANDARD_D2_V2", max_nodes=nodes, machines=machines,
                                   idle_seconds_before_scaledown=3600))
    job = write_job(work / "jobs", name, nodes)
    cold = run_job(emu, job)  # nodes made, the swarm joined: what a first job pays
    runs = [run_job(emu, job) for _ in range(repeat)]
    median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    median.update({f"cold_{k}": v for k, v in cold.items() if k == "shipping_s"})
    return {"machines": list(machines) or ["local"], "nodes": nodes, "cold_wall_s": cold["wall_s"], **median}


def seed(emu: Emulator, repeat: int) -> dict:
    """The seed's job (trainer/job.yml: Horovod MNIST, one epoch, 2 nodes) on 2 nodes of this
    machine and on 2 nodes spread over both, alternated (this machine's speed drifts). Over both,
    each node has its machine's 2 cores to itself (2 threads per rank), which here are the same 2
    cores: so it also runs with the one-machine run's thread setting (1), what isolates the path."""
    data = mnist.prepare().root
    for name, machines in (("seed1", ()), ("seed2", ("local", "m2"))):
        emu.create_compute(ClusterSpec(name, "STANDARD_D2_V2", max_nodes=2, machines=machines,
                                       idle_seconds_before_scaledown=3600))
    kinds = {"one_machine": ("seed1", []), "two_machines": ("seed2", []),
             "two_machines_same_threads": ("seed2", ["environment_variables.OMP_NUM_THREADS='1'"])}
    sps: dict[str, list[float]] = {kind: [] for kind in kinds}
    threads: dict[str, object] = {}
    for _ in range(repeat):
        for kind, (name, extra) in kinds.items():
            run = emu.submit(REPO / "trainer" / "job.yml",
                             overrides=[f"inputs.data_dir.path={data}", "inputs.epochs=1", f"compute={name}", *extra])
            if run.wait(timeout=1800) is not RunStatus.COMPLETED:
                raise RuntimeError(f"seed run {run.id} on {name}: {run.events()[-1][2]}")
            summary = json.loads((run.outputs / "summary.json").read_text())
            sps[kind].append(summary["samples_per_second"])
            threads[kind] = summary.get("threads")
    medians = {kind: statistics.median(values) for kind, values in sps.items()}
    return {**{f"{kind}_samples_per_s": value for kind, value in medians.items()},
            "ratio": round(medians["two_machines"] / medians["one_machine"], 3),
            "ratio_same_threads": round(medians["two_machines_same_threads"] / medians["one_machine"], 3),
            "threads": threads, "runs": sps}


def largest(emu: Emulator, work: Path, max_nodes: int) -> dict:
    sizes, nodes = {}, 4
    while nodes <= max_nodes:
        name = f"big{nodes}"
        try:  # a size refused when the compute is made (the quota: AMLEMU_MAX_INSTANCES) ends the step too
            emu.create_compute(ClusterSpec(name, "STANDARD_D2_V2", max_nodes=nodes, machines=("local", "m2"),
                                           idle_seconds_before_scaledown=0))
            sizes[nodes] = run_job(emu, write_job(work / "jobs", name, nodes))["wall_s"]
        except Exception as exc:  # noqa: BLE001 - the largest is the last that worked
            sizes[nodes] = f"failed: {exc}"
            break
        finally:
            if name in [c.spec.name for c in emu.computes()]:
                emu.delete_compute(name)
        nodes *= 2
    return {"seconds_by_nodes": sizes, "largest": max((n for n, s in sizes.items() if isinstance(s, float)), default=0)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-nodes", type=int, default=8)
    parser.add_argument("--steps", default="one,two,seed,largest")
    parser.add_argument("--files", choices=("shared", "shipped"), default="shared",
                        help="m2 as an engine of this machine (shared) or as another host (shipped)")
    args = parser.parse_args()
    wanted = set(args.steps.split(","))
    with bench_home("amlemu-multimachine-", "docker") as (work, emu):
        state = rig.up(work / "rig")
        try:
            info = rig.client(state).info()
            execute(registry.plan_add(emu.store, Machine(
                "m2", state["address"], float(info["NCPU"]), int(info["MemTotal"]), added=time.time(),
                service_address=state["host_addr"], advertise_address=state["node_addr"], files=args.files)))
            steps = Steps(emu)
            steps.results["m2_files"] = args.files
            one = steps.run("one", 900, lambda: measure(emu, work, "one", (), args.nodes, args.repeat)) \
                if "one" in wanted else None
            two = steps.run("two", 900, lambda: measure(emu, work, "two", ("local", "m2"), args.nodes, args.repeat)) \
                if "two" in wanted else None
            if one and two:
                steps.results["ratio_two_over_one"] = {
                    key: round(two[key] / one[key], 2) for key in ("wall_s", "allreduce_latency_us", "allreduce_1mib_mb_s")}
            if "seed" in wanted:
                steps.run("seed", 3600, lambda: seed(emu, args.repeat))
            if "largest" in wanted:
                steps.run("largest", 1800, lambda: largest(emu, work, args.max_nodes))
            steps.results["rig_up_s"] = state.get("up_s")
        finally:
            emu.cleanup()
            rig.down(work / "rig")
    return report(steps.results)


if __name__ == "__main__":
    sys.exit(main())
