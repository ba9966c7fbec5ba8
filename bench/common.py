"""What every benchmark here shares: a throwaway emulator home, removed whatever happens, the
thread settings a baseline must share with the emulated ranks, and the results printed as one
JSON document."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from amlemu.api import Emulator  # noqa: E402

# The variables that size a process's thread pools (OpenMP, MKL, OpenBLAS, numexpr, Accelerate).
# The emulator sets OMP_NUM_THREADS on every rank (its node's fair share of this machine's cores);
# a baseline run without it plans on all the cores instead, and on a machine whose cores the ranks
# share that is a threading difference, not an emulator one.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS")

# What a benchmark's job writes to find out its rank's thread settings (python source, one expression).
THREAD_PROBE = f"{{k: os.environ[k] for k in {THREAD_VARS!r} if k in os.environ}}"


def thread_env(env: Mapping[str, str]) -> dict[str, str]:
    """The thread-count variables of an environment."""
    return {name: env[name] for name in THREAD_VARS if name in env}


def baseline_env(base: Mapping[str, str], threads: Mapping[str, str], **extra: str) -> dict[str, str]:
    """`base` with its own thread variables removed and `threads` set instead: {} is a run as a
    user would start it bare, the emulated ranks' settings make the matched baseline."""
    env = {name: value for name, value in base.items() if name not in THREAD_VARS}
    env.update(threads)
    env.update(extra)
    return env


def same_threads(per_rank: list[dict[str, str]]) -> dict[str, str]:
    """The one thread setting every emulated rank had (a benchmark's baseline copies it)."""
    distinct = {json.dumps(t, sort_keys=True) for t in per_rank}
    if len(distinct) != 1:
        raise RuntimeError(f"emulated ranks ran with different thread settings: {sorted(distinct)}")
    return dict(per_rank[0])


class Stopped(BaseException):
    """A termination signal (SIGTERM, SIGHUP) as an exception, so cleanups run (Python's default
    for them ends the process on the spot: a benchmark killed by a CI timeout left its nodes)."""


class StepTimeout(BaseException):  # not an Exception: no library code may swallow it
    pass


def _raise(exc: type[BaseException]) -> Callable[[int, Any], None]:
    def handler(signum: int, _frame: Any) -> None:
        raise exc(f"signal {signal.Signals(signum).name}")
    return handler


@contextmanager
def bench_home(prefix: str, backend: str) -> Iterator[tuple[Path, Emulator]]:
    """(a scratch folder, an emulator whose home is in it); every node, network and process the
    benchmark made is removed at the end, also when it is interrupted or terminated."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise(Stopped))
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = Path(tmp)
        emu = Emulator(home=work / "home", backend=backend)
        print(json.dumps({"home": str(emu.home.root), "home_id": emu.home.id}), flush=True)
        try:
            yield work, emu
        finally:
            emu.cleanup()


BUSY = "while True: pass"
# N busy loops in one process group: the first forks the others (they share its session).
BUSY_GROUP = "import os, sys\nfor _ in range(int(sys.argv[1]) - 1):\n    if os.fork() == 0:\n        break\nwhile True:\n    pass\n"


@contextmanager
def background_load(processes: int, containers: int = 0) -> Iterator[None]:
    """Other work on this machine for the duration, as on a CI runner or a laptop (the benchmark is
    measured quiet and loaded, and says which): `processes` busy loops, and `containers` busy
    containers under the engine's default cgroup parent (other containers of the machine, which
    shared one CPU weight with docker nodes before they got their own). Ended by pid and id.

    The busy loops are a session of their own, as other work is (another terminal, a build): where
    the kernel groups tasks by session (autogroup), a session shares the CPU with the others as
    one. In the benchmark's session they were one more task beside its bare mpirun's ranks, which
    an emulated job, in its own session, never is."""
    busy = [subprocess.Popen([sys.executable, "-c", BUSY_GROUP, str(processes)], start_new_session=True)] \
        if processes else []
    started: list[Any] = []
    try:
        if containers:
            import docker  # noqa: PLC0415

            from amlemu.backends.dockerplan import MIRROR_IMAGE, software_paths  # noqa: PLC0415

            client = docker.from_env()
            volumes = {p: {"bind": p, "mode": "ro"} for p in software_paths()}
            started += [client.containers.run(MIRROR_IMAGE, [sys.executable, "-c", BUSY], detach=True,
                                              volumes=volumes, labels={"amlemu.bench-load": "1"})
                        for _ in range(containers)]
        yield
    finally:
        for container in started:
            container.remove(force=True)
        for proc in busy:
            os.killpg(proc.pid, signal.SIGKILL)  # the group it leads: it and the loops it forked
            proc.wait()


class Steps:
    """A benchmark's steps, each printed as it ends (a line for people, then one JSON line), each
    with a time limit: a step that fails or runs over is reported, its runs canceled, and the next
    one runs. `results` holds every step's figures for the final report."""

    def __init__(self, emu: Emulator) -> None:
        self.emu, self.results = emu, {}

    def run(self, name: str, limit: float, step: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        start = time.monotonic()
        signal.signal(signal.SIGALRM, _raise(StepTimeout))
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            figures: dict[str, Any] | None = step()
            outcome: dict[str, Any] = dict(figures or {})
        except StepTimeout:
            figures, outcome = None, {"error": f"timed out after {limit:.0f} s"}
        except Exception as exc:  # noqa: BLE001 - reported; the next step still runs
            figures, outcome = None, {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if figures is None:
            self._cancel_active()
        outcome["step_seconds"] = round(time.monotonic() - start, 1)
        self.results[name] = outcome
        print(f"== {name}: {'FAILED ' + outcome['error'] if 'error' in outcome else 'done'} "
              f"in {outcome['step_seconds']} s", flush=True)
        print(json.dumps({"step": name, **outcome}), flush=True)
        return figures

    def _cancel_active(self) -> None:
        for run in self.emu.runs():
            if not run.status.is_terminal:
                self.emu.cancel(run.id)


def report(results: dict[str, object]) -> int:
    print(json.dumps(results, indent=2))
    return 0
