"""State files are written whole or not at all, from any process or thread."""
from __future__ import annotations

import json
import threading
from pathlib import Path

from amlemu import statefile


def test_threads_writing_one_file_at_once_all_succeed_and_one_whole_value_stays(tmp_path: Path) -> None:
    path, errors = tmp_path / "facts.json", []
    start = threading.Barrier(8)

    def write(n: int) -> None:
        start.wait()
        try:
            for _ in range(50):
                statefile.write_json(path, {"writer": n, "payload": "x" * 4096})
        except OSError as exc:  # a stage file shared by two threads: one renamed it from under the other
            errors.append(exc)
    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert json.loads(path.read_text())["writer"] in range(8)
    assert [p.name for p in tmp_path.iterdir()] == ["facts.json"]  # no stage file left
