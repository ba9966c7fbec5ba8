"""A process named by its pid and start time (emulator/procinfo.py): the same process whatever the
clock did since its start was read, never a pid reused by another."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from amlemu import procinfo


@pytest.mark.parametrize(("apart", "same"), [
    (0.0, True), (0.04, True),  # one reading, or two a tick apart
    (1.0, True), (-1.0, True), (1.02, True), (2.0, True),  # /proc/stat's btime moved a whole second between them
    (0.5, False), (0.2, False), (1.3, False), (3.0, False),  # another start: another process on that pid
])
def test_two_readings_of_a_start_time_name_one_process_across_a_move_of_btime(apart: float, same: bool) -> None:
    assert procinfo.same_start(1_796_324_784.75, 1_796_324_784.75 + apart) is same


def test_a_live_process_is_alive_after_its_boot_time_moved_and_a_gone_one_is_not() -> None:
    started = procinfo.started_at(os.getpid())
    assert started is not None
    assert procinfo.alive(os.getpid(), started) and procinfo.alive(os.getpid(), started + 1.0)
    assert not procinfo.alive(os.getpid(), started + 0.5)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child_started = procinfo.started_at(child.pid)
    child.wait()
    assert child_started is not None and not procinfo.alive(child.pid, child_started)
