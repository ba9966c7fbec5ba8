"""Plans as data: what a command would do, one Action per step.

A verb that changes something is split in two: `plan_*` reads the state and returns the Actions
it would take (what `--dry-run` prints), and the verb itself carries out exactly that plan with
`execute`. An Action is its description (JSON-able) plus the call that does it, as a target's
Plan is the request plus its payload.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Action:
    """One step, read as `<verb> <what> <name>` (remove container amlemu-1a2b3c4d-c1-node-0) with
    its details. `run` carries it out; a step without one only informs (a file an upload skips).
    `run` may return a line saying what it did, or False when there was nothing left to do.
    `always`: carried out even after an earlier step failed (a server that must not outlive a
    failed cleanup)."""

    verb: str
    what: str
    name: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    run: Callable[[], Any] | None = field(default=None, compare=False, repr=False)
    always: bool = False

    @property
    def subject(self) -> str:
        return f"{self.what} {self.name}".strip()

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.verb, "what": self.what, **({"name": self.name} if self.name else {}),
                **self.detail, **({"always": True} if self.always else {})}

    def line(self) -> str:
        """The step as one readable line."""
        details = ", ".join(f"{key.replace('_', ' ')} {_text(value)}" for key, value in self.detail.items())
        return f"{self.verb} {self.subject}" + (f" ({details})" if details else "")


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return json.dumps(value, default=str)
    return str(value)


def execute(plan: Iterable[Action]) -> list[str]:
    """Carry out a plan in order. Returns a line per step that did something (its subject, or the
    line its call returned). After a failure only the `always` steps run; then it is raised."""
    done: list[str] = []
    failure: BaseException | None = None
    for action in plan:
        if action.run is None or (failure is not None and not action.always):
            continue
        try:
            result = action.run()
        except BaseException as exc:  # noqa: BLE001 - raised below, after the `always` steps
            failure = failure or exc
            continue
        if result is not False:
            done.append(result if isinstance(result, str) else action.subject)
    if failure is not None:
        raise failure
    return done


def document(plan: Iterable[Action], **extra: Any) -> dict[str, Any]:
    """The JSON document of a dry run."""
    return {"dry_run": True, "actions": [a.to_dict() for a in plan], **extra}
