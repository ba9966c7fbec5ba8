"""On a GPU machine each emulated node gets its own GPU (skipped with the reason elsewhere)."""
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("gpu_probe.py")


@pytest.mark.gpu
@pytest.mark.aml(nodes=2, gpus_per_node=1)
def test_each_node_sees_one_gpu(aml_run):
    run = aml_run.script(SCRIPT)
    seen = [run.logs(rank) for rank in (0, 1)]
    assert all("sees 1 GPU(s)" in log for log in seen), seen
