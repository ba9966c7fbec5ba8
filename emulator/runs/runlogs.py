"""A run's logs as Azure ML lays them out (v2's user_logs/, or the v1 runtime's azureml-logs/ for runs
submitted with azureml-core), and the one sentence that says why a run failed."""
from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

TAG_SPLIT_RE = re.compile(r"\[\d+,(\d+)\]<(stdout|stderr)>:")
MPI_EXIT_RE = re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]\s*\n\s*Exit code:\s*(\d+)")
MPI_SIGNAL_RE = re.compile(r"rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")


LOG_FOLDERS = {"v2": "user_logs", "v1": "azureml-logs"}  # the processes' logs, per layout


def rank_log_name(rank: int, processes: int, layout: str = "v2") -> str:
    """Azure ML's name for a process's log: v2 (user_logs/) std_log.txt for a single-process job
    (one node, one process), std_log_process_<N>.txt for each of several (both SDKs' log patterns);
    the v1 runtime's (azureml-logs/) 70_driver_log.txt, or 70_driver_log_<N>.txt per MPI rank."""
    if layout == "v1":
        return "70_driver_log.txt" if processes == 1 else f"70_driver_log_{rank}.txt"
    return "std_log.txt" if processes == 1 else f"std_log_process_{rank}.txt"


def rank_log(run_dir: Path, rank: int) -> Path:
    """A rank's log in a run's record when the process count and layout are not at hand."""
    for folder, single, many in (("user_logs", "std_log.txt", f"std_log_process_{rank}.txt"),
                                 ("azureml-logs", "70_driver_log.txt", f"70_driver_log_{rank}.txt")):
        if rank == 0 and (run_dir / folder / single).exists():
            return run_dir / folder / single
        if (run_dir / folder / many).exists():
            return run_dir / folder / many
    return run_dir / "user_logs" / rank_log_name(rank, 2)


def log_files(run_dir: Path) -> list[str]:
    """The processes' and the v1 runtime's logs of a run, as its record names them (what a run's
    details list and v1's wait_for_completion streams)."""
    return sorted(f"{folder}/{p.name}" for folder in LOG_FOLDERS.values() if (run_dir / folder).is_dir()
                  for p in (run_dir / folder).glob("*.txt"))


class RunLogs:
    """The processes' logs (rank_log_name, in the job's layout), system_logs/ for the platform;
    mpirun's own output in system_logs/mpi_log.txt (v1: azureml-logs/70_mpi_log.txt)."""

    def __init__(self, run_dir: Path, processes: int, layout: str = "v2") -> None:
        self.user = run_dir / LOG_FOLDERS.get(layout, "user_logs")
        self.system = run_dir / "system_logs"
        self.user.mkdir(parents=True, exist_ok=True)
        self.system.mkdir(parents=True, exist_ok=True)
        self._files = {n: open(self.user / rank_log_name(n, processes, layout), "a", buffering=1)
                       for n in range(processes)}
        self.mpi_path = self.user / "70_mpi_log.txt" if layout == "v1" else self.system / "mpi_log.txt"
        self._mpi = open(self.mpi_path, "a", buffering=1)
        self._platform = open(self.system / "lifecycle.txt", "a", buffering=1)
        self.on_first_output: Callable[[], None] | None = None  # called once, at the job's first line
        self._first_lock = threading.Lock()

    def platform(self, line: str) -> None:
        self._platform.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")

    def pump(self, stream, tagged: bool, rank: int = 0) -> None:  # type: ignore[no-untyped-def]
        """Untagged: one process's output into its rank's file. Tagged: split mpirun's --tag-output
        stream into per-rank files. Open MPI tags each chunk a rank writes, not each line, so a line
        can hold several tags, and text before the first tag continues the previous chunk unless
        that chunk ended its line (then it is mpirun's own)."""
        current, open_chunk = None, False
        for line in stream:
            if self.on_first_output is not None:
                with self._first_lock:
                    first, self.on_first_output = self.on_first_output, None
                if first is not None:
                    first()
            if not tagged:
                self._files[rank].write(line)
                continue
            parts = TAG_SPLIT_RE.split(line)
            if parts[0]:
                target = self._files.get(current, self._mpi) if open_chunk else self._mpi
                target.write(parts[0])
                open_chunk = open_chunk and not parts[0].endswith("\n")
            for i in range(1, len(parts), 3):
                current, text = int(parts[i]), parts[i + 2]
                self._files.get(current, self._mpi).write(text)
                open_chunk = not text.endswith("\n")

    def close(self) -> None:
        for fh in [*self._files.values(), self._mpi, self._platform]:
            fh.close()


def tail(path: Path, lines: int = 10) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def _rank_failed(rank: int, what: str, layout: list, run_dir: Path) -> str:
    node = next((r.node for r in layout if r.rank == rank), "?")
    log = rank_log(run_dir, rank)
    return (f"rank {rank} on node {node} failed with {what}; the job was stopped on all nodes. "
            f"Last lines of {log.name}:\n{tail(log)}")


def failure_reason(mpi_log: str, layout: list, run_dir: Path, exit_code: int, lost: list[str],
                   killed: frozenset[str] = frozenset(), failed_rank: int | None = None,
                   machines: Mapping[str, str] | None = None) -> str:
    """One sentence naming what failed (node, rank, exit code), then the tail of that rank's log.
    `failed_rank`: the first process of a node-launched job that failed (mpirun's log names it for MPI).
    `machines`: for a lost node on another machine, what became of that machine (runs/machinewatch.py)."""
    if lost:
        said = sorted({machines[n] for n in lost if n in (machines or {})})
        how = f"was lost ({'; '.join(said)})" if said else "was killed (an injected fault)" if set(lost) <= killed \
            else "was lost (its container or processes stopped)"
        return f"node {', '.join(lost)} {how} while the job ran; the job was stopped on all nodes"
    if failed_rank is not None and len(layout) > 1:
        what = f"exit code {exit_code}" if exit_code >= 0 else f"signal {-exit_code}"
        return _rank_failed(failed_rank, what, layout, run_dir)
    match = MPI_EXIT_RE.search(mpi_log)
    signal_match = MPI_SIGNAL_RE.search(mpi_log)
    if match or signal_match:
        rank = int((match or signal_match).group(1))
        what = f"exit code {match.group(2)}" if match else f"signal {signal_match.group(3)}"
        return _rank_failed(rank, what, layout, run_dir)
    log = rank_log(run_dir, 0)
    return f"the job exited with code {exit_code}. Last lines of {log.name}:\n{tail(log)}"
