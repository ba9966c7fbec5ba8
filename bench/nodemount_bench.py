"""A v2 ro_mount input through an emulated node (issue 32): the data runtime's mount against the
prefetch into the node cache (AMLEMU_DATA_PREFETCH), in one run. Not a test: figures are reported.

    .venv/bin/python bench/nodemount_bench.py [--backend process|docker] [--sizes 10,1000] [--repeats 2]

1. time from submit to the job's first byte of one file, against the input's size (files of 64 KiB):
   goal flat for the mount, as on AmlCompute (prefetch grows with the input); the mount with the
   default settings (local placeholders) and through FUSE (AMLEMU_DATASET_MOUNT_PLACEHOLDERS=false);
2. disk used on the node by a job that reads 1% of its input (1 file of 100 x 1 MiB): the mount's
   peak cache (its log) against the prefetched cache.
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common import bench_home, report  # noqa: E402 - bench/common.py

from amlemu.specs import RunStatus  # noqa: E402
from amlemu.storage.datastores import DEFAULT  # noqa: E402

WS = f"azureml://datastores/{DEFAULT}/paths"
FIRST_BYTE = """
import os, sys, time
folder = sys.argv[1]
first = sorted(os.listdir(folder))[0]
open(os.path.join(folder, first), "rb").read(1)
print("first byte at", time.time(), flush=True)
"""


MODES = {"mount": "", "fuse": "environment_variables:\n  AMLEMU_DATASET_MOUNT_PLACEHOLDERS: 'false'\n",
         "prefetch": "environment_variables:\n  AMLEMU_DATA_PREFETCH: 'true'\n"}


def job(work: Path, name: str, path: str, mode: str) -> Path:
    folder = work / "jobs" / name
    (folder / "src").mkdir(parents=True, exist_ok=True)
    (folder / "src" / "read.py").write_text(FIRST_BYTE)
    env = MODES[mode]
    (folder / "job.yml").write_text(f"code: src\ncommand: python read.py ${{{{inputs.d}}}}\ncompute: azureml:c1\n"
                                    f"experiment_name: bench\nresources:\n  instance_count: 1\n"
                                    f"inputs:\n  d: {{path: {WS}/{path}, mode: ro_mount}}\n{env}")
    return folder / "job.yml"


def run_once(emu, spec: Path) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    started = time.time()
    run = emu.submit(spec)
    if run.wait(timeout=600) is not RunStatus.COMPLETED:
        raise RuntimeError(f"{run.id}: {run.record.error}")
    at = float(re.search(r"first byte at (\S+)", run.logs()).group(1))
    return at - started, run


def disk_used(emu, run, prefetch: bool) -> int:  # type: ignore[no-untyped-def]
    if prefetch:
        cache = emu.home.cache_dir("c1", "c1-node-0") / "data" / DEFAULT / "hundred"  # the cache also holds the other sets
        return sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
    log = (run.dir / "system_logs" / "data_capability" / "c1-node-0" / "data-capability.log").read_text()
    return int(re.findall(r"peak cache (\d+) bytes", log)[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="process")
    parser.add_argument("--sizes", default="10,1000")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    results: dict[str, object] = {"backend": args.backend}
    with bench_home("amlemu-nodemount-", args.backend) as (work, emu):
        from amlemu.specs import ClusterSpec  # noqa: PLC0415

        emu.create_compute(ClusterSpec("c1", "STANDARD_D2_V2", max_nodes=1, idle_seconds_before_scaledown=600))
        fs, root = emu.datastores.filesystem(DEFAULT)
        ttfb: dict[str, dict[str, float]] = {}
        for n in [int(s) for s in args.sizes.split(",")]:
            fs.pipe({f"{root}/set{n}/f{i:05d}.bin": b"x" * 65536 for i in range(n)})
            for mode in MODES:  # alternated, each on the same warm node
                spec = job(work, f"{mode}{n}", f"set{n}", mode)
                times = [run_once(emu, spec)[0] for _ in range(args.repeats)]
                ttfb.setdefault(f"{n} files of 64 KiB", {})[mode] = round(statistics.median(times), 2)
        results["submit to first byte (s)"] = ttfb
        fs.pipe({f"{root}/hundred/f{i:03d}.bin": b"y" * (1 << 20) for i in range(100)})
        used = {}
        for mode in ("mount", "prefetch"):
            _, run = run_once(emu, job(work, f"one{mode}", "hundred", mode))
            used[mode] = round(disk_used(emu, run, mode == "prefetch") / (1 << 20), 1)
        results["disk used reading 1 of 100 x 1 MiB files (MiB)"] = used
    return report(results)


if __name__ == "__main__":
    sys.exit(main())
