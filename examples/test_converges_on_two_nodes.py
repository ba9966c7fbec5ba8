"""My training script converges on 2 nodes (the emulator's aml_* fixtures, from `pip install amlemu`)."""
from pathlib import Path

import pytest

from pytest_amlemu import mnist

TRAINER = Path(__file__).resolve().parents[1] / "trainer" / "train.py"


@pytest.mark.aml(nodes=2, procs=1)
def test_mnist_reaches_90_percent_on_two_nodes(aml_run, mnist_data, tmp_path):
    subset = mnist.write_subset(mnist.MnistLayout(mnist_data), tmp_path / "mnist", train=6000, test=1000).root
    run = aml_run.script(TRAINER, ["--data-dir", "${{inputs.data}}", "--epochs", "2", "--batch-size", "32"],
                         inputs={"data": subset})
    assert run.metrics()["test_accuracy"] >= 0.9
    assert [step for step, _ in run.metric_history()["test_accuracy"]] == [1, 2]
