"""Submitting through `amlemu serve` vs `amlemu job create`: the same job, from the command a user
runs to all its ranks running.

    .venv/bin/python bench/service_submit_bench.py [--repeat 3] [--backend docker|process]

A 2 nodes x 2 processes MPI job whose ranks each print a line and then sleep, on a compute whose
2 nodes are already up (min_instances 2: node creation is the same in both paths and is not what
is compared). Each submission is its own process, as a user's would be: `python submit.py`
(azure-ai-ml's `MLClient.from_config` + `jobs.create_or_update(command(...))`, pointed at the
service by the variables `amlemu env` prints) or `amlemu job create -f job.yml` for the same job.
The clock runs from starting that process until every rank's line is in its log; then the job is
canceled. For the service path it is also read from the moment azure-ai-ml is imported (the
import alone takes seconds, on Azure too). Paths alternate; medians and ratios (service / CLI).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = """\
import os, time
rank = os.environ.get("OMPI_COMM_WORLD_RANK", "?")
print(f"rank {rank} running", flush=True)
time.sleep(120)
"""
SUBMIT = """\
import time
from azure.ai.ml import MLClient, MpiDistribution, command
from azure.identity import DefaultAzureCredential
print("imported", time.time(), flush=True)
ml_client = MLClient.from_config(credential=DefaultAzureCredential())
job = command(code="src", command="python ranks.py", environment="AzureML-sklearn-1.5@latest", compute="bench",
              instance_count=2, distribution=MpiDistribution(process_count_per_instance=2), experiment_name="bench")
print(ml_client.jobs.create_or_update(job).name)
"""
JOB = """\
command: python ranks.py
code: src
compute: azureml:bench
environment: azureml:AzureML-sklearn-1.5
experiment_name: bench
resources: {instance_count: 2}
distribution: {type: mpi, process_count_per_instance: 2}
"""


def amlemu(home: Path, *args: str, cwd: Path | None = None) -> str:
    done = subprocess.run([sys.executable, "-m", "amlemu", "--home", str(home), *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd, check=True)
    return done.stdout


def wait_ranks(home: Path, started: float, before: set[str]) -> tuple[str, float]:
    """The run that appeared after `before`, and when (time.time()) all 4 ranks had printed their line."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        runs = {p.name for p in (home / "runs").iterdir()} - before if (home / "runs").exists() else set()
        for run in runs:
            logs = [home / "runs" / run / "user_logs" / f"std_log_process_{i}.txt" for i in range(4)]
            if all(p.exists() and "running" in p.read_text(errors="replace") for p in logs):
                return run, time.time()
        time.sleep(0.02)
    raise SystemExit("the ranks did not start within 300 s")


def one(home: Path, work: Path, kind: str, env: dict[str, str]) -> tuple[float, float | None]:
    """(seconds from the process's start, seconds from azure-ai-ml imported: service only)."""
    before = {p.name for p in (home / "runs").iterdir()} if (home / "runs").exists() else set()
    started = time.time()
    if kind == "service":
        proc = subprocess.Popen([sys.executable, str(work / "submit.py")], cwd=work, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    else:
        proc = subprocess.Popen([sys.executable, "-m", "amlemu", "--home", str(home), "job", "create", "-f",
                                 str(work / "job.yml")], cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run, ready = wait_ranks(home, started, before)
    out, _ = proc.communicate(timeout=120)
    imported = next((float(line.split()[1]) for line in (out or "").splitlines() if line.startswith("imported")), None)
    amlemu(home, "job", "cancel", "-n", run)
    deadline = time.monotonic() + 120
    while json.loads(amlemu(home, "job", "show", "-n", run, "-o", "json"))["status"] not in ("Canceled", "Failed"):
        if time.monotonic() > deadline:
            raise SystemExit(f"{run} did not end after its cancel")
        time.sleep(0.2)
    return ready - started, None if imported is None else ready - imported


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backend", default="docker")
    args = parser.parse_args()
    os.environ["AMLEMU_BACKEND"] = args.backend
    with tempfile.TemporaryDirectory() as tmp:
        work, home = Path(tmp), Path(tmp) / "home"
        home.mkdir()
        (work / "src").mkdir()
        (work / "src" / "ranks.py").write_text(SCRIPT)
        (work / "job.yml").write_text(JOB)
        (work / "submit.py").write_text(SUBMIT)
        try:
            variables = json.loads(amlemu(home, "env", "--format", "json", "--port", "0"))
            amlemu(home, "workspace", "config", "--path", str(work / "config.json"))
            amlemu(home, "compute", "create", "-n", "bench", "--size", "STANDARD_D2_V2", "--min-instances", "2",
                   "--max-instances", "2", "--backend", args.backend)
            env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "PYTHONPATH") if k in os.environ} | variables
            times: dict[str, list[float]] = {"service": [], "cli": [], "after import": []}
            for i in range(args.repeat):
                for kind in (("service", "cli") if i % 2 == 0 else ("cli", "service")):
                    total, after = one(home, work, kind, env)
                    times[kind].append(total)
                    extra = ""
                    if after is not None:
                        times["after import"].append(after)
                        extra = f" ({after:.2f} s after `import azure.ai.ml`)"
                    print(f"{kind:8s} run {i + 1}: {total:.2f} s to all 4 ranks running{extra}", flush=True)
        finally:
            subprocess.run([sys.executable, "-m", "amlemu", "--home", str(home), "cleanup", "--yes"],
                           capture_output=True, timeout=300)
    service, cli = statistics.median(times["service"]), statistics.median(times["cli"])
    after = statistics.median(times["after import"])
    print(f"median: service {service:.2f} s ({after:.2f} s after the import), amlemu job create {cli:.2f} s; "
          f"ratio {service / cli:.2f}x ({after / cli:.2f}x after the import); {args.backend} backend, "
          f"{args.repeat} runs each")


if __name__ == "__main__":
    main()
