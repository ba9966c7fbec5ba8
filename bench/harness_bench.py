"""The example tests (examples/) through the pytest plugin at -n 1 and -n 2, in one run: the
wall time of each and their ratio. Not a test: the figure is reported.

    .venv/bin/python bench/harness_bench.py [--backend docker|process]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def timed(workers: int, backend: str) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", str(workers),
                           "examples", "--aml-backend", backend, "--aml-strict"], cwd=REPO, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise SystemExit(f"-n {workers} failed:\n{done.stdout[-2000:]}")
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="docker")
    args = parser.parse_args()
    one, two = timed(1, args.backend), timed(2, args.backend)
    print(json.dumps({"backend": args.backend, "n1_s": round(one, 1), "n2_s": round(two, 1),
                      "speedup": round(one / two, 2)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
