"""The test rig as a session fixture: a second Docker engine on this machine, in its own network
namespace (emulator/machines/rig.py), brought up once per test worker that asks for it and removed
at the end, when nothing of it may be left. Where Docker runs but the rig cannot be made (not root,
no namespaces) the tests that use it fail: they never skip."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from amlemu.machines import rig


@dataclass(frozen=True)
class SecondEngine:
    home: Path  # the rig's home (its id names the rig's objects)
    state: dict[str, Any]  # rig.json: addresses, pid, namespace, veth
    client: Any  # a docker client of the second engine


@pytest.fixture(scope="session")
def second_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecondEngine]:
    home = tmp_path_factory.mktemp("rig-home")
    state = rig.up(home)
    engine = SecondEngine(home=home, state=state, client=rig.client(state))
    lay = rig.layout(home)
    try:
        yield engine
    finally:
        engine.client.close()
        pids = {state["pid"], (rig.read_state(lay) or {}).get("pid")} - {None}  # a test may restart its engine
        rig.down(home)
    left = [what for what, there in (
        ("the namespace", lay.netns.exists()),
        ("the veth", Path("/sys/class/net", lay.veth_host).exists()),
        ("the engine's process", any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)),
        ("its folders", lay.runtime.exists() or lay.rig_dir.exists()),
        ("mounts", any(str(lay.runtime) in line or str(lay.rig_dir) in line
                       for line in Path("/proc/self/mountinfo").read_text().splitlines())),
    ) if there]
    assert left == [], f"the rig's down left {left}"
