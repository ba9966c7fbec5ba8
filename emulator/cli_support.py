"""What every `amlemu` command shares: errors as one line (never a traceback) and the home rule.

Every failure reaches the user as `amlemu: error: <field>: <problem>; <fix>` on stderr with a
non-zero exit: the emulator's own errors (exit 1), a command line click cannot parse (exit 2),
a state database that cannot be used (with the way out), and anything unexpected (one line
saying so, and how to see the traceback: AMLEMU_DEBUG=1).
"""
from __future__ import annotations

import functools
import os
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click
from click.core import ParameterSource

from .errors import AmlEmuError, ConfigError, StateDbError

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
        from .home import Home  # noqa: PLC0415

        self.check()
        return Home.at(self.path)

    def __call__(self, backend: str | None = None) -> Any:
        from .api import Emulator  # noqa: PLC0415

        self.check()
        return Emulator(self.path, backend=backend)
