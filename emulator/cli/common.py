"""What every `amlemu` command shares: errors as one line (never a traceback) and the home rule.

Every failure reaches the user as `amlemu: error: <field>: <problem>; <fix>` on stderr with a
non-zero exit: the emulator's own errors (exit 1), a command line click cannot parse (exit 2),
a state database that cannot be used (with the way out), and anything unexpected (one line
saying so, and how to see the traceback: AMLEMU_DEBUG=1).
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click
from click.core import ParameterSource
from rich.console import Console

from emulator.actions import Action, document
from emulator.api import Emulator
from emulator.errors import AmlEmuError, ConfigError, StateDbError
from emulator.specs import ClusterSpec, Priority
from emulator.targets import TARGETS, Target, resolve_target, target_class

DEBUG_VAR = "AMLEMU_DEBUG"
USAGE_EXIT = 2  # click's own code for a command line it cannot parse


def _one_line(text: str) -> str:
    return " ".join(text.split("\n")).strip() or "(no message)"


def message_of(exc: BaseException) -> str:
    """The one line an exception is shown as."""
    if isinstance(exc, AmlEmuError):
        return _one_line(str(exc))
    if isinstance(exc, sqlite3.DatabaseError):  # met after a successful open: a page went bad
        return _one_line(str(StateDbError("amlemu.db in the home", f"cannot be read ({exc})")))
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename else ""
        return _one_line(f"{where}{exc.strerror}; check the path (run with {DEBUG_VAR}=1 for the traceback)")
    if isinstance(exc, MemoryError):
        return f"out of memory; run with {DEBUG_VAR}=1 for the traceback"
    first = _one_line(str(exc).split("\n", 1)[0])
    return (f"unexpected {type(exc).__name__}: {first}; this is a bug in amlemu: run with {DEBUG_VAR}=1 "
            "for the traceback and report it")


def fail(exc: BaseException, code: int = 1) -> NoReturn:
    click.echo(f"amlemu: error: {message_of(exc)}", err=True)
    sys.exit(code)


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Kept for the commands that carry it: the group below now catches for every command."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except AmlEmuError as exc:
            fail(exc)
    return wrapper


class OneLineGroup(click.Group):
    """A click group whose every error, its own usage errors included, is one line on stderr."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:  # `amlemu job`: the help is the answer
            exc.show()
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            path = exc.ctx.command_path if exc.ctx else "amlemu"
            click.echo(f"amlemu: error: {_one_line(exc.format_message()).rstrip('.')}; see `{path} --help`", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"amlemu: error: {_one_line(exc.format_message())}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("amlemu: aborted", err=True)
            sys.exit(130)
        except SystemExit:
            raise
        except Exception as exc:  # noqa: BLE001 - the last line of defence: no traceback reaches a user
            if os.environ.get(DEBUG_VAR):
                raise
            fail(exc)
        sys.exit(rv if isinstance(rv, int) else 0)  # non-standalone main returns Exit's code


# --- the home ------------------------------------------------------------------------------------
class EmulatorFactory:
    """What `ctx.obj` holds: makes the command's Emulator on first need, after the home rule:
    the default home and $AMLEMU_HOME are created on first use (documented places); a --home
    that does not exist is refused, so a typo never starts an empty workspace unnoticed."""

    def __init__(self, home: Path | None, source: ParameterSource | None) -> None:
        self.path, self.explicit = home, source is ParameterSource.COMMANDLINE

    def check(self) -> None:
        if self.explicit and self.path is not None and not self.path.exists():
            raise ConfigError("--home", f"{self.path} does not exist",
                              f"create it first (mkdir -p {self.path}), or leave --home out: $AMLEMU_HOME and "
                              "~/.amlemu are created on first use")

    def home(self) -> Any:
        from emulator.home import Home  # noqa: PLC0415

        self.check()
        return Home.at(self.path)

    def __call__(self, backend: str | None = None) -> Any:
        from emulator.api import Emulator  # noqa: PLC0415

        self.check()
        return Emulator(self.path, backend=backend)


# --- shared by every command module --------------------------------------------------------------
console = Console(soft_wrap=True)  # paths and ids must survive copy-paste unbroken
err_console = Console(stderr=True, soft_wrap=True)

COMPUTE_FIELDS = {"$schema", "name", "type", "size", "min_instances", "max_instances",
                  "idle_time_before_scale_down", "tier", "description", "location", "identity"}


def compute_from_dict(data: dict[str, Any]) -> ClusterSpec:
    """The `az ml compute create -f` YAML (v2 names) -> ClusterSpec."""
    if not isinstance(data, dict):
        raise ConfigError("compute", "the YAML must be a mapping of compute fields", "see `az ml compute create -f`")
    unknown = sorted(set(data) - COMPUTE_FIELDS)
    if unknown:
        raise ConfigError(unknown[0], "unknown field", f"known fields: {', '.join(sorted(COMPUTE_FIELDS))}")
    if str(data.get("type", "amlcompute")).lower() != "amlcompute":
        raise ConfigError("type", f"'{data['type']}' is not emulated", "use type: amlcompute")
    if "name" not in data:
        raise ConfigError("name", "missing", "give the compute a name")
    return ClusterSpec(
        name=str(data["name"]), vm_size=str(data.get("size", "Standard_D2_v2")),
        vm_priority=Priority.parse(str(data.get("tier", "dedicated"))),
        min_nodes=data.get("min_instances", 0), max_nodes=data.get("max_instances", 4),
        idle_seconds_before_scaledown=data.get("idle_time_before_scale_down", 120))


def emit(data: Any, output: str, human) -> None:  # type: ignore[no-untyped-def]
    if output == "json":
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        human(data)


output_option = click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table",
                             show_default=True, help="json for scripts")


@click.group(cls=OneLineGroup)
@click.option("--home", envvar="AMLEMU_HOME", type=click.Path(path_type=Path), default=None,
              help="emulator home (the emulated workspace); default $AMLEMU_HOME or ~/.amlemu, created on "
                   "first use; a --home folder must exist already")
@click.pass_context
def cli(ctx: click.Context, home: Path | None) -> None:
    """amlemu: an Azure ML Compute cluster on this machine."""
    ctx.obj = EmulatorFactory(home, ctx.get_parameter_source("home"))


def _emu(ctx: click.Context, backend: str | None = None) -> Emulator:
    return ctx.obj(backend=backend)


target_option = click.option("--target", "target_name", type=click.Choice(list(TARGETS)), default=None,
                             help="where it goes: emulator or azureml (default: $AMLEMU_TARGET, else "
                                  "[tool.amlemu] target in pyproject.toml, else emulator)")


def _target(ctx: click.Context, explicit: str | None, backend: str | None = None) -> Target:
    name, _ = resolve_target(explicit, os.environ, Path.cwd())
    return target_class(name).for_cli(lambda: _emu(ctx, backend))


def target_flag(explicit: str | None) -> str:
    """` --target <name>` for a command to suggest, unless the target is the default one."""
    name, source = resolve_target(explicit, os.environ, Path.cwd())
    return "" if source == "default" else f" --target {name}"


# --- dry runs ------------------------------------------------------------------------------------
dry_run_option = click.option("--dry-run", is_flag=True,
                              help="print the actions it would take (-o json: as a JSON document) and do nothing")


def show_plan(plan: list[Action], output: str) -> None:
    """A dry run's plan: a JSON document, or a line per action."""
    if output == "json":
        click.echo(json.dumps(document(plan), indent=2, default=str))
        return
    console.print(f"dry run: {len(plan)} action(s), none taken" + ("" if plan else " (nothing to do)"), highlight=False)
    for action in plan:
        console.print(f"  {action.line()}", highlight=False, markup=False)


def report(done: list[str], output: str, human: Callable[[list[str]], None]) -> None:
    """What a verb did: {"done": [...]} for -o json, else the verb's own words."""
    emit({"done": done}, output, lambda d: human(d["done"]))


# --- the command groups (each command module adds its verbs) -------------------------------------
@cli.group()
def workspace() -> None:
    """The emulated workspace (placeholders for subscription, resource group, name)."""


@cli.group()
def compute() -> None:
    """AmlCompute clusters."""


@cli.group()
def job() -> None:
    """Jobs (runs) on the emulated clusters."""


@cli.group()
def datastore() -> None:
    """The workspace's datastores (workspaceblobstore is the default)."""


@cli.group()
def data() -> None:
    """Move data in and out of datastores (azureml://datastores/<name>/paths/<path>)."""


@cli.group()
def fault() -> None:
    """Inject a fault into a node of an emulated compute."""

def progress_bar(label: str):  # type: ignore[no-untyped-def]
    if not err_console.is_terminal:  # a pipe or a CI log: no bar (it would leave a stray blank line)
        return contextlib.nullcontext(), None
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn  # noqa: PLC0415

    progress = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                        TransferSpeedColumn(), console=err_console, transient=True)
    task = progress.add_task(label, total=None)
    return progress, lambda done, total: progress.update(task, completed=done, total=total)
