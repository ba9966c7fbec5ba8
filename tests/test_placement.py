"""Placement of a cluster's nodes on machines (amlemu.machines.placement): spread and pack, what each
machine takes, and the one-line shortfall when they cannot all be placed. Pure: no engine, no home."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from amlemu import skus
from amlemu.errors import CapacityError, ConfigError
from amlemu.machines.placement import Free, NodeSize, fits, place
from amlemu.machines.registry import Machine

GIB = 1 << 30
SMALL = NodeSize(2, 4 * GIB, name="Standard_small")  # 2 cores, 4 GiB
NC6 = NodeSize.of(skus.lookup("Standard_NC6"))  # 6 cores, 56 GiB, 1 GPU


def box(name: str, cores: float = 8, memory_gib: float = 32, gpus: int = 0) -> Free:
    return Free(name, cores, int(memory_gib * GIB), gpus)


def test_a_vm_size_and_a_machine_become_what_placement_compares() -> None:
    assert NC6 == NodeSize(6.0, 56 * GIB, 1, "Standard_NC6")
    machine = Machine("m2", "ssh://me@m2", 16.0, 64 * GIB, ("GPU-a", "GPU-b"))
    assert Free.of(machine) == Free("m2", 16.0, 64 * GIB, 2)


@pytest.mark.parametrize("machine,size,expected", [
    (box("a", 8, 32), SMALL, 4),  # cores bind: 8 / 2
    (box("a", 64, 10), SMALL, 2),  # memory binds: 10 GiB / 4 GiB
    (box("a", 64, 512, gpus=3), NC6, 3),  # GPUs bind
    (box("a", 64, 512, gpus=0), NC6, 0),  # a GPU size on a machine without GPUs
    (box("a", 1, 32), SMALL, 0),  # less than one node's cores
    (box("a", 3, 32), NodeSize(1.5, GIB), 2),  # fractional cores, exactly
    (box("a", 0.3, 32), NodeSize(0.1, GIB), 3),  # 0.3 / 0.1 is 2.9999999999999996 in floats: still 3
])
def test_a_machine_takes_the_least_of_its_cores_memory_and_gpus_over_a_nodes(machine: Free, size: NodeSize,
                                                                             expected: int) -> None:
    assert fits(machine, size) == expected


def test_a_size_without_gpus_is_not_held_back_by_machines_without_them() -> None:
    assert place(2, SMALL, [box("a", 4, 8, gpus=0)]) == ["a", "a"]


def test_spread_goes_round_equal_machines_in_the_order_given() -> None:
    machines = [box("local"), box("m2"), box("m3")]
    assert place(5, SMALL, machines) == ["local", "m2", "m3", "local", "m2"]
    assert place(5, SMALL, list(reversed(machines))) == ["m3", "m2", "local", "m3", "m2"]


def test_spread_puts_each_node_where_the_most_room_is_left() -> None:
    # local takes 1 node, m2 takes 3: m2 first until they are level, then in turn.
    machines = [box("local", 2, 32), box("m2", 6, 32)]
    assert place(4, SMALL, machines, "spread") == ["m2", "m2", "local", "m2"]


def test_pack_fills_the_first_machine_before_the_next() -> None:
    machines = [box("local", 4, 32), box("m2", 8, 32), box("m3", 8, 32)]
    assert place(5, SMALL, machines, "pack") == ["local", "local", "m2", "m2", "m2"]
    assert place(2, SMALL, machines, "pack") == ["local", "local"]  # m2 and m3 left whole


def test_pack_skips_a_machine_that_takes_no_node() -> None:
    machines = [box("local", 64, 512, gpus=0), box("m2", 64, 512, gpus=4)]
    assert place(3, NC6, machines, "pack") == ["m2", "m2", "m2"]


def test_every_node_of_a_full_fit_is_placed_and_one_more_is_refused() -> None:
    machines = [box("local", 4, 32), box("m2", 6, 32)]  # 2 + 3 nodes
    for strategy in ("spread", "pack"):
        assert Counter(place(5, SMALL, machines, strategy)) == {"local": 2, "m2": 3}
        with pytest.raises(CapacityError):
            place(6, SMALL, machines, strategy)


def test_no_nodes_need_no_machine() -> None:
    assert place(0, NC6, []) == []
    assert place(0, NC6, [box("local")]) == []


def test_gpus_short_says_how_many_are_needed_and_what_each_machine_has() -> None:
    machines = [box("local", 2, 24, gpus=0), box("m2", 64, 512, gpus=4)]
    with pytest.raises(CapacityError) as raised:
        place(8, NC6, machines)
    message = str(raised.value)
    assert message.startswith("placement: 8 nodes of Standard_NC6 need 8 GPUs; machines local (0 GPUs free), "
                              "m2 (4 GPUs free) have 4 GPUs; ")
    assert "amlemu machine add" in message and "\n" not in message


def test_cores_short_is_named_before_memory() -> None:
    machines = [box("local", 8, 28), box("m2", 16, 28)]
    with pytest.raises(CapacityError, match=r"4 nodes of Standard_D4_v2 need 32 cores; machines local \(8 cores "
                                            r"free\), m2 \(16 cores free\) have 24 cores"):
        place(4, NodeSize.of(skus.lookup("Standard_D4_v2")), machines)


def test_memory_short_is_said_in_gib() -> None:
    with pytest.raises(CapacityError, match=r"3 nodes of Standard_small need 12.0 GiB; machines a \(5.0 GiB free\), "
                                            r"b \(6.5 GiB free\) have 11.5 GiB"):
        place(3, SMALL, [box("a", 64, 5), box("b", 64, 6.5)])


def test_enough_in_total_but_split_says_what_each_machine_takes() -> None:
    # 6 cores free for two 3-core nodes, but 2 + 4: only one node fits whole.
    with pytest.raises(CapacityError, match=r"2 nodes \(3 cores, 1.0 GiB, 0 GPUs each\) do not fit whole: "
                                            r"machines a takes 0, b takes 1"):
        place(2, NodeSize(3, GIB), [box("a", 2), box("b", 4)])


def test_no_machines_at_all() -> None:
    with pytest.raises(CapacityError, match=r"machines \(none\) have 0 cores"):
        place(1, SMALL, [])


@pytest.mark.parametrize("kwargs,field", [
    ({"strategy": "random"}, "placement"),
    ({"count": -1}, "nodes"),
    ({"machines": [box("a"), box("a")]}, "machines"),
])
def test_bad_arguments_are_one_line_errors_naming_the_field(kwargs: dict, field: str) -> None:
    args = {"count": 1, "size": SMALL, "machines": [box("a")], "strategy": "spread", **kwargs}
    with pytest.raises(ConfigError) as raised:
        place(**args)
    assert str(raised.value).startswith(f"{field}: ") and not isinstance(raised.value, CapacityError)


def test_random_clusters_never_overfill_a_machine_and_spread_stays_level() -> None:
    rng = random.Random(31)
    for _ in range(300):
        machines = [box(f"m{i}", rng.choice([1, 2, 4, 8, 16, 6.5]), rng.choice([4, 8, 16, 64]), rng.randint(0, 4))
                    for i in range(rng.randint(1, 5))]
        size = NodeSize(rng.choice([0.5, 1, 2, 4]), rng.choice([1, 2, 4]) * GIB, rng.choice([0, 0, 1, 2]))
        room = {m.name: fits(m, size) for m in machines}
        count = rng.randint(0, sum(room.values()) + 2)
        for strategy in ("spread", "pack"):
            if count > sum(room.values()):
                with pytest.raises(CapacityError):
                    place(count, size, machines, strategy)
                continue
            placed = place(count, size, machines, strategy)
            assert placed == place(count, size, machines, strategy)  # the same answer every time
            used = Counter(placed)
            assert len(placed) == count and all(used[name] <= room[name] for name in used)
            if strategy == "spread":  # a machine given a node had the most room then: it has at most one less now
                left = {name: room[name] - used[name] for name in room}
                assert all(left[name] >= max(left.values()) - 1 for name in used)
            else:  # pack: a machine is given nodes only once every machine before it is full
                names = [m.name for m in machines]
                for name in used:
                    assert all(used[before] == room[before] for before in names[:names.index(name)])
