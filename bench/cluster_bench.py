"""The emulated cluster against the obvious baseline (bare mpirun / horovodrun on this machine),
measured in one run, printed as ratios. Not a test: goals are targets, the figures are reported.

    .venv/bin/python bench/cluster_bench.py [--backend docker|process] [--max-nodes 16]
        [--repeat 3] [--steps cold,warm,mnist,largest] [--load N] [--container-load N]

Each step prints its figures as it ends (a line, then a JSON line), has a time limit (a step that
runs over or fails is reported, its runs canceled, and the next step runs), and everything the
benchmark made is removed whatever happens, a SIGTERM or Ctrl-C included. `--load N` runs N busy
processes beside it, `--container-load N` N busy containers (a busy machine, measured on purpose); the load average before and after is
reported: say both with the figures. Goals: issue 30 (docs/benchmarks.md).

1. cold: the cluster from zero nodes to both ranks running (2 nodes x 1 rank), with the run's
   timeline (system_logs/timeline.txt: where the time went);
2. warm submit -> all ranks running (nodes already up), for a trivial script (the overhead over
   bare `mpirun -np 2` is the figure) and for one that imports torch + horovod (the ratio); bare
   mpirun gets the emulated ranks' thread settings (the ratio), and none (as a user would run it,
   reported beside);
3. Horovod MNIST samples/s on the emulator vs the same trainer run bare: the headline baseline is
   `mpirun -np 2` with the emulator's own mpirun options and the emulated ranks' thread settings
   (OMP_NUM_THREADS), so the ratio measures the emulator (containers, launch agent, mounts), not a
   threading or MPI-polling difference. It is given as the ratio of the medians and as
   `pair_ratio`, the median of each round's ratio, which a drift of this machine's speed between
   rounds does not move. Also reported: that baseline with MPI's TCP transport only (emulated
   nodes, like real ones, talk over a network, where 2 ranks on one machine use shared memory),
   bare `horovodrun -np 2` with those thread settings, and as a user would run it;
4. the largest cluster (up to --max-nodes), one rank per node: with mpi4py's allreduce (the
   lightest real MPI program: what the emulator costs per node) and with torch + Horovod ranks
   (where a rank's memory decides), the seconds per size and the memory an idle node holds.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common import THREAD_PROBE, Steps, Stopped, background_load, baseline_env, bench_home, report, same_threads  # noqa: E402 - bench/common.py

from amlemu.api import Emulator  # noqa: E402
from amlemu.backends import BACKENDS  # noqa: E402
from amlemu.errors import AmlEmuError  # noqa: E402
from amlemu.jobs.jobspec_io import job_from_record  # noqa: E402
from amlemu.runs import memwatch, timeline  # noqa: E402
from amlemu.runs.mpi import MpiLaunch, mpirun_argv  # noqa: E402
from amlemu.specs import ClusterSpec, RunStatus  # noqa: E402
from pytest_amlemu import mnist  # noqa: E402

# Each rank writes the wall-clock time at which it was running (after its imports) to a shared file,
# and its thread settings (what a fair baseline must copy).
READY = """
import json, os, sys, time
{imports}
rank = os.environ["OMPI_COMM_WORLD_RANK"]
out = os.environ.get("BENCH_OUT") or "outputs"  # an emulated rank: collected into the run's outputs
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, f"ready-{{rank}}"), "w") as fh:
    json.dump({{"time": time.time(), "threads": {probe}}}, fh)
"""
TORCH = "import torch, horovod.torch as hvd\nhvd.init()"
ALLREDUCE = """
import os, time, torch, horovod.torch as hvd
hvd.init()
total = hvd.allreduce(torch.ones(1000), op=hvd.Sum)
assert int(total[0]) == hvd.size(), total
print(f"allreduce over {hvd.size()} ranks ok", flush=True)
"""

# The lightest real MPI program: what the emulator itself costs per node.
MPI4PY_ALLREDUCE = """
from mpi4py import MPI
comm = MPI.COMM_WORLD
assert comm.allreduce(1) == comm.Get_size()
if comm.Get_rank() == 0:
    print(f"allreduce over {comm.Get_size()} ranks ok", flush=True)
"""


def _ready(folder: Path, ranks: int) -> list[dict]:
    return [json.loads((folder / f"ready-{r}").read_text()) for r in range(ranks)]


def ready_time(folder: Path, ranks: int) -> float:
    return max(stamp["time"] for stamp in _ready(folder, ranks))


def ready_threads(folder: Path, ranks: int) -> dict[str, str]:
    return same_threads([stamp["threads"] for stamp in _ready(folder, ranks)])


def bare_mpirun(script: str, folder: Path, threads: dict[str, str]) -> float:
    """Seconds from starting `mpirun -np 2 python script` (the emulator's mpirun options) to both
    ranks running, the ranks with the thread settings `threads` ({}: none, as a user would)."""
    path = folder / "bare.py"
    path.write_text(script)
    launch = MpiLaunch(program=[sys.executable, str(path)], nprocs=2, as_root=os.geteuid() == 0)
    for stale in folder.glob("ready-*"):
        stale.unlink()
    start = time.time()
    subprocess.run(mpirun_argv(launch), check=True, env=baseline_env(os.environ, threads, BENCH_OUT=str(folder)),
                   stdout=subprocess.DEVNULL)
    return ready_time(folder, 2) - start


def bare_mnist(kind: str, data: Path, folder: Path, threads: dict[str, str]) -> dict:
    """One epoch of the trainer as 2 ranks on this machine, outside the emulator: `mpirun` with the
    emulator's own options, or `horovodrun` as its docs say; the ranks with `threads`. Its summary."""
    folder.mkdir(parents=True)
    program = [sys.executable, str(REPO / "trainer" / "train.py"), "--data-dir", str(data), "--epochs", "1"]
    if kind.startswith("mpirun"):
        argv = mpirun_argv(MpiLaunch(program=program, nprocs=2, as_root=os.geteuid() == 0))
        if kind == "mpirun-tcp":  # as between emulated nodes: no shared-memory transport
            # Over loopback only: Open MPI leaves lo out by default and then tries every other
            # interface, which hung here on other sessions' bridge networks.
            argv = argv[:-len(program)] + ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"] + program
    else:
        argv = [str(Path(sys.executable).with_name("horovodrun")), "-np", "2", "-H", "localhost:2", *program]
    env = baseline_env(os.environ, threads, MLFLOW_TRACKING_URI=f"sqlite:///{folder / 'm.db'}")
    subprocess.run(argv, cwd=folder, check=True, stdout=subprocess.DEVNULL, env=env)
    return json.loads((folder / "outputs" / "summary.json").read_text())


def write_job(root: Path, name: str, script: str, nodes: int, compute: str = "bench") -> Path:
    folder = root / name
    (folder / "src").mkdir(parents=True, exist_ok=True)
    (folder / "src" / "main.py").write_text(script)
    (folder / "job.yml").write_text(textwrap.dedent(f"""\
        code: src
        command: python main.py
        compute: azureml:{compute}
        distribution: {{type: mpi, process_count_per_instance: 1}}
        resources: {{instance_count: {nodes}}}
        """))
    return folder / "job.yml"


def emulated(emu: Emulator, job: Path, ranks: int) -> float:
    """Seconds from submit to all ranks running (the run must complete)."""
    start = time.time()
    run = emu.submit(job)
    status = run.wait(timeout=600)
    if status is not RunStatus.COMPLETED:
        raise RuntimeError(f"bench job {run.id} {status.value}: {run.record.error}")
    return ready_time(run.outputs, ranks) - start


def cold_step(emu: Emulator, root: Path, trivial: str) -> dict:
    """2. The cluster has no node yet. Its ranks also tell their thread settings."""
    start = time.time()
    cold = emu.submit(write_job(root, "cold", trivial, 2))
    if cold.wait(timeout=600) is not RunStatus.COMPLETED:
        raise RuntimeError(f"bench job {cold.id}: {cold.record.error}")
    return {"cold_zero_to_running_s": round(ready_time(cold.outputs, 2) - start, 3),
            "emulated_rank_threads": ready_threads(cold.outputs, 2), "timeline": timeline_of(cold.outputs.parent)}


def warm_step(emu: Emulator, root: Path, name: str, script: str, threads: dict[str, str], repeat: int) -> dict:
    """1. Nodes are up (idle) from the cold run."""
    job = write_job(root, name, script, 2)
    emu_times: list[float] = []
    bare_times: list[float] = []
    user_times: list[float] = []
    for _ in range(repeat):  # alternated: this machine's speed drifts (its page cache refilled after other work)
        emu_times.append(emulated(emu, job, 2))
        bare_times.append(bare_mpirun(script, root, threads))
        user_times.append(bare_mpirun(script, root, {}))
    e, b, u = (statistics.median(t) for t in (emu_times, bare_times, user_times))
    last = emu.runs()[-1]  # the newest
    return {"emulator_s": round(e, 3), "bare_mpirun_s": round(b, 3), "ratio": round(e / b, 2),
            "overhead_s": round(e - b, 3), "bare_mpirun_no_thread_vars_s": round(u, 3),
            "ratio_vs_no_thread_vars": round(e / u, 2), "timeline": timeline_of(last.outputs.parent)}


def mnist_step(emu: Emulator, root: Path, threads: dict[str, str], repeat: int) -> dict:
    """3. One epoch on the real data, both sides the same trainer, the runs of each round
    alternated (this machine's speed drifts)."""
    data = mnist.prepare().root
    job = REPO / "trainer" / "job.yml"
    baselines = {  # name -> (launcher, thread settings); the first is the ratio's baseline
        "bare_mpirun_same_options_same_threads": ("mpirun", threads),
        "bare_mpirun_same_options_same_threads_tcp_only": ("mpirun-tcp", threads),
        "bare_horovodrun_same_threads": ("horovodrun", threads),
        "bare_horovodrun_no_thread_vars": ("horovodrun", {}),
    }
    sps: dict[str, list[float]] = {"emulator": [], **{name: [] for name in baselines}}
    torch_threads: dict[str, int | None] = {}
    for i in range(repeat):
        run = emu.submit(job, overrides=[f"inputs.data_dir.path={data}", "inputs.epochs=1", "compute=bench"])
        if run.wait(timeout=900) is not RunStatus.COMPLETED:
            raise RuntimeError(f"MNIST run failed: {run.record.error}")
        summary = json.loads((run.outputs / "summary.json").read_text())
        sps["emulator"].append(summary["samples_per_second"])
        torch_threads["emulator"] = summary.get("threads", {}).get("torch")
        for name, (launcher, env) in baselines.items():
            summary = bare_mnist(launcher, data, root / f"bare-mnist-{name}-{i}", env)
            sps[name].append(summary["samples_per_second"])
            torch_threads[name] = summary.get("threads", {}).get("torch")
    medians = {name: statistics.median(values) for name, values in sps.items()}
    first = next(iter(baselines))
    # Per round too: the emulated run against the baseline runs beside it, so a drift in this
    # machine's speed between rounds cancels (the ratio of medians mixes rounds).
    pairs = {name: round(statistics.median(e / b for e, b in zip(sps["emulator"], sps[name])), 3) for name in baselines}
    return {**medians, "ratio": round(medians["emulator"] / medians[first], 3),
            **{f"ratio_vs_{name[5:]}": round(medians["emulator"] / medians[name], 3) for name in list(baselines)[1:]},
            "pair_ratio": pairs[first], **{f"pair_ratio_vs_{name[5:]}": pairs[name] for name in list(baselines)[1:]},
            "torch_threads_per_rank": torch_threads, "runs": sps}


def largest_step(emu: Emulator, root: Path, script: str, max_nodes: int, tag: str) -> dict:
    """4. The largest cluster: one rank per node, growing until it fails, is refused (its ranks
    cannot fit in this machine's memory: the submit says so, before anything is made) or reaches
    max_nodes; with the peak memory of a rank at each size (runs/memwatch.py)."""
    sizes = sorted({n for n in (2, 4, 8, 16, 32, 64, 128) if n < max_nodes} | {max_nodes})
    emu.create_compute(ClusterSpec(f"big-{tag}", "STANDARD_D2_V2", max_nodes=max_nodes, idle_seconds_before_scaledown=3600))
    done: dict[str, float] = {}
    rank_mib: dict[str, float] = {}
    for nodes in sizes:
        start = time.time()
        try:
            run = emu.submit(write_job(root, f"{tag}{nodes}", script, nodes, compute=f"big-{tag}"))
        except AmlEmuError as exc:
            return {"seconds_by_nodes": done, "rank_peak_mib_by_nodes": rank_mib, "refused": f"{nodes} nodes: {exc}"}
        if run.wait(timeout=600) is not RunStatus.COMPLETED:
            return {"seconds_by_nodes": done, "rank_peak_mib_by_nodes": rank_mib, "failure": f"{nodes} nodes: {run.record.error}"}
        done[str(nodes)] = round(time.time() - start, 1)
        figure = memwatch.recorded(emu.home.root, memwatch.figure_key(job_from_record(emu.store.run(run.id).job)))
        if figure is not None and figure.run_id == run.id:
            rank_mib[str(nodes)] = round(figure.bytes / 2**20, 1)
        print(f"   {tag}: {nodes} nodes in {done[str(nodes)]} s, a rank's peak {rank_mib.get(str(nodes))} MiB", flush=True)
    return {"seconds_by_nodes": done, "rank_peak_mib_by_nodes": rank_mib, "idle_node_memory_mib": idle_node_memory(emu)}


def idle_node_memory(emu: Emulator) -> float | None:
    if emu.default_backend != "docker":
        return None
    import docker  # noqa: PLC0415

    idle = docker.from_env().containers.list(filters={"label": f"amlemu.home={emu.home.id}"})
    usage = [c.stats(stream=False)["memory_stats"].get("usage", 0) for c in idle[:4]]
    return round(statistics.mean(usage) / 2**20, 2) if usage else None


def timeline_of(run_dir: Path) -> list[tuple[float, str]]:
    """The run's start, stage by stage (system_logs/timeline.txt)."""
    path = timeline.path_of(run_dir)
    return timeline.parse(path.read_text()) if path.is_file() else []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="docker", choices=list(BACKENDS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-nodes", type=int, default=16)
    parser.add_argument("--steps", default="cold,warm,mnist,largest", help="which steps, comma-separated (largest: both largest_mpi4py and largest_horovod)")
    parser.add_argument("--load", type=int, default=0, help="busy processes beside the benchmark (other work)")
    parser.add_argument("--container-load", type=int, default=0, help="busy containers beside it (other containers)")
    args = parser.parse_args()
    wanted = set(args.steps.split(","))
    if args.max_nodes > 100:  # above AmlCompute's default quota: raised as a user would raise it
        os.environ.setdefault("AMLEMU_MAX_INSTANCES", str(args.max_nodes))
    with bench_home("amlemu-bench-", args.backend) as (root, emu), background_load(args.load, args.container_load):
        steps = Steps(emu)
        steps.results.update(backend=args.backend, cpus=os.cpu_count(), background_busy_processes=args.load,
                             background_busy_containers=args.container_load, load_average=os.getloadavg())
        # Nodes share this machine's cores by max_nodes: the big clusters are separate ones.
        emu.create_compute(ClusterSpec("bench", "STANDARD_D2_V2", max_nodes=2, idle_seconds_before_scaledown=3600))
        trivial = READY.format(imports="", probe=THREAD_PROBE)
        heavy = READY.format(imports=TORCH, probe=THREAD_PROBE)
        cold = steps.run("cold", 600, lambda: cold_step(emu, root, trivial)) or {}
        threads = cold.get("emulated_rank_threads", {})
        if "warm" in wanted:
            for name, script in (("trivial", trivial), ("torch_horovod", heavy)):
                steps.run(f"warm_{name}", 900, functools.partial(warm_step, emu, root, name, script, threads,
                                                                args.repeat))
        if "mnist" in wanted:
            steps.run("mnist_samples_per_s", 3600, lambda: mnist_step(emu, root, threads, args.repeat))
        if wanted & {"largest", "largest_mpi4py"}:
            steps.run("largest_mpi4py", 1800, lambda: largest_step(emu, root, MPI4PY_ALLREDUCE, args.max_nodes, "mpi"))
        if wanted & {"largest", "largest_horovod"}:
            steps.run("largest_horovod", 1800, lambda: largest_step(emu, root, ALLREDUCE, args.max_nodes, "hvd"))
        steps.results["load_average_after"] = os.getloadavg()
    return report(steps.results)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Stopped as stop:  # the home is removed by now (bench_home)
        print(f"stopped by {stop}; everything the benchmark made is removed", flush=True)
        sys.exit(143)
