"""How a failed `amlemu` command ends: one line on stderr (never a traceback) and az's exit codes.

    0  it worked
    1  an error (bad input, a refusal, a failure on the way)
    2  a command line that does not parse (click's usage errors, a --query that is not JMESPath)
    3  a `show` verb whose resource does not exist (az's ResourceNotFound), or whose workspace
       (-g/-w/--subscription) is not this one

Used by cli/common.py and cli/azshape.py; the command modules reach it through cli/common.py.
"""
from __future__ import annotations

import functools
import sqlite3
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import click

from amlemu.errors import AmlEmuError, NotFoundError, StateDbError
from amlemu.names import escaped

DEBUG_VAR = "AMLEMU_DEBUG"
ERROR_EXIT, USAGE_EXIT, NOT_FOUND_EXIT = 1, 2, 3
SHOW_VERBS = {"show"}  # az ml's show commands: the ones that exit 3 on a missing resource
EXIT_CODES = ("Exit codes: 0 it worked; 1 an error; 2 a command line that does not parse; 3 a `show` "
              "verb whose resource (or -g/-w/--subscription's workspace) does not exist, as az does.")


def one_line(text: str) -> str:
    return " ".join(text.split("\n")).strip() or "(no message)"


def message_of(exc: BaseException) -> str:
    """The one line an exception is shown as."""
    if isinstance(exc, AmlEmuError):
        return one_line(str(exc))
    if isinstance(exc, sqlite3.DatabaseError):  # met after a successful open: a page went bad
        return one_line(str(StateDbError("amlemu.db in the home", f"cannot be read ({exc})")))
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename else ""
        return one_line(f"{where}{exc.strerror}; check the path (run with {DEBUG_VAR}=1 for the traceback)")
    if isinstance(exc, MemoryError):
        return f"out of memory; run with {DEBUG_VAR}=1 for the traceback"
    first = one_line(str(exc).split("\n", 1)[0])
    return (f"unexpected {type(exc).__name__}: {first}; this is a bug in amlemu: run with {DEBUG_VAR}=1 "
            "for the traceback and report it")


def exit_code_of(exc: BaseException) -> int:
    """3 for a missing resource on a `show` verb (the command being run), else 1."""
    ctx = click.get_current_context(silent=True)
    shows = ctx is not None and ctx.command.name in SHOW_VERBS
    return NOT_FOUND_EXIT if shows and isinstance(exc, NotFoundError) else ERROR_EXIT


def fail(exc: BaseException, code: int | None = None) -> NoReturn:
    click.echo(f"amlemu: error: {escaped(message_of(exc))}", err=True)  # a name in it never acts on the terminal
    sys.exit(exit_code_of(exc) if code is None else code)


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The emulator's own errors as one line, with their exit code (the root group catches the rest)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except AmlEmuError as exc:
            fail(exc)
    return wrapper
