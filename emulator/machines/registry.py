"""The home's machines: `Machine` records in its state database (the `machines` table of
cluster/records.py's SCHEMA), read and written here through the store's transactions.

`local`, this machine's engine, is always there: never stored (its facts are read when asked, as
they may change), never removable. The store is taken as anything with `transaction()` (the
home's cluster.store.Store), as this package sits below the clusters that use it.
"""
from __future__ import annotations

import functools
import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from amlemu.actions import Action
from amlemu.errors import ConfigError, NotFoundError, StateError
from amlemu.machines.address import TlsFiles
from amlemu.names import MACHINES_ALL, check_machine_name

LOCAL = "local"
GIB = 1 << 30
SHARED, SHIPPED = "shared", "shipped"  # Machine.files
REMOTE_SCHEMES = ("ssh", "tcp")  # an engine on another host; unix:// is taken to be this machine's


class StateStore(Protocol):
    def transaction(self) -> AbstractContextManager[sqlite3.Connection]: ...


@dataclass(frozen=True)
class Machine:
    """A Docker engine nodes may be placed on, with what it had when it was added: cores and memory
    as the engine reports them (`docker info`: NCPU, MemTotal), GPUs by UUID."""

    name: str
    address: str
    cores: float
    memory_bytes: int
    gpus: tuple[str, ...] = ()
    added: float = 0.0
    tls: TlsFiles | None = None
    engine_id: str = ""  # the engine's own ID (`docker info`): the same engine under two names shows
    # Its network, as the swarm and the service link need it (`machine add --service-address`):
    # this machine's address as that machine reaches it (the swarm manager's and the runs' service
    # link), and that machine's own address as this one reaches it (it joins the swarm on it, and
    # this machine's firewall knows its traffic by it). "": not given (then no cluster spans it).
    service_address: str = ""
    advertise_address: str = ""
    # Whether its engine sees this machine's files at their paths ("shared": an engine of this
    # machine) or its nodes' folders are shipped to it ("shipped": another host); "": by the address.
    files: str = ""

    @property
    def ships_files(self) -> bool:
        """Its nodes' disks, caches and environments go to it through its engine (backends/shipping.py):
        asked so (`machine add --files shipped`), or an ssh:// or tcp:// engine, another host."""
        return self.name != LOCAL and (self.files == SHIPPED or
                                       (not self.files and self.address.partition("://")[0] in REMOTE_SCHEMES))

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", tuple(self.gpus))
        if isinstance(self.tls, dict):
            object.__setattr__(self, "tls", TlsFiles(**self.tls))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["gpus"] = list(self.gpus)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Machine:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}  # a later amlemu's extra field
        return cls(**known)

    def summary(self) -> str:
        gpus = f", {len(self.gpus)} GPU(s)" if self.gpus else ""
        return f"{self.cores:g} cores, {self.memory_bytes / GIB:.1f} GiB{gpus}"


def stored(store: StateStore) -> list[Machine]:
    """The machines added to the home, by name (not `local`)."""
    with store.transaction() as db:
        rows = db.execute("SELECT spec FROM machines ORDER BY name").fetchall()
    return [Machine.from_dict(json.loads(row[0])) for row in rows]


def machines(store: StateStore, local: Callable[[], Machine]) -> list[Machine]:
    """Every machine of the home: `local` (made by `local`, engines.local_machine) first."""
    return [local(), *stored(store)]


def names(store: StateStore) -> list[str]:
    return [LOCAL, *(m.name for m in stored(store))]


def get(store: StateStore, name: str, local: Callable[[], Machine]) -> Machine:
    if name == LOCAL:
        return local()
    found = [m for m in stored(store) if m.name == name]
    if not found:
        raise NotFoundError("machine", name, f"known: {', '.join(names(store))}; add one with `amlemu machine add`")
    return found[0]


def check_new(store: StateStore, name: str, address: str) -> None:
    """Before an engine is asked anything: the name is free and the address not added already."""
    check_machine_name(name)
    if name == LOCAL:
        raise ConfigError("name", "'local' is this machine's engine, always there", "give the machine another name")
    for machine in stored(store):
        if machine.name == name:
            raise StateError(f"machine '{name}' already exists ({machine.address}); remove it first or pick "
                             "another name")
        if machine.address == address:
            raise StateError(f"{address} is machine '{machine.name}' already; remove it first to add it again")


def _insert(store: StateStore, machine: Machine) -> None:
    with store.transaction() as db:
        if db.execute("SELECT 1 FROM machines WHERE name = ?", (machine.name,)).fetchone():
            raise StateError(f"machine '{machine.name}' already exists; remove it first or pick another name")
        db.execute("INSERT INTO machines VALUES (?, ?, ?)",
                   (machine.name, json.dumps(machine.to_dict()), machine.added or time.time()))


def plan_add(store: StateStore, machine: Machine) -> list[Action]:
    """Store `machine` (`machine add --dry-run` prints this: the record it would store)."""
    check_new(store, machine.name, machine.address)
    record = {k: v for k, v in machine.to_dict().items() if k != "name"}
    return [Action("add", "machine", machine.name, record, run=functools.partial(_insert, store, machine))]


def _delete(store: StateStore, name: str) -> None:
    with store.transaction() as db:
        db.execute("DELETE FROM machines WHERE name = ?", (name,))


def plan_remove(store: StateStore, name: str, used_by: Sequence[str] = ()) -> list[Action]:
    """Forget machine `name`; refused for `local` and for a machine computes still name
    (`used_by`: their names)."""
    if name == LOCAL:
        raise StateError("machine 'local' is this machine's engine: it is always there and cannot be removed")
    machine = get(store, name, _no_local)
    if used_by:
        raise StateError(f"machine '{name}' is in use by compute {', '.join(used_by)}; delete those computes "
                         "first (`amlemu compute delete`)")
    return [Action("remove", "machine", name, {"address": machine.address},
                   run=functools.partial(_delete, store, name))]


def _no_local() -> Machine:  # not reached: plan_remove refuses `local` first
    raise StateError("machine 'local' cannot be removed")


def resolve(store: StateStore, wanted: Iterable[str]) -> tuple[str, ...]:
    """A compute's --machines, checked against the home's machines at create time: ('all',) is
    every machine known now; an unknown name is refused listing the known ones."""
    wanted = tuple(wanted)
    known = names(store)
    if wanted == (MACHINES_ALL,):
        wanted = tuple(known)
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise ConfigError("--machines", f"no machine named {', '.join(unknown)}",
                          f"known machines: {', '.join(known)} (add one with `amlemu machine add`)")
    return wanted


def check_backend(machines_: Sequence[str], backend: str) -> None:
    """Machines other than this one are Docker engines: only docker nodes can be placed there."""
    elsewhere = [m for m in machines_ if m != LOCAL]
    if elsewhere and backend != "docker":
        raise ConfigError("--machines", f"{', '.join(elsewhere)}: nodes on other machines are containers, and "
                          f"{backend} nodes run on this machine only", "use --backend docker, or leave --machines out")
