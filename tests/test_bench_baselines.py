"""The benchmarks' baselines run with the emulated ranks' thread settings (bench/common.py)."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def common():
    spec = importlib.util.spec_from_file_location("bench_common", BENCH / "common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_baseline_env_takes_the_ranks_thread_settings_and_drops_its_own(common):
    base = {"PATH": "/bin", "OMP_NUM_THREADS": "8", "MKL_NUM_THREADS": "8"}
    assert common.baseline_env(base, {"OMP_NUM_THREADS": "1"}, X="y") == {"PATH": "/bin", "OMP_NUM_THREADS": "1",
                                                                          "X": "y"}
    assert common.baseline_env(base, {}) == {"PATH": "/bin"}  # as a user would run it: no thread variable
    assert base["OMP_NUM_THREADS"] == "8"  # not changed in place


def test_thread_env_and_same_threads(common):
    assert common.thread_env({"OMP_NUM_THREADS": "2", "HOME": "/root"}) == {"OMP_NUM_THREADS": "2"}
    assert common.same_threads([{"OMP_NUM_THREADS": "1"}, {"OMP_NUM_THREADS": "1"}]) == {"OMP_NUM_THREADS": "1"}
    with pytest.raises(RuntimeError, match="different thread settings"):
        common.same_threads([{"OMP_NUM_THREADS": "1"}, {}])


def test_thread_probe_reads_a_processes_thread_variables(common):
    code = f"import json, os; print(json.dumps({common.THREAD_PROBE}))"
    env = {**os.environ, "OMP_NUM_THREADS": "3"}
    env.pop("MKL_NUM_THREADS", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["OMP_NUM_THREADS"] == "3"
