"""Which machine each node of a cluster goes on. Pure: the callers say what each machine has free.

Nodes of one cluster are all of one size, so each machine independently fits a whole number of
them (the least of free cores, memory and GPUs over the size's); a placement exists exactly when
those numbers add up to the nodes asked for, and is checked up front.

- spread: each node on the machine that can still take the most nodes (ties: the order given),
  so nodes go round the machines and fill them evenly, as a scheduler's spread does;
- pack: each node on the first machine in the order given that still takes one (fill one machine,
  then the next), leaving the others whole.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from amlemu.errors import CapacityError, ConfigError
from amlemu.machines.registry import Machine
from amlemu.skus import VmSize

GIB = 1 << 30
EPSILON = 1e-9  # cores are fractional (1.5-core nodes): a sum that should be equal may miss by a bit
UNBOUNDED = 1 << 30
STRATEGIES = ("spread", "pack")
FIX = "add a machine (`amlemu machine add`), or ask for fewer nodes or a smaller size"


@dataclass(frozen=True)
class Free:
    """What a machine has free for new nodes."""

    name: str
    cores: float
    memory_bytes: int
    gpus: int = 0

    @classmethod
    def of(cls, machine: Machine) -> Free:
        """A machine with nothing placed on it yet (its callers subtract the nodes it holds)."""
        return cls(machine.name, machine.cores, machine.memory_bytes, len(machine.gpus))


@dataclass(frozen=True)
class NodeSize:
    """What one node takes; `name` (the VM size) for messages."""

    cores: float
    memory_bytes: int
    gpus: int = 0
    name: str = ""

    @classmethod
    def of(cls, size: VmSize) -> NodeSize:
        """An Azure VM size, whole (as the emulator scales it to a machine is the caller's choice)."""
        return cls(float(size.vcpus), int(size.memory_gib * GIB), size.gpus, size.name)


def fits(machine: Free, size: NodeSize) -> int:
    """How many nodes of `size` the machine takes."""
    counts = [UNBOUNDED]
    for need, free in ((size.cores, machine.cores), (size.memory_bytes, machine.memory_bytes), (size.gpus, machine.gpus)):
        if need > 0:
            counts.append(max(0, math.floor(free / need + EPSILON)))
    return min(counts)


def _amount(value: float, unit: str) -> str:
    if unit == "GiB":
        return f"{value / GIB:.1f} GiB"
    return f"{value:g} {unit}"


def shortfall(count: int, size: NodeSize, machines: Sequence[Free]) -> str:
    """Why `count` nodes of `size` do not fit, as one line: the first resource short in total, else
    what each machine takes (the free amounts are split so no node fits whole)."""
    nodes = f"{count} node{'s' if count != 1 else ''}" + (f" of {size.name}" if size.name else "")
    for need, unit, free_of in ((size.gpus, "GPUs", lambda m: m.gpus), (size.cores, "cores", lambda m: m.cores),
                                (size.memory_bytes, "GiB", lambda m: m.memory_bytes)):
        total = sum(free_of(m) for m in machines)
        if need > 0 and total + EPSILON < need * count:
            free = ", ".join(f"{m.name} ({_amount(free_of(m), unit)} free)" for m in machines)
            return (f"{nodes} need {_amount(need * count, unit)}; machines {free or '(none)'} have "
                    f"{_amount(total, unit)}; {FIX}")
    taken = ", ".join(f"{m.name} takes {fits(m, size)}" for m in machines)
    return (f"{nodes} ({size.cores:g} cores, {_amount(size.memory_bytes, 'GiB')}, {size.gpus} GPUs each) do not fit "
            f"whole: machines {taken or '(none)'}; {FIX}")


def place(count: int, size: NodeSize, machines: Sequence[Free], strategy: str = "spread") -> list[str]:
    """The machine name for each node index 0..count-1; CapacityError (one line naming the
    shortfall) when they cannot all be placed."""
    if strategy not in STRATEGIES:
        raise ConfigError("placement", f"{strategy!r:.60} is not a placement", "use spread or pack")
    if count < 0:
        raise ConfigError("nodes", f"{count} is not a node count", "give 0 or more")
    if len({m.name for m in machines}) != len(machines):
        raise ConfigError("machines", "a machine is named twice", "name each machine once")
    room = [fits(m, size) for m in machines]
    if sum(room) < count:
        raise CapacityError("placement", shortfall(count, size, machines))
    placed: list[str] = []
    for _ in range(count):
        if strategy == "pack":
            chosen = next(i for i, left in enumerate(room) if left > 0)
        else:  # the most room left; max() keeps the first of equals, so ties go in the order given
            chosen = max(range(len(room)), key=lambda i: room[i])
        room[chosen] -= 1
        placed.append(machines[chosen].name)
    return placed
