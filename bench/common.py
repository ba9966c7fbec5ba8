"""What every benchmark here shares: a throwaway emulator home, removed whatever happens, and the
results printed as one JSON document."""
from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emulator.api import Emulator  # noqa: E402


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
