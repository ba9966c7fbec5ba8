"""`Run`: the handle `Emulator.submit` returns on one run (status, logs, metrics, outputs, wait,
cancel), in the spirit of azureml-core's Run; it reads the shared store, so it is always current."""
from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from amlemu.cluster.store import RunRecord, Store
from amlemu.errors import ConfigError
from amlemu.home import Home
from amlemu.jobs.jobspec_io import job_from_record
from amlemu.runs.metrics import PLOT_NAME, metric_history, metric_stores
from amlemu.runs.runlogs import rank_log
from amlemu.specs import JobSpec, RunStatus


class Run:
    """A handle on one run; every property reads the shared store, so it is always current."""

    def __init__(self, store: Store, home: Home, run_id: str, reconcile: Callable[[], Any] = lambda: None) -> None:
        self._store, self._home, self.id = store, home, run_id
        self._reconcile = reconcile  # the emulator's: a run whose supervisor died is ended while we wait

    def __repr__(self) -> str:
        return f"Run({self.id!r}, status={self.status.value})"

    @property
    def record(self) -> RunRecord:
        return self._store.run(self.id)

    @property
    def status(self) -> RunStatus:
        return self.record.status

    @property
    def job(self) -> JobSpec:
        return job_from_record(self.record.job)

    @property
    def dir(self) -> Path:
        return self._home.run_dir(self.id)

    @property
    def outputs(self) -> Path:
        return self.dir / "outputs"

    @property
    def plot_path(self) -> Path | None:
        """The PNG of the metric curves, written by the supervisor as the run ends (None: no plot)."""
        path = self.dir / PLOT_NAME
        return path if path.exists() else None

    def events(self) -> list[tuple[float, RunStatus, str]]:
        return self._store.events(self.id)

    def log_path(self, process: int = 0) -> Path:
        return rank_log(self.dir, process)

    def logs(self, process: int = 0) -> str:
        path = self.log_path(process)
        return path.read_text(errors="replace") if path.exists() else ""

    def wait(self, timeout: float | None = None, show_output: bool = False, out: TextIO | None = None) -> RunStatus:
        """Block until the run ends; with show_output, stream rank 0's log and print a summary."""
        out = out or sys.stdout
        deadline = None if timeout is None else time.monotonic() + timeout
        offset = 0
        while True:
            self._reconcile()
            status = self.status
            if show_output:
                text = self.logs(0)
                out.write(text[offset:])
                out.flush()
                offset = len(text)
            if status.is_terminal:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.id} still {status.value} after {timeout} s")
            time.sleep(0.1)
        if show_output:
            out.write(self.summary() + "\n")
        return status

    def summary(self) -> str:
        record = self.record
        events = self.events()
        took = events[-1][0] - events[0][0] if events else 0.0
        lines = ["", "Execution Summary", "=================", f"RunId: {self.id}",
                 f"Status: {record.status.value} (in {took:.1f} s)"]
        if record.error:
            lines.append(f"Error: {record.error}")
        lines.append(f"Outputs: {self.outputs}")
        lines.append(f"Logs: {self.log_path(0).parent}")
        return "\n".join(lines)

    def metrics(self) -> dict[str, Any]:
        """The metrics the job logged with MLflow: the last value of each, as run.get_metrics() gives."""
        return {name: values[-1][1] for name, values in self.metric_history().items()}

    def metric_stores(self) -> list[Path]:
        return metric_stores(self.dir, active=not self.status.is_terminal)

    def metric_history(self) -> dict[str, list[tuple[int, float]]]:
        """(step, value) of every metric the job logged, across its attempts and nodes."""
        return metric_history(self.dir, active=not self.status.is_terminal)

    def download(self, dest: str | Path) -> Path:
        """Copy outputs, logs, the run's own logs and its metrics plot to `dest` (as `az ml job
        download` does)."""
        if Path(dest).exists() and not Path(dest).is_dir():
            raise ConfigError("--download-path", f"{dest} is a file", "give a folder (it is created if missing)")
        dest = Path(dest) / self.id
        if dest.exists() and not dest.is_dir():
            raise ConfigError("--download-path", f"{dest} is a file", "move it away or download elsewhere")
        for sub in ("outputs", "logs", "user_logs", "azureml-logs", "system_logs"):
            if (self.dir / sub).exists():
                shutil.copytree(self.dir / sub, dest / sub, dirs_exist_ok=True)
        if self.plot_path is not None:
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.plot_path, dest / PLOT_NAME)
        return dest

    def cancel(self) -> RunStatus:
        status = self.status
        if status.is_terminal:
            return status
        self._store.set_status(self.id, RunStatus.CANCEL_REQUESTED, "cancel requested")
        return RunStatus.CANCEL_REQUESTED
