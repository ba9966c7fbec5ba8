"""The checks of scripts/gpu_check.sh that need the emulator or Horovod (run with the venv's python,
after the script installed the CUDA torch and the NCCL Horovod). Each prints one line and exits 0
(ok) or 1 (failed); the shell script times them and prints the report.

    python scripts/gpu_check.py nodes [docker|process]  # (a) the seed's job on emulated nodes with GPUs
    python scripts/gpu_check.py nccl    # (b) a Horovod allreduce over NCCL on the GPU(s)
    python scripts/gpu_check.py nccl-shared  # (info) 2 ranks on one GPU: what NCCL says

On one GPU, 2 nodes x 1 GPU each cannot be had: the emulator then deals GPU 0 to both nodes
(emulator/cluster/gpus.py: round robin), so (a) checks that each rank of 2 nodes sees exactly one
GPU, the machine's only one, and trains the seed's job on 1 node; and (b) runs 1 rank, which still
runs Horovod's NCCL allreduce kernels (a 1-rank communicator) but no transfer between GPUs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Each rank of the probe job writes what CUDA shows it into the run's outputs.
PROBE = """
import json, os, socket, torch
rank = os.environ["OMPI_COMM_WORLD_RANK"]
props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
seen = {"rank": int(rank), "host": socket.gethostname(), "count": len(props),
        "uuids": [str(getattr(p, "uuid", "")) for p in props], "names": [p.name for p in props],
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
os.makedirs("outputs", exist_ok=True)
json.dump(seen, open(f"outputs/gpu-{rank}.json", "w"))
print(json.dumps(seen), flush=True)
"""

# One Horovod allreduce of a CUDA tensor; the timeline says which implementation ran it.
ALLREDUCE = """
import os, torch, horovod.torch as hvd
hvd.init()
torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
x = torch.full((1 << 20,), float(hvd.rank() + 1), device="cuda")
total = hvd.allreduce(x, op=hvd.Sum, name="gpucheck")
torch.cuda.synchronize()
want = hvd.size() * (hvd.size() + 1) / 2
assert total.is_cuda and float(total[0]) == want and float(total[-1]) == want, (float(total[0]), want)
print(f"rank {hvd.rank()}/{hvd.size()} allreduce ok on {torch.cuda.get_device_name()}", flush=True)
hvd.shutdown()
"""


@dataclass(frozen=True)
class Layout:
    """One emulated cluster shape the node check runs, and what it shows."""

    nodes: int
    train: bool  # the seed's job trains on it (else: only the GPU probe)
    note: str = ""


def node_layouts(gpus: int) -> list[Layout]:
    """What check (a) runs with this many GPUs. Pure."""
    if gpus >= 2:
        return [Layout(2, train=True)]
    return [Layout(2, train=False, note="1 GPU here: both nodes are dealt GPU 0 (shared), so no 2-node training "
                                         "(NCCL refuses two ranks on one GPU)"),
            Layout(1, train=True, note="the seed's job on 1 node x 1 GPU")]


def normalise_uuid(text: str) -> str:
    return text.strip().lower().removeprefix("gpu-")


def host_gpus() -> list[tuple[str, str]]:
    """(nvidia-smi index, uuid) of the GPUs this process may use (as the emulator deals them)."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    pairs = [tuple(part.strip() for part in line.split(",", 1)) for line in out.splitlines() if line.strip()]
    allowed = os.environ.get("CUDA_VISIBLE_DEVICES")
    return [(i, u) for i, u in pairs if allowed is None or i in allowed.split(",")]


def probe_problems(seen: list[dict], expected_uuids: list[str]) -> list[str]:
    """What is wrong with the ranks' view of their GPUs (rank r runs on node r). Pure."""
    problems = []
    for rank, want in enumerate(expected_uuids):
        mine = next((s for s in seen if s["rank"] == rank), None)
        if mine is None:
            problems.append(f"rank {rank} wrote no report")
        elif mine["count"] != 1:
            problems.append(f"rank {rank} sees {mine['count']} GPUs, not its 1")
        elif mine["uuids"][0] and normalise_uuid(mine["uuids"][0]) != normalise_uuid(want):
            problems.append(f"rank {rank} sees GPU {mine['uuids'][0]}, not its own {want}")
    return problems


def timeline_ops(timeline: str) -> set[str]:
    """The activity names in a Horovod timeline (a JSON array, possibly unterminated). Pure."""
    text = timeline.strip().rstrip(",")
    if text and not text.endswith("]"):
        text += "]"
    try:
        events = json.loads(text or "[]")
    except json.JSONDecodeError:
        return set()
    return {e["name"] for e in events if isinstance(e, dict) and e.get("ph") == "B" and "name" in e}


def failure_logs(run_dir: Path, keep: Path | None, lines: int = 15) -> str:
    """A failed run's logs: the last lines of each (what mpirun and the platform said, where a
    rank wrote nothing), and the logs copied under `keep` when given (the device machine's
    output folder: the temporary home goes with the check)."""
    said = []
    for log in sorted([*run_dir.glob("system_logs/*"), *run_dir.glob("user_logs/*.txt")]):
        tail = log.read_text(errors="replace").strip().splitlines()[-lines:]
        if tail and log.suffix == ".txt":  # launch.json (the launch's argv and variables) is kept only
            said.append(f"--- {log.relative_to(run_dir)}\n" + "\n".join(tail))
        if keep is not None:
            dest = keep / run_dir.name / log.relative_to(run_dir)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(log.read_bytes())
    return "\n".join(said)


def _keep() -> Path | None:
    return Path(os.environ["AMLEMU_GPU_CHECK_LOGS"]) if os.environ.get("AMLEMU_GPU_CHECK_LOGS") else None


def _job(folder: Path, compute: str, nodes: int) -> Path:
    (folder / "src").mkdir(parents=True, exist_ok=True)
    (folder / "src" / "probe.py").write_text(PROBE)
    job = folder / "probe.yml"
    job.write_text(textwrap.dedent(f"""\
        code: src
        command: python probe.py
        compute: azureml:{compute}
        distribution: {{type: mpi, process_count_per_instance: 1}}
        resources: {{instance_count: {nodes}}}
        """))
    return job


def env_pins(conda_yaml: str) -> dict[str, str]:
    """name -> version of the `name==version` and `name=version` pins of a conda file. Pure."""
    pins = {}
    for line in conda_yaml.splitlines():
        item = line.split("#", 1)[0].strip().removeprefix("- ").strip()
        name, sep, version = item.replace("==", "=").partition("=")
        if sep and name and version and " " not in name:
            pins[name.strip()] = version.strip()
    return pins


def seed_job(folder: Path, host: dict[str, str]) -> tuple[Path, str]:
    """The seed's job as it is when this machine has the versions its environment pins, else a copy
    that runs in the emulator's own environment (this machine's python, torch and Horovod: a GPU
    image's own CUDA torch, which no package index serves there), and what was changed.
    `host`: name -> this machine's version."""
    import yaml  # noqa: PLC0415 - the project's dependency; this script's pure parts import nothing

    wanted = env_pins((REPO / "trainer" / "environment.yml").read_text())
    differ = {name: (wanted[name], host[name]) for name in ("python", "torch", "torchvision")
              if name in wanted and not host[name].startswith(wanted[name])}
    if not differ:
        return REPO / "trainer" / "job.yml", ""
    job = yaml.safe_load((REPO / "trainer" / "job.yml").read_text())
    job.pop("environment")
    job["code"] = str(REPO / "trainer")
    (folder / "job.yml").write_text(yaml.safe_dump(job, sort_keys=False))
    return folder / "job.yml", "in this machine's environment: " + ", ".join(
        f"{n} {h} (not {w})" for n, (w, h) in differ.items())


def host_versions() -> dict[str, str]:
    from importlib.metadata import version  # noqa: PLC0415

    return {"python": ".".join(map(str, sys.version_info[:2])), "torch": version("torch").split("+")[0],
            "torchvision": version("torchvision").split("+")[0]}


def check_nodes(backend: str = "docker") -> tuple[bool, str]:
    sys.path.insert(0, str(REPO))
    from amlemu.api import Emulator  # noqa: PLC0415
    from amlemu.cluster import gpus as gpu_list  # noqa: PLC0415
    from amlemu.specs import ClusterSpec, RunStatus  # noqa: PLC0415
    from pytest_amlemu import mnist  # noqa: PLC0415

    uuids = dict(host_gpus())
    visible = tuple(uuids)
    said, ok = [], True
    with tempfile.TemporaryDirectory(prefix="amlemu-gpucheck-") as tmp:
        emu = Emulator(home=Path(tmp) / "home", backend=backend)
        try:
            # 1 GPU per node (the V100 size: the seed's NC6 had 1 K80); nodes stay up between runs.
            emu.create_compute(ClusterSpec("gpucheck", "Standard_NC6s_v3", max_nodes=2,
                                           idle_seconds_before_scaledown=600))
            for layout in node_layouts(len(visible)):
                run = emu.submit(_job(Path(tmp) / f"probe{layout.nodes}", "gpucheck", layout.nodes))
                status = run.wait(timeout=300)
                seen = [json.loads(p.read_text()) for p in sorted(run.outputs.glob("gpu-*.json"))]
                expected = [uuids[gpu_list.assign(visible, n, 1)[0]] for n in range(layout.nodes)]
                problems = ([] if status is RunStatus.COMPLETED else [f"probe run {status.value}: {run.record.error}"])
                problems += probe_problems(seen, expected)
                gpus_seen = ", ".join(f"rank {s['rank']}@{s['host']}: {normalise_uuid(s['uuids'][0])[:8] if s['uuids'] else '-'}"
                                      for s in seen)
                said.append(f"{layout.nodes} node(s): {gpus_seen or 'no report'}"
                            + (f" [{layout.note}]" if layout.note and not layout.train else ""))
                if problems:
                    ok = False
                    said.append("; ".join(problems))
                    print(failure_logs(run.dir, _keep()), file=sys.stderr, flush=True)
                    continue
                if layout.train:
                    data = mnist.prepare().root
                    job, changed = seed_job(Path(tmp), host_versions())
                    # The data runtime's FUSE mount where this machine has FUSE, else a download.
                    mode = "ro_mount" if Path("/dev/fuse").exists() else "download"
                    said += [f"seed job: {changed}"] if changed else []
                    run = emu.submit(job, overrides=[
                        f"inputs.data_dir.path={data}", f"inputs.data_dir.mode={mode}", "inputs.epochs=1",
                        "compute=gpucheck", f"resources.instance_count={layout.nodes}"])
                    status = run.wait(timeout=600)
                    summary_file = run.outputs / "summary.json"
                    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
                    trained = (status is RunStatus.COMPLETED and summary.get("device") == "cuda"
                               and summary.get("params_in_sync") and (summary.get("test_accuracy") or 0) >= 0.9)
                    ok = ok and bool(trained)
                    if not trained:
                        print(failure_logs(run.dir, _keep()), file=sys.stderr, flush=True)
                    last = (run.logs(0).strip().splitlines() or [""])[-1][-200:]
                    said.append(f"seed job on {layout.nodes} node(s): {status.value}, device {summary.get('device')}, "
                                f"accuracy {summary.get('test_accuracy', 0):.4f}, "
                                f"{summary.get('samples_per_second')} samples/s"
                                + ("" if trained else f" ({run.record.error or last})"))
        finally:
            emu.cleanup()
    return ok, "; ".join(said)


def check_nccl(ranks: int | None = None) -> tuple[bool, str]:
    """Horovod allreduce of a CUDA tensor under mpirun on this machine, one rank per GPU (at most 2),
    or `ranks`; ok when the result is right and the timeline shows NCCL_ALLREDUCE."""
    import horovod.torch as hvd  # noqa: PLC0415

    if not hvd.nccl_built():
        return False, "this Horovod was built without NCCL (hvd.nccl_built() is False)"
    ranks = ranks or min(2, len(host_gpus()))
    with tempfile.TemporaryDirectory(prefix="amlemu-nccl-") as tmp:
        script, timeline = Path(tmp) / "allreduce.py", Path(tmp) / "timeline.json"
        script.write_text(ALLREDUCE)
        argv = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none", "-x", "HOROVOD_TIMELINE",
                "-x", "NCCL_DEBUG", sys.executable, str(script)]
        if os.geteuid() == 0:
            argv.insert(1, "--allow-run-as-root")
        env = {**os.environ, "HOROVOD_TIMELINE": str(timeline), "NCCL_DEBUG": "INFO"}
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env)
        except subprocess.TimeoutExpired:
            return False, f"{ranks} rank(s): no answer within 180 s"
        output = done.stdout + done.stderr
        evidence = nccl_evidence(timeline.read_text() if timeline.exists() else "", output)
        if done.returncode != 0:
            errors = [line for line in output.splitlines() if "NCCL WARN" in line or "Error" in line]
            tail = " | ".join((errors or output.strip().splitlines())[-2:])
            return False, f"{ranks} rank(s): exit {done.returncode}: {tail}"
        if not evidence:
            return False, f"{ranks} rank(s): the sum was right, but neither the timeline nor NCCL's log shows NCCL"
        what = "across 2 GPUs" if ranks > 1 else "1 rank: NCCL's allreduce kernel on the GPU, no GPU-to-GPU transfer"
        return True, f"{ranks} rank(s), {what}; evidence: {', '.join(evidence)}"


def nccl_evidence(timeline: str, output: str) -> list[str]:
    """What shows that Horovod's allreduce ran on NCCL: its timeline's NCCL_ALLREDUCE activity,
    NCCL's own log of a communicator set up (NCCL_DEBUG=INFO). Pure."""
    found = []
    if "NCCL_ALLREDUCE" in timeline_ops(timeline):
        found.append("timeline NCCL_ALLREDUCE")
    if any("NCCL INFO" in line and "Init COMPLETE" in line for line in output.splitlines()):
        found.append("NCCL communicator initialised")
    return found


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    what = args[0] if args else ""
    if what == "nodes":
        ok, line = check_nodes(args[1] if len(args) > 1 else "docker")
    elif what == "nccl":
        ok, line = check_nccl()
    elif what == "nccl-shared":  # informational: the shell script never fails on it
        ok, line = check_nccl(ranks=2)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
