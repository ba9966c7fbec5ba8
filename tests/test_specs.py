"""Clusters, SKUs and the run lifecycle: pure data and its validation."""
from __future__ import annotations

import pytest

from amlemu import skus
from amlemu.errors import ConfigError, StateError
from amlemu.specs import ClusterSpec, Priority, RunStatus


@pytest.mark.parametrize("name", ["STANDARD_D2_V2", "standard_ds3_v2", "Standard_F4s_v2", "STANDARD_NC6",
                                  "STANDARD_NC6S_V3", "STANDARD_NC24", "STANDARD_ND40RS_V2"])
def test_the_seed_sizes_are_known_case_insensitively(name: str) -> None:
    assert skus.lookup(name).name.upper() == name.upper()


def test_sizes_carry_real_figures() -> None:
    nc6 = skus.lookup("STANDARD_NC6")
    assert (nc6.vcpus, nc6.memory_gib, nc6.gpus, nc6.gpu_model) == (6, 56, 1, "K80")
    assert skus.lookup("Standard_ND40rs_v2").gpus == 8


def test_unknown_size_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        ClusterSpec("c1", vm_size="STANDARD_BOGUS")
    assert str(err.value).startswith("vm_size: unknown size 'STANDARD_BOGUS'; use one of: ")
    assert "Standard_NC6s_v3" in str(err.value)


def test_nodes_are_scaled_to_this_machine_with_a_notice() -> None:
    size = skus.lookup("STANDARD_NC6")
    limits = skus.node_limits(size, host_cpus=2, host_memory_bytes=8 * skus.GIB, nodes=2)
    assert (limits.cpus, limits.cpu_share) == (2.0, 1.0)
    assert limits.memory_bytes == int(8 * skus.GIB * 0.9) and limits.gpus == 0
    assert limits.notice == ("Standard_NC6 scaled to this machine: 6 vCPUs -> 2 (a fair share of 1 with 2 nodes "
                             "busy), 56 GiB -> 7.2 GiB, 1 K80 GPUs -> 0 per node")
    roomy = skus.node_limits(skus.lookup("STANDARD_D2_V2"), host_cpus=64, host_memory_bytes=512 * skus.GIB, nodes=4)
    assert (roomy.cpus, roomy.cpu_share, roomy.notice) == (2.0, 2.0, None)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_nodes": 1, "min_nodes": 2}, "max_nodes: 1 is below min_nodes 2; raise max_nodes or lower min_nodes"),
    ({"min_nodes": -1}, "min_nodes: must be a non-negative integer, got -1"),
    ({"max_nodes": 0}, "max_nodes: must be at least 1"),
    ({"idle_seconds_before_scaledown": -5}, "idle_seconds_before_scaledown: must be a non-negative integer"),
    ({"vm_priority": "spot"}, "vm_priority: 'spot' is not a priority; use dedicated or low_priority"),
])
def test_bad_cluster_fields_are_named(kwargs, message) -> None:
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        ClusterSpec("c1", **kwargs)


def test_cluster_name_rules() -> None:
    with pytest.raises(ConfigError, match="^name: '1bad' is not a valid compute name"):
        ClusterSpec("1bad")


def test_priority_accepts_v1_and_v2_spellings() -> None:
    assert Priority.parse("lowpriority") is Priority.parse("low_priority") is Priority.LOW_PRIORITY
    assert ClusterSpec("c1", vm_priority="Dedicated").vm_priority is Priority.DEDICATED


def test_statuses_and_terminal_ones_are_the_sdks() -> None:
    from azure.ai.ml.operations._run_history_constants import JobStatus, RunHistoryConstants

    sdk = {v for k, v in vars(JobStatus).items() if k.isupper()}
    assert {s.value for s in RunStatus} == sdk
    assert {s.value for s in RunStatus if s.is_terminal} == set(RunHistoryConstants.TERMINAL_STATUSES)
    assert {RunStatus.NOT_RESPONDING, RunStatus.PAUSED} <= {s for s in RunStatus if s.is_terminal}
    assert RunStatus.NOT_STARTED.can_become(RunStatus.STARTING) and RunStatus.STARTING.can_become(RunStatus.QUEUED)


def test_lifecycle_transitions() -> None:
    path = [RunStatus.NOT_STARTED, RunStatus.QUEUED, RunStatus.PREPARING, RunStatus.RUNNING,
            RunStatus.FINALIZING, RunStatus.COMPLETED]
    for current, nxt in zip(path, path[1:]):
        assert current.can_become(nxt)
    for status in (RunStatus.QUEUED, RunStatus.PREPARING, RunStatus.RUNNING):
        assert status.can_become(RunStatus.CANCEL_REQUESTED) and status.can_become(RunStatus.FAILED)
    assert RunStatus.CANCEL_REQUESTED.can_become(RunStatus.CANCELED)
    assert not RunStatus.QUEUED.can_become(RunStatus.RUNNING)  # no skipping Preparing
    assert RunStatus.RUNNING.can_become(RunStatus.QUEUED)  # preempted: back to the queue, restarted
    assert not RunStatus.FINALIZING.can_become(RunStatus.QUEUED)
    with pytest.raises(StateError, match="a run cannot go from Completed to Running"):
        RunStatus.COMPLETED.check_transition(RunStatus.RUNNING)
