"""What makes `amlemu` read like `az ml`: the root group's one-line errors, az's workspace options
on every command, `-n/--name` (the positional name kept as an alias), `--yes` on destructive verbs
and `--version`. Used by cli/common.py only; the command modules reach it through there."""
from __future__ import annotations

import functools
import os
import sys
import tomllib
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import click

from amlemu.cli.failure import DEBUG_VAR, fail, one_line
from amlemu.errors import AmlEmuError, ConfigError
from amlemu.targets import WorkspaceOptions

META_WORKSPACE = "amlemu.workspace"
WORKSPACE_DECLS = {"subscription_id": ("--subscription",), "resource_group": ("-g", "--resource-group"),
                   "workspace_name": ("-w", "--workspace-name")}
WORKSPACE_HELP = {"subscription_id": "the subscription's id", "resource_group": "the resource group's name",
                  "workspace_name": "the workspace's name"}


def _remember(key: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is not None:
            ctx.meta.setdefault(META_WORKSPACE, {})[key] = value
    return callback


def workspace_options(ctx: click.Context) -> WorkspaceOptions:
    """The workspace the command line named with --subscription, -g and -w (what was given)."""
    return WorkspaceOptions(**ctx.meta.get(META_WORKSPACE, {}))


class AzCommand(click.Command):
    """A command that takes az's --subscription, -g/--resource-group and -w/--workspace-name.

    `workspace` says whose workspace they name: "emulator" (checked against the emulated
    workspace before the command runs: a mismatch is one line naming the option and the
    workspace's value), "target" (handed to the command's target: the emulator checks them, the
    azureml target looks its workspace up with them), "azureml" (the real workspace the command
    writes to). An option the command has itself under the same name (workspace set's
    --resource-group) stays the command's own.
    """

    def __init__(self, *args: Any, workspace: str = "emulator", workspace_aliases: tuple[str, ...] = (),
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.workspace_scope = workspace
        taken = {opt for param in self.params for opt in param.opts}
        for key, decls in WORKSPACE_DECLS.items():
            decls = tuple(d for d in decls + (workspace_aliases if key == "workspace_name" else ()) if d not in taken)
            if not any(d.startswith("--") for d in decls):
                continue
            whose = "the emulated workspace's" if workspace == "emulator" else "the workspace's"
            self.params.append(click.Option((*decls, f"az_{key}"), metavar="NAME" if key != "subscription_id" else "ID",
                                            expose_value=False, callback=_remember(key),
                                            help=f"{WORKSPACE_HELP[key]}, checked against {whose}"
                                            if workspace == "emulator" else WORKSPACE_HELP[key]))

    def invoke(self, ctx: click.Context) -> Any:
        options = workspace_options(ctx)
        if self.workspace_scope == "emulator" and options.given():
            try:
                options.check(ctx.obj().workspace())
            except AmlEmuError as exc:
                fail(exc)
        return super().invoke(ctx)


class OneLineGroup(click.Group):
    """A click group whose every error, its own usage errors included, is one line on stderr; its
    commands are AzCommands, its subgroups OneLineGroups."""

    command_class = AzCommand
    group_class = type

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
            click.echo(f"amlemu: error: {one_line(exc.format_message()).rstrip('.')}; see `{path} --help`", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"amlemu: error: {one_line(exc.format_message())}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("amlemu: aborted", err=True)
            sys.exit(130)
        except SystemExit:
            raise
        except Exception as exc:  # noqa: BLE001 - the last line of defence: no traceback reaches a user
            if os.environ.get(DEBUG_VAR):
                raise
            fail(exc, 1)
        sys.exit(rv if isinstance(rv, int) else 0)  # non-standalone main returns Exit's code


# --- -n/--name -------------------------------------------------------------------------------------
def name_argument(what: str, param: str = "name") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`-n/--name NAME` as az ml takes it, and the positional NAME of earlier amlemu versions (the
    same value either way; giving both, different, is a usage error)."""
    positional, option = f"{param}_positional", f"{param}_option"

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            given = {v for v in (kwargs.pop(positional), kwargs.pop(option)) if v is not None}
            ctx = click.get_current_context()
            if not given:
                raise click.UsageError(f"Missing option '-n' / '--name' (the {what}'s name)", ctx)
            if len(given) > 1:
                raise click.UsageError(f"two {what} names given ({', '.join(sorted(given))}): give one, as -n NAME",
                                       ctx)
            return fn(*args, **{**kwargs, param: given.pop()})
        wrapper = click.option("-n", "--name", option, metavar="NAME", help=f"the {what}'s name")(wrapper)
        return click.argument(positional, required=False, metavar="[NAME]")(wrapper)
    return decorate


# --- --yes -----------------------------------------------------------------------------------------
yes_option = click.option("-y", "--yes", is_flag=True,
                          help="do not prompt for confirmation (without a terminal, e.g. in CI, it is required)")


def stdin_is_terminal() -> bool:
    try:
        return sys.stdin.isatty()
    except ValueError:  # closed
        return False


def confirm(yes: bool, what: str) -> None:
    """A destructive verb goes ahead with --yes, or once a terminal said yes; without a terminal to
    ask on it is refused, as az refuses (`Unable to prompt for confirmation as no tty available`)."""
    if yes:
        return
    if not stdin_is_terminal():
        raise ConfigError("--yes", f"{what}, and there is no terminal to ask for confirmation",
                          "pass --yes (-y) to go ahead")
    if not click.confirm(f"{what}. Are you sure you want to perform this operation?", default=False, err=True):
        raise AmlEmuError("operation cancelled; nothing was done")


# --- --version -------------------------------------------------------------------------------------
def version() -> str:
    """The installed distribution's version; from a source tree, pyproject.toml's."""
    try:
        return metadata.version("amlemu")
    except metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        try:
            return str(tomllib.loads(pyproject.read_text())["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown"


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"amlemu {version()}")
        ctx.exit(0)


version_option = click.option("--version", is_flag=True, expose_value=False, is_eager=True,
                              callback=_print_version, help="print amlemu's version and exit")
