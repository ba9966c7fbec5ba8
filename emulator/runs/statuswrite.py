"""A run's status into the state database, as its supervisor writes it: a store error (its disk
full, an I/O error) never decides the run. A passing status (Finalizing) is skipped, a final one
retried while the error lasts (cleaning the nodes up may have freed the space)."""
from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any

from amlemu.cluster.store import Store
from amlemu.specs import RunStatus

STATE_RETRY = 60.0  # seconds a final status is retried while the state database refuses it


def write_status(store: Store, run_id: str, status: RunStatus, detail: str, log: Callable[[str], None],
                 retry: float = STATE_RETRY, **fields: Any) -> None:
    deadline, pause = time.monotonic() + retry, 0.25
    while True:
        try:
            store.set_status(run_id, status, detail, **fields)
            return
        except sqlite3.OperationalError as exc:
            log(f"warning: the state database refused status {status.value}: {exc}")
            if not status.is_terminal:
                return
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 5.0)
