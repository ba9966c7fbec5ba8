"""A process cluster's network namespace (emulator/backends/netns.py): made once however many nodes
ask for it at the same moment, and removed whole (as root, as CI runs; elsewhere process nodes share
the host's network and say so, which tests/test_cluster.py's dry run covers)."""
from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest

from amlemu.backends import netns
from amlemu.backends.process import ProcessBackend
from amlemu.home import Home


def _bindings(path: Path) -> int:
    return sum(1 for line in Path("/proc/self/mountinfo").read_text().splitlines() if f" {path} " in line)


def test_nodes_made_at_once_share_one_namespace_and_remove_leaves_nothing() -> None:
    assert netns.supported(), "the suite runs as root with util-linux and iproute2 (scripts/setup.sh)"
    path = netns.RUNTIME_ROOT / f"test-{uuid.uuid4().hex[:8]}" / "c1"
    try:
        threads = [threading.Thread(target=netns.create, args=(path,)) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert _bindings(path) == 1  # not one per node: a second binding would outlive remove()
        with netns.listen_in(path) as sock:  # the run's link: a socket made inside the namespace
            assert sock.getsockname()[0] == "127.0.0.1"
    finally:
        netns.remove(path)
    assert _bindings(path) == 0 and not path.parent.exists()


@pytest.mark.parametrize("stacked", [2, 3])
def test_remove_unbinds_every_binding_stacked_at_the_path(stacked: int) -> None:
    """What an older version left (two bindings at one path) is removed whole."""
    path = netns.RUNTIME_ROOT / f"test-{uuid.uuid4().hex[:8]}" / "c1"
    path.parent.mkdir(parents=True)
    path.touch()
    try:
        for _ in range(stacked):
            netns.subprocess.run(netns.create_argv(path), check=True, capture_output=True)
        assert _bindings(path) == stacked
    finally:
        netns.remove(path)
    assert _bindings(path) == 0 and not path.exists()


def test_cleanup_of_all_homes_finds_the_namespaces_of_a_home_already_deleted(tmp_path: Path) -> None:
    """A home removed before its cleanup leaves its clusters' namespaces (kernel objects, bound under
    /run): this home's cleanup leaves them alone, `cleanup --all-homes` removes them."""
    gone = netns.RUNTIME_ROOT / f"test-{uuid.uuid4().hex[:8]}" / "c1"
    netns.create(gone)
    try:
        backend = ProcessBackend(Home.at(tmp_path / "home"))
        assert str(gone) not in [a.detail.get("path") for a in backend.plan_reap()]
        [action] = [a for a in backend.plan_reap(all_homes=True) if a.detail.get("path") == str(gone)]
        assert (action.verb, action.what, action.name) == ("remove", "network namespace", "c1")
        action.run()  # type: ignore[misc]
        assert _bindings(gone) == 0 and not gone.parent.exists()
    finally:
        netns.remove(gone)
