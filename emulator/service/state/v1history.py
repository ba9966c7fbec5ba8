"""A v1 run's history as the routes ask for it (emulator/service/protocol/v1online.py, v1widget.py):
what a job's azureml-core Run sends (tags and properties, metrics, uploaded files), kept in the
run's own record by emulator/runs/runhistory.py. Every call names its run, which must exist; a bad
file name is Azure's 400, naming the field."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from amlemu.runs import runhistory
from amlemu.service.state import bad_request


@contextmanager
def _as_bad_request() -> Iterator[None]:
    try:
        yield
    except runhistory.HistoryError as exc:
        raise bad_request(exc.field, str(exc)) from None


class History:
    def __init__(self, run_dir: Callable[[str], Path]) -> None:
        self._run_dir = run_dir  # the run's folder, once its run is known to exist

    def update_properties(self, run_id: str, tags: Any, props: Any) -> None:
        with _as_bad_request():
            runhistory.update_properties(self._run_dir(run_id), tags, props)

    def append_metrics(self, run_id: str, values: list[dict[str, Any]]) -> None:
        runhistory.append_metrics(self._run_dir(run_id), values)

    def read_metrics(self, run_id: str) -> list[dict[str, Any]]:
        return runhistory.read_metrics(self._run_dir(run_id))

    def check_artifact(self, run_id: str, name: str) -> None:
        """A name the run may write (within its record, not its platform's files), else a 400."""
        with _as_bad_request():
            runhistory.artifact_path(self._run_dir(run_id), name)

    def artifact(self, run_id: str, name: str) -> Path | None:
        """The file an upload wrote, if the name is one the run may write and it is a plain file."""
        try:
            target = runhistory.artifact_path(self._run_dir(run_id), name)
        except runhistory.HistoryError:
            return None
        return None if target.is_symlink() or not target.is_file() else target

    def write_artifact(self, run_id: str, name: str, data: bytes) -> None:
        with _as_bad_request():
            runhistory.write_artifact(self._run_dir(run_id), name, data)
