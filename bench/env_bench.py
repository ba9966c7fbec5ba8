"""Job environments (amlemu.envs): what building one costs, and what a cached one adds to a job's
start. Not a test: the goal is a target, the figures are reported.

    .venv/bin/python bench/env_bench.py [--backend process|docker] [--find-links /opt/pypi/files]
        [--packages "flask requests"] [--module flask] [--repeat 3]

1. submit -> Running of a one-process job on a node already up: with no environment (the
   baseline), with an environment built cold (an empty cache) and warm (found in the cache);
   goal: warm adds <= 1 s to the baseline;
2. a cold build of the same packages into a fresh environment, from the same local wheel folder
   (no index, no network): uv (`uv venv` + `uv pip install`, an empty uv cache) against pip
   (`python -m venv` + `pip install`, --no-cache-dir), alternated, each --repeat times; uv again
   with --compile-bytecode, which pip does by default.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common import bench_home, report  # noqa: E402 - bench/common.py

from amlemu.envs.build import uv_binary  # noqa: E402
from amlemu.specs import ClusterSpec, RunStatus  # noqa: E402

SCRIPT = "import {module}\nprint('imported {module}', flush=True)\n"


def _submit_to_running(emu, work: Path, packages: list[str] | None, tag: str,  # type: ignore[no-untyped-def]
                       module: str = "json") -> float:
    """Seconds from the submit (Queued) to Running of a job importing `module`."""
    folder = work / f"job-{tag}"
    (folder / "src").mkdir(parents=True)
    (folder / "src" / "main.py").write_text(SCRIPT.format(module=module))
    job = f"code: src\ncommand: python main.py\ncompute: azureml:envs\nexperiment_name: envbench\n"
    if packages is not None:
        (folder / "conda.yml").write_text("dependencies:\n  - python=3.11\n  - pip:\n"
                                          + "".join(f"    - {p}\n" for p in packages))
        job += "environment:\n  image: amlemu-bench/absent:1\n  conda_file: conda.yml\n"
    (folder / "job.yml").write_text(job)
    run = emu.submit(folder / "job.yml")
    status = run.wait(timeout=600)
    if status is not RunStatus.COMPLETED:
        raise RuntimeError(f"{tag}: {status.value}: {run.record.error}")
    events = {s: ts for ts, s, _ in run.events()}
    return events[RunStatus.RUNNING] - events[RunStatus.QUEUED]


def start_overhead(backend: str, packages: list[str], find_links: str, repeat: int, module: str) -> dict[str, object]:
    with bench_home("amlemu-envbench-", backend) as (work, emu):
        os.environ["AMLEMU_FIND_LINKS"] = find_links
        emu.create_compute(ClusterSpec("envs", "STANDARD_D2_V2", min_nodes=1, max_nodes=1))
        none, cold, warm = [], [], []
        for i in range(repeat):
            os.environ["AMLEMU_ENV_CACHE"] = str(work / f"envs-{i}")  # empty: a cold build
            none.append(_submit_to_running(emu, work, None, f"none-{i}"))
            cold.append(_submit_to_running(emu, work, packages, f"cold-{i}", module))
            warm.append(_submit_to_running(emu, work, packages, f"warm-{i}", module))
        med = {k: statistics.median(v) for k, v in (("none", none), ("cold", cold), ("warm", warm))}
        return {"backend": backend, "packages": packages, "submit_to_running_s": {"no environment": none,
                "environment, cold": cold, "environment, warm": warm},
                "warm_overhead_s (median, goal <= 1.0)": round(med["warm"] - med["none"], 3),
                "cold_overhead_s (median)": round(med["cold"] - med["none"], 3)}


def _timed(argv_list: list[list[str]], env: dict[str, str]) -> float:
    started = time.perf_counter()
    for argv in argv_list:
        subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def uv_vs_pip(packages: list[str], find_links: str, repeat: int) -> dict[str, object]:
    python, uv = getattr(sys, "_base_executable", sys.executable), uv_binary()
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "UV_NO_CONFIG": "1", "PIP_CONFIG_FILE": os.devnull,
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    times: dict[str, list[float]] = {"uv": [], "uv --compile-bytecode": [], "pip": []}
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="amlemu-uvpip-") as tmp:
            t = Path(tmp)
            for kind in times:
                venv, cache = t / kind.replace(" ", ""), t / f"cache-{kind.replace(' ', '')}"
                if kind == "pip":
                    steps = [[python, "-m", "venv", str(venv)],
                             [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-cache-dir", "--no-index",
                              "--find-links", find_links, *packages]]
                else:
                    steps = [[uv, "venv", "--python", python, str(venv)],
                             [uv, "pip", "install", "--python", str(venv / "bin" / "python"), "--cache-dir", str(cache),
                              "--no-index", "--find-links", find_links, *kind.split()[1:], *packages]]
                times[kind].append(round(_timed(steps, env), 2))
                shutil.rmtree(venv)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"packages": packages, "find_links": find_links, "cold_build_s": times,
            "pip / uv (median)": round(med["pip"] / med["uv"], 1),
            "pip / uv --compile-bytecode (median)": round(med["pip"] / med["uv --compile-bytecode"], 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="process")
    parser.add_argument("--find-links", default="/opt/pypi/files", help="a folder of wheels (no index is used)")
    parser.add_argument("--packages", default="flask requests", help="what the environment declares")
    parser.add_argument("--module", default=None, help="what the job imports (default: the first package's name)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    packages = args.packages.split()
    module = args.module or packages[0].split("=")[0].replace("-", "_")
    return report({"start": start_overhead(args.backend, packages, args.find_links, args.repeat, module),
                   "uv_vs_pip": uv_vs_pip(packages, args.find_links, args.repeat)})


if __name__ == "__main__":
    sys.exit(main())
