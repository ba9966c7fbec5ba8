"""Datastore mounts against the obvious baselines, measured in one run, printed as ratios.
Not a test: goals are targets, the figures are reported.

    .venv/bin/python bench/datastore_bench.py [--backend docker|process] [--files 1000] [--repeats 2]

1. warm read through the mount (the node's cache, read-only) vs the same files on the node's own
   disk (a `download` copy), read by the job on its node (goal >= 0.9x);
2. cold fill of a node cache from Azurite vs adlfs' own recursive download of the same files
   (goal >= 0.8x the throughput);
3. the seed's job (Horovod MNIST, 2 nodes) samples/s reading from the mount vs from a local
   folder copied onto the nodes (goal >= 0.95x).

Each ratio compares like with like, threads included: 1 reads both trees in the same process of
the same job; 2 runs both downloads in this process (the node cache fetches through the same
adlfs `get`); 3 runs the same job on the same emulated nodes both ways, so both sides' ranks have
the emulator's OMP_NUM_THREADS (reported, from the trainer's summary).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common import bench_home, report  # noqa: E402 - bench/common.py

from amlemu.api import Emulator  # noqa: E402
from amlemu.specs import ClusterSpec, RunStatus  # noqa: E402
from amlemu.storage.datastores import DEFAULT  # noqa: E402
from amlemu.storage.nodecache import CachePolicy, NodeCache, Source  # noqa: E402
from pytest_amlemu import mnist  # noqa: E402

WS = f"azureml://datastores/{DEFAULT}/paths"
READ = """
import json, os, sys, time
def read_all(root):
    total = 0
    for folder, _, files in os.walk(root, followlinks=True):
        for name in files:
            with open(os.path.join(folder, name), "rb") as fh:
                while chunk := fh.read(1 << 20):
                    total += len(chunk)
    return total
result = {}
for label, root in (("mount", sys.argv[1]), ("local", sys.argv[2])):
    read_all(root)  # warm: the first pass fills the page cache
    best = 0.0
    for _ in range(5):
        start = time.perf_counter()
        size = read_all(root)
        best = max(best, size / (time.perf_counter() - start))
    result[label] = {"bytes": size, "bytes_per_s": best}
os.makedirs("outputs", exist_ok=True)
json.dump(result, open("outputs/read.json", "w"))
"""


def dataset(folder: Path, files: int) -> Path:
    """`files` files of 60 KiB of random bytes in 10 folders: storage.md's 1000 files / 60 MB set."""
    for i in range(files):
        path = folder / f"part{i % 10}" / f"f{i:05}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(60 * 1024))
    return folder


def run_job(emu: Emulator, job: Path, overrides: list[str] | None = None):  # type: ignore[no-untyped-def]
    run = emu.submit(job, overrides=overrides)
    status = run.wait(timeout=900)
    if status is not RunStatus.COMPLETED:
        raise SystemExit(f"{job.name}: {status.value}: {run.record.error}")
    return run


def warm_read(emu: Emulator, work: Path) -> dict:
    (work / "reader").mkdir()
    (work / "reader" / "read.py").write_text(textwrap.dedent(READ))
    job = work / "reader.yml"
    job.write_text(f"code: reader\ncommand: python read.py ${{{{inputs.mounted}}}} ${{{{inputs.local}}}}\n"
                   f"compute: azureml:bench\ninputs:\n  mounted: {{path: {WS}/bench, mode: ro_mount}}\n"
                   f"  local: {{path: {WS}/bench, mode: download}}\n")
    result = json.loads((run_job(emu, job).outputs / "read.json").read_text())
    return {"mount_MB_per_s": round(result["mount"]["bytes_per_s"] / 1e6),
            "local_disk_MB_per_s": round(result["local"]["bytes_per_s"] / 1e6),
            "ratio": round(result["mount"]["bytes_per_s"] / result["local"]["bytes_per_s"], 2)}


def cold_fill(emu: Emulator, work: Path, repeats: int) -> dict:
    fs, container = emu.datastores.filesystem(DEFAULT)
    source = Source(DEFAULT, fs, container)
    ours, theirs = [], []
    for i in range(repeats):
        start = time.perf_counter()
        NodeCache(work / f"cold-{i}").sync(source, "bench", CachePolicy())
        ours.append(time.perf_counter() - start)
        start = time.perf_counter()
        fs.get(f"{container}/bench", str(work / f"direct-{i}"), recursive=True)
        theirs.append(time.perf_counter() - start)
    mount, direct = statistics.median(ours), statistics.median(theirs)
    return {"mount_fill_s": round(mount, 2), "adlfs_get_s": round(direct, 2), "ratio": round(direct / mount, 2)}


def seed_job(emu: Emulator, repeats: int) -> dict:
    root = mnist.prepare().root
    emu.datastores.upload(root, f"{WS}/mnist")
    job = REPO / "trainer" / "job.yml"
    local = ["compute=bench", f"inputs.data_dir.path={root}", "inputs.data_dir.mode=download"]
    mounted, copied, threads = [], [], {}
    for _ in range(repeats):  # alternated: this machine's speed drifts between runs
        for label, runs, overrides in (("mount", mounted, ["compute=bench"]), ("local", copied, local)):
            summary = json.loads((run_job(emu, job, overrides).outputs / "summary.json").read_text())
            runs.append(summary["samples_per_second"])
            threads[label] = summary.get("threads")
    mount, base = statistics.median(mounted), statistics.median(copied)
    return {"mount_samples_per_s": mount, "local_folder_samples_per_s": base, "ratio": round(mount / base, 3),
            "runs": {"mount": mounted, "local": copied}, "rank_threads": threads}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="docker")
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with bench_home("amlemu-dsbench-", args.backend) as (work, emu):
        emu.datastores.upload(dataset(work / "data", args.files), f"{WS}/bench")
        emu.create_compute(ClusterSpec("bench", "STANDARD_D2_V2", max_nodes=2, idle_seconds_before_scaledown=600))
        return report({"backend": args.backend, "files": args.files,
                       "warm_read_mount_vs_local_disk": warm_read(emu, work),
                       "cold_fill_vs_adlfs_download": cold_fill(emu, work, args.repeats),
                       "seed_job_mount_vs_local_folder": seed_job(emu, args.repeats)})


if __name__ == "__main__":
    sys.exit(main())
