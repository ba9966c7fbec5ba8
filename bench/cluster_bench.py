"""The emulated cluster against the obvious baseline (bare mpirun / horovodrun on this machine),
measured in one run, printed as ratios. Not a test: goals are targets, the figures are reported.

    .venv/bin/python bench/cluster_bench.py [--backend docker|process] [--max-nodes 16]

1. warm submit -> all ranks running (2 nodes x 1 rank, nodes already up), for a script that
   imports torch + horovod (ratio to bare `mpirun -np 2`, goal <= 1.2x) and for a trivial script
   (absolute overhead over bare mpirun, goal <= 0.3 s);
2. cold: cluster from zero nodes to all ranks running (goal <= 3 s on docker);
3. Horovod MNIST samples/s on the emulator vs bare `horovodrun -np 2` (goal >= 0.95x);
4. the largest cluster (up to --max-nodes) that runs a 1-rank-per-node Horovod allreduce here, and
   the memory an idle node holds.
"""
from __future__ import annotations

import argparse
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

from common import bench_home, report  # noqa: E402 - bench/common.py

from emulator.api import Emulator  # noqa: E402
from emulator.backends import BACKENDS  # noqa: E402
from emulator.runs.mpi import MpiLaunch, mpirun_argv  # noqa: E402
from emulator.specs import ClusterSpec, RunStatus  # noqa: E402
from fixtures import mnist  # noqa: E402

# Each rank writes the wall-clock time at which it was running (after its imports) to a shared file.
READY = """
import os, sys, time
{imports}
rank = os.environ["OMPI_COMM_WORLD_RANK"]
out = os.environ.get("BENCH_OUT") or "outputs"  # an emulated rank: collected into the run's outputs
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, f"ready-{{rank}}"), "w") as fh:
    fh.write(repr(time.time()))
"""
TORCH = "import torch, horovod.torch as hvd\nhvd.init()"
ALLREDUCE = """
import os, time, torch, horovod.torch as hvd
hvd.init()
total = hvd.allreduce(torch.ones(1000), op=hvd.Sum)
assert int(total[0]) == hvd.size(), total
print(f"allreduce over {hvd.size()} ranks ok", flush=True)
"""


def ready_time(folder: Path, ranks: int) -> float:
    stamps = [float((folder / f"ready-{r}").read_text()) for r in range(ranks)]
    return max(stamps)


def bare_mpirun(script: str, folder: Path) -> float:
    """Seconds from starting `mpirun -np 2 python script` to both ranks running."""
    path = folder / "bare.py"
    path.write_text(script)
    launch = MpiLaunch(program=[sys.executable, str(path)], nprocs=2, as_root=os.geteuid() == 0)
    for stale in folder.glob("ready-*"):
        stale.unlink()
    start = time.time()
    subprocess.run(mpirun_argv(launch), check=True, env={**os.environ, "BENCH_OUT": str(folder)},
                   stdout=subprocess.DEVNULL)
    return ready_time(folder, 2) - start


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="docker", choices=list(BACKENDS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-nodes", type=int, default=16)
    args = parser.parse_args()
    results: dict[str, object] = {"backend": args.backend, "cpus": os.cpu_count()}
    with bench_home("amlemu-bench-", args.backend) as (root, emu):
        # Nodes share this machine's cores by max_nodes: the big cluster is a separate one.
        emu.create_compute(ClusterSpec("bench", "STANDARD_D2_V2", max_nodes=2, idle_seconds_before_scaledown=3600))
        emu.create_compute(ClusterSpec("big", "STANDARD_D2_V2", max_nodes=args.max_nodes,
                                       idle_seconds_before_scaledown=3600))
        trivial, heavy = READY.format(imports=""), READY.format(imports=TORCH)

        # 2. cold first: the cluster has no node yet.
        results["cold_zero_to_running_s"] = round(emulated(emu, write_job(root, "cold", trivial, 2), 2), 3)

        # 1. warm: nodes are up (idle) from the cold run.
        for name, script in (("trivial", trivial), ("torch_horovod", heavy)):
            job = write_job(root, name, script, 2)
            emu_times = [emulated(emu, job, 2) for _ in range(args.repeat)]
            bare_times = [bare_mpirun(script, root) for _ in range(args.repeat)]
            e, b = statistics.median(emu_times), statistics.median(bare_times)
            results[f"warm_{name}"] = {"emulator_s": round(e, 3), "bare_mpirun_s": round(b, 3),
                                       "ratio": round(e / b, 2), "overhead_s": round(e - b, 3)}

        # 3. MNIST throughput, one epoch on the real data, both sides the same trainer.
        data = mnist.prepare().root
        job = REPO / "trainer" / "job.yml"
        run = emu.submit(job, overrides=[f"inputs.data_dir.path={data}", "inputs.epochs=1", "compute=bench"])
        if run.wait(timeout=900) is not RunStatus.COMPLETED:
            raise RuntimeError(f"MNIST run failed: {run.record.error}")
        emu_sps = json.loads((run.outputs / "summary.json").read_text())["samples_per_second"]
        bare_dir = root / "bare-mnist"
        bare_dir.mkdir()
        horovodrun = str(Path(sys.executable).with_name("horovodrun"))
        subprocess.run([horovodrun, "-np", "2", "-H", "localhost:2", sys.executable,
                        str(REPO / "trainer" / "train.py"), "--data-dir", str(data), "--epochs", "1"],
                       cwd=bare_dir, check=True, stdout=subprocess.DEVNULL,
                       env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{bare_dir / 'm.db'}"})
        bare_sps = json.loads((bare_dir / "outputs" / "summary.json").read_text())["samples_per_second"]
        results["mnist_samples_per_s"] = {"emulator": emu_sps, "bare_horovodrun": bare_sps,
                                          "ratio": round(emu_sps / bare_sps, 3)}

        # 4. the largest cluster: one Horovod rank per node, growing until it fails or reaches max.
        largest, took = 0, None
        for nodes in sorted({2, 4, 8, args.max_nodes}):
            if nodes > args.max_nodes:
                continue
            start = time.time()
            run = emu.submit(write_job(root, f"allreduce{nodes}", ALLREDUCE, nodes, compute="big"))
            if run.wait(timeout=600) is not RunStatus.COMPLETED:
                results["largest_failure"] = f"{nodes} nodes: {run.record.error}"
                break
            largest, took = nodes, round(time.time() - start, 1)
        results["largest_cluster"] = {"nodes": largest, "seconds": took}
        if args.backend == "docker":
            import docker  # noqa: PLC0415

            client = docker.from_env()
            idle = client.containers.list(filters={"label": f"amlemu.home={emu.home.id}"})
            usage = [c.stats(stream=False)["memory_stats"].get("usage", 0) for c in idle[:4]]
            results["idle_node_memory_mib"] = round(statistics.mean(usage) / 2**20, 2) if usage else None
    return report(results)


if __name__ == "__main__":
    sys.exit(main())
