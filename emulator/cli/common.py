"""What every `amlemu` command shares: its groups, az's options, the output formats, the home rule
and errors as one line (never a traceback).

Every failure reaches the user as `amlemu: error: <field>: <problem>; <fix>` on stderr with az's
exit codes (cli/failure.py: 1 an error, 2 a command line that does not parse, 3 a `show` verb whose
resource does not exist), a state database that cannot be used with the way out, and anything
unexpected as one line saying so and how to see the traceback (AMLEMU_DEBUG=1). The command
modules import from here alone: cli/failure.py, cli/azshape.py and cli/output.py are reached
through this module.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console

from amlemu.actions import Action, document
from amlemu.api import Emulator
from amlemu.cli import output as formats
from amlemu.cli.azshape import (  # noqa: F401 - re-exported for the command modules
    OneLineGroup,
    confirm,
    name_argument,
    version_option,
    workspace_options,
    yes_option,
)
from amlemu.cli.failure import EXIT_CODES, fail, handle_errors  # noqa: F401 - re-exported
from amlemu.errors import ConfigError
from amlemu.jobs.jobyaml import apply_overrides  # noqa: F401 - `--set`, for compute create as for jobs
from amlemu.names import escaped  # noqa: F401 - re-exported: a name printed outside emit()
from amlemu.specs import ClusterSpec, Priority
from amlemu.targets import TARGETS, Target, resolve_target, target_class

META_QUERY = "amlemu.query"


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
        from amlemu.home import Home  # noqa: PLC0415

        self.check()
        return Home.at(self.path)

    def __call__(self, backend: str | None = None) -> Any:
        from amlemu.api import Emulator  # noqa: PLC0415

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


# --- -o/--output and --query (cli/output.py formats) ---------------------------------------------
def _remember_query(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        try:
            ctx.meta[META_QUERY] = formats.compile_query(value)
        except ValueError as exc:
            raise click.BadParameter(f"not a JMESPath query ({exc})", ctx, param) from None


def output_option(fn: Callable[..., Any] | None = None, *, default: str = "table") -> Any:
    """-o/--output (az's formats; table: the command's own human form) and --query (JMESPath,
    applied before formatting). `@output_option` or `@output_option(default="json")`."""
    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        f = click.option("--query", metavar="JMESPATH", expose_value=False, callback=_remember_query,
                         help="JMESPath query applied to the data before it is printed (https://jmespath.org)")(f)
        return click.option("-o", "--output", type=click.Choice(formats.FORMATS, case_sensitive=False),
                            default=default, show_default=True,
                            help="json/yaml for scripts, tsv for shell variables, jsonc/yamlc colored, "
                                 "none prints nothing")(f)
    return decorate(fn) if fn is not None else decorate


def _query() -> Any:
    ctx = click.get_current_context(silent=True)
    return ctx.meta.get(META_QUERY) if ctx is not None else None


def _output_by_default() -> bool:
    """-o was not given (the command's default applies)."""
    ctx = click.get_current_context(silent=True)
    return ctx is not None and ctx.get_parameter_source("output") in (None, click.core.ParameterSource.DEFAULT)


def is_human(output: str) -> bool:
    """-o table without --query: the command prints its own human form."""
    return output == "table" and _query() is None


def emit(data: Any, output: str, human: Callable[[Any], Any] | None = None) -> None:
    """Print a command's data: its human form (-o table), else in the -o format after --query."""
    if is_human(output) and human is not None:
        human(formats.printable(data, formats.UNSAFE_KEEPING_LINES))  # names never reach the terminal raw
        return
    query, data = _query(), formats.plain(data)
    if query is not None:
        data = formats.apply_query(query, data)
        if _output_by_default():  # az's own default is json: `$(az ml job show --query x)` scripts read it
            output = "json"
    click.echo(formats.render(data, output, queried=query is not None), nl=False)


@click.group(cls=OneLineGroup, epilog=EXIT_CODES)
@click.option("--home", envvar="AMLEMU_HOME", type=click.Path(path_type=Path), default=None,
              help="emulator home (the emulated workspace); default $AMLEMU_HOME or ~/.amlemu, created on "
                   "first use; a --home folder must exist already")
@version_option
@click.pass_context
def cli(ctx: click.Context, home: Path | None) -> None:
    """amlemu: an Azure ML Compute cluster on this machine, driven as `az ml` drives the real one."""
    ctx.obj = EmulatorFactory(home, ctx.get_parameter_source("home"))


def emulator_of(ctx: click.Context, backend: str | None = None) -> Emulator:
    return ctx.obj(backend=backend)


target_option = click.option("--target", "target_name", type=click.Choice(list(TARGETS)), default=None,
                             help="where it goes: emulator or azureml (default: $AMLEMU_TARGET, else "
                                  "[tool.amlemu] target in pyproject.toml, else emulator)")


def target_of(ctx: click.Context, explicit: str | None, backend: str | None = None) -> Target:
    """The command's target, given the workspace the command line named (-g/-w/--subscription)."""
    name, _ = resolve_target(explicit, os.environ, Path.cwd())
    return target_class(name).for_cli(lambda: emulator_of(ctx, backend), workspace_options(ctx))


def target_flag(explicit: str | None) -> str:
    """` --target <name>` for a command to suggest, unless the target is the default one."""
    name, source = resolve_target(explicit, os.environ, Path.cwd())
    return "" if source == "default" else f" --target {name}"


# --- dry runs ------------------------------------------------------------------------------------
dry_run_option = click.option("--dry-run", is_flag=True,
                              help="print the actions it would take (-o json: as a JSON document) and do nothing")


def show_plan(plan: list[Action], output: str) -> None:
    """A dry run's plan: a line per action, or the plan's document in the -o format."""
    def human(_: Any) -> None:
        console.print(f"dry run: {len(plan)} action(s), none taken" + ("" if plan else " (nothing to do)"),
                      highlight=False)
        for action in plan:
            console.print(f"  {escaped(action.line())}", highlight=False, markup=False)
    emit(document(plan), output, human)


def report(done: list[str], output: str, human: Callable[[list[str]], None]) -> None:
    """What a verb did: {"done": [...]} in the -o format, else (-o table) the verb's own words."""
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
def environment() -> None:
    """Environments registered in the workspace (az ml's environment YAML), for `azureml:<name>@latest`."""


@cli.group()
def data() -> None:
    """Data assets (create, list, show, archive) and data in and out of datastores (upload, download, ls)."""


@cli.group()
def model() -> None:
    """Model assets (custom_model, mlflow_model, triton_model), for jobs' azureml:<name>:<version> inputs."""


@cli.group()
def machine() -> None:
    """Machines: the Docker engines nodes may be placed on (this one, `local`, is always there)."""


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
