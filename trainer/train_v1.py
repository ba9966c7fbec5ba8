"""train.py for SDK v1 submissions (the seed notebook's PyTorch estimator): the same Horovod MNIST,
with rank 0's metrics logged through azureml-core's `Run.get_context()` (`run.log`), as the
article's v1 scripts report, instead of MLflow. Submitted, the run is the job's own (its metrics
reach `run.get_metrics()` in the notebook); anywhere else it is an offline run that prints them.

    mpirun -np 2 python train_v1.py --data-dir <folder holding MNIST/raw> [train.py's options]
"""
from __future__ import annotations

import sys
from typing import Any

import train


class RunMetrics(train.Metrics):
    """train.Metrics' interface over the v1 run: params become tags, metrics `run.log` rows."""

    def __init__(self, enabled: bool) -> None:  # noqa: D107 - no MLflow run: the job's v1 run is the record
        self.enabled = enabled
        self._mlflow = None
        self._run: Any = None
        if enabled:
            from azureml.core import Run  # noqa: PLC0415 - only rank 0 pays for the import

            self._run = Run.get_context()

    def params(self, params: dict[str, Any]) -> None:
        if self._run is not None:
            self._run.set_tags({name: str(value) for name, value in params.items()})

    def log(self, name: str, value: float, step: int) -> None:
        if self._run is not None:
            self._run.log(name, value, description=f"epoch {step}")

    def close(self, status: str = "FINISHED") -> None:
        if self._run is not None:
            self._run.flush()  # the metrics are sent in the background: all of them before the job ends


if __name__ == "__main__":
    sys.exit(train.main(metrics_class=RunMetrics))
