"""Memory per rank: measured while a job runs, kept per (environment, script) in the home, and the
rule that refuses a job whose ranks cannot fit in this machine's memory before anything is made.

Every emulated node shares this machine's memory, so a job of many ranks can exhaust it (64 ranks
importing torch and Horovod hold ~36 GiB). A rank's figure is its anonymous resident memory (what
the ranks cannot share; libraries' pages are shared between them), with its share of its node's
platform processes, at its peak. A run that drives this machine below its floor while its ranks
hold a large share of it is stopped with the figure, before the kernel's out-of-memory killer
picks a victim that may be the user's editor.
"""
from __future__ import annotations

import hashlib
import json
import shlex
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from amlemu import statefile
from amlemu.backends import NodeRequest
from amlemu.backends.base import NodeBackend
from amlemu.errors import ConfigError
from amlemu.runs.contract import Rank
from amlemu.specs import JobSpec

SAMPLE = 1.0  # seconds between samples
FLOOR = 0.05  # a run is stopped when this machine's available memory falls under this share...
JOB_SHARE = 0.25  # ...while the job's ranks hold at least this share of it (else: not the job's doing)
HEADROOM = 0.9  # a job is refused when its ranks would need more than this share of what is available
MIB = 2 ** 20
GIB = 2 ** 30
Pids = Callable[[], list[int]]


@dataclass(frozen=True)
class RankMemory:
    """A job's measured figure: the peak anonymous memory of one rank, and the run it comes from."""

    bytes: int
    run_id: str
    ranks: int


def figure_key(job: JobSpec) -> str:
    """What decides a rank's memory: the environment and the script (its arguments aside)."""
    environment = json.dumps(job.environment_def, sort_keys=True) if job.environment_def else job.environment
    try:
        words = shlex.split(job.command)
    except ValueError:  # unbalanced quotes: the shell would refuse it too, the words are enough here
        words = job.command.split()
    script = next((w for w in words[1:] if w.endswith(".py")), " ".join(words[:3]) or job.command[:200])
    return f"{environment or 'this machine'} | {script}"


def _figure_path(home_root: Path, key: str) -> Path:
    # One file per key: two runs recording different jobs at once never overwrite each other.
    return home_root / "rank-memory" / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")


def recorded(home_root: Path, key: str) -> RankMemory | None:
    try:
        data = json.loads(_figure_path(home_root, key).read_text())
        return RankMemory(int(data["bytes"]), str(data["run_id"]), int(data["ranks"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def record(home_root: Path, key: str, figure: RankMemory) -> None:
    statefile.write_json(_figure_path(home_root, key), {"key": key, **asdict(figure)})


def fit_problem(figure: RankMemory | None, ranks: int, available: int) -> str | None:
    """Why `ranks` ranks of a job measured at `figure` cannot fit in `available` bytes (None: they fit)."""
    if figure is None or figure.bytes * ranks <= available * HEADROOM:
        return None
    fit = int(available * HEADROOM // max(1, figure.bytes))
    return (f"{ranks} ranks need about {figure.bytes * ranks / GIB:.1f} GiB: each held {figure.bytes / MIB:.0f} MiB "
            f"at its peak in run {figure.run_id}, and this machine has {available / GIB:.1f} GiB available; "
            + (f"at most {fit} such ranks fit" if fit else "not one such rank fits"))


def low_memory(available: int, total: int, job_bytes: int) -> bool:
    """The run must stop: this machine is nearly out of memory, and mostly by the job's doing."""
    return available < total * FLOOR and job_bytes >= total * JOB_SHARE


def anon_bytes(pid: int) -> int:
    """A process's anonymous resident memory (0 when it is gone or unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class MemWatch(threading.Thread):
    """Samples each node's processes until `stop` is set: the peak per rank, and `reason` (told to
    `on_low` once) when the job is driving this machine out of memory. `find` (node -> (its pids, its ranks))
    runs in the thread: finding a docker node's cgroup asks the engine, which the launch need not wait for."""

    def __init__(self, find: Callable[[], Mapping[str, tuple[Pids, int]]], stop: threading.Event,
                 on_low: Callable[[str], None]) -> None:
        super().__init__(name="memwatch", daemon=True)
        self.find, self.stop, self.on_low = find, stop, on_low
        self.nodes: dict[str, tuple[Pids, int]] = {}
        self.peak_per_rank = 0
        self.reason: str | None = None

    def sample(self) -> int:
        """The job's anonymous memory now; the per-rank peak updated."""
        total = 0
        for pids, ranks in self.nodes.values():
            try:
                held = sum(anon_bytes(pid) for pid in pids())
            except (OSError, psutil.Error):  # the node went meanwhile
                continue
            total += held
            self.peak_per_rank = max(self.peak_per_rank, held // max(1, ranks))
        return total

    def run(self) -> None:
        self.nodes = dict(self.find())
        while not self.stop.wait(SAMPLE):
            held = self.sample()
            memory = psutil.virtual_memory()
            if self.reason is None and low_memory(memory.available, memory.total, held):
                self.reason = (f"this machine ran out of memory: the job's ranks held {held / GIB:.1f} GiB of its "
                               f"{memory.total / GIB:.1f} GiB ({self.peak_per_rank / MIB:.0f} MiB per rank at the "
                               f"peak), and {memory.available / MIB:.0f} MiB was left; run fewer ranks (nodes or "
                               "processes per node) or make each smaller (a smaller batch or model)")
                self.on_low(self.reason)


def start(backend: NodeBackend, requests: list[NodeRequest], ranks: list[Rank], stop: threading.Event,
          on_low: Callable[[str], None]) -> MemWatch:
    per_node = Counter(rank.node for rank in ranks)
    watch = MemWatch(lambda: {r.name: (backend.node_pids(r), per_node.get(r.name, 1)) for r in requests}, stop, on_low)
    watch.start()
    return watch


def keep(home_root: Path, job: JobSpec, run_id: str, watch: MemWatch) -> None:
    """The run's figure, for the next submit of the same job (a sample taken: the job ran a second or more)."""
    watch.join(timeout=5)
    if watch.peak_per_rank:
        record(home_root, figure_key(job), RankMemory(watch.peak_per_rank, run_id, job.process_count))


def check_fits(home_root: Path, job: JobSpec) -> None:
    """Refuse, before anything is made, a job whose ranks this home measured too large to fit now."""
    problem = fit_problem(recorded(home_root, figure_key(job)), job.process_count, psutil.virtual_memory().available)
    if problem:
        raise ConfigError("resources.instance_count", problem,
                          "run fewer nodes or processes per node, or free memory on this machine (a smaller batch "
                          "or model lowers the figure, which the next run measures again)")
