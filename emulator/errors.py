"""The emulator's errors: one small hierarchy, each message one line that names the field and the fix."""
from __future__ import annotations


class AmlEmuError(Exception):
    """Base class: the CLI prints these as one line, without a traceback."""


class ConfigError(AmlEmuError):
    """Bad input in a cluster or job definition."""

    def __init__(self, field: str, problem: str, fix: str | None = None) -> None:
        self.field, self.problem, self.fix = field, problem, fix
        super().__init__(f"{field}: {problem}" + (f"; {fix}" if fix else ""))


class NotFoundError(AmlEmuError):
    """A named thing that does not exist. A `show` verb exits 3 on it, as az does (ResourceNotFound);
    `message` replaces the default wording where the thing is better said otherwise."""

    def __init__(self, kind: str, name: str, hint: str = "", message: str | None = None) -> None:
        self.kind, self.name = kind, name
        super().__init__(message or f"{kind} '{name}' not found" + (f"; {hint}" if hint else ""))


class CapacityError(ConfigError):
    """A job that can never fit its cluster (more nodes than its max_instances)."""


def name_taken(name: str, field: str = "name") -> ConfigError:
    """A job name the workspace has: one wording wherever it is refused (validate, submit, the service)."""
    return ConfigError(field, f"a job named '{name}' already exists in this workspace",
                       "pick another name, or leave name out for a generated one")


class StateError(AmlEmuError):
    """An operation that the object's current state does not allow (e.g. an invalid transition)."""


class BackendError(AmlEmuError):
    """A node backend could not do what was asked (engine missing, container failed to start)."""


class MachineError(BackendError):
    """A machine's Docker engine could not be reached or read (`amlemu machine add`)."""


class TargetError(AmlEmuError):
    """A submission target could not do what was asked (no workspace, no credential, a service error)."""


class StateDbError(StateError):
    """The home's state database cannot be used: corrupt, unreadable, or written by a newer amlemu."""

    def __init__(self, path: object, problem: str) -> None:
        self.path = path
        super().__init__(f"state database {path}: {problem}; run `amlemu cleanup --reset-state` to stop what "
                         f"the home runs and move the database aside (or move {path} away yourself)")


class BuildError(AmlEmuError):
    """A job's environment could not be built (as Azure ML's image build fails the job)."""
