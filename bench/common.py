"""What every benchmark here shares: a throwaway emulator home, removed whatever happens, the
thread settings a baseline must share with the emulated ranks, and the results printed as one
JSON document."""
from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

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


@contextmanager
def bench_home(prefix: str, backend: str) -> Iterator[tuple[Path, Emulator]]:
    """(a scratch folder, an emulator whose home is in it); every node, network and process the
    benchmark made is removed at the end."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = Path(tmp)
        emu = Emulator(home=work / "home", backend=backend)
        try:
            yield work, emu
        finally:
            emu.cleanup()


def report(results: dict[str, object]) -> int:
    print(json.dumps(results, indent=2))
    return 0
