"""`amlemu cleanup`: stop what the home runs and forget its runs; --all forgets the workspace's
data too; --reset-state gets a home with an unusable state database going again.

Cleanup must work when the database cannot be read (corrupt, or of a newer amlemu): nodes are
then found the way the backends' reap finds them anyway (Docker labels, node folders), and
supervisors by their command line, which names the home and the run. The whole cleanup is
planned first (emulator/cluster/teardown.py): --dry-run prints that plan, a cleanup carries it out.
"""
from __future__ import annotations

import click

from amlemu.actions import execute
from amlemu.cli.common import (
    cli,
    confirm,
    console,
    dry_run_option,
    handle_errors,
    output_option,
    report,
    show_plan,
    yes_option,
)
from amlemu.cluster import teardown
from amlemu.errors import StateDbError
from amlemu.home import default_cache


def _report(done: list[str], output: str) -> None:
    report(done, output, lambda gone: console.print(f"removed {len(gone)} item(s)" + "".join(f"\n  {g}" for g in gone),
                                                    highlight=False))


@cli.command()
@click.option("--all", "everything", is_flag=True,
              help="also forget the workspace: its settings, datastore records, secrets and the data the emulator "
                   "holds for them (a local datastore's own folder outside the home is left alone)")
@click.option("--all-homes", is_flag=True, help="also the nodes and networks other emulator homes left behind")
@click.option("--reset-state", is_flag=True,
              help="then move the state database aside (kept as amlemu.db.broken-<time>) and start afresh: the "
                   "way out of a corrupt database or one written by a newer amlemu")
@yes_option
@dry_run_option
@output_option
@click.pass_context
@handle_errors
def cleanup(ctx: click.Context, everything: bool, all_homes: bool, reset_state: bool, yes: bool, dry_run: bool,
            output: str) -> None:
    """Stop every job and remove every node, network and run the emulator created (asks first,
    unless --yes; without a terminal, e.g. in CI, --yes is required).

    The workspace and its datastores persist, as a real workspace's do: their settings, records,
    secrets and data stay for the next job. --all removes them too.
    """
    home = ctx.obj.home()
    try:
        emu, broken = ctx.obj(), None
        plan = emu.plan_cleanup(all_homes)
    except StateDbError as exc:
        emu, broken = None, exc
        plan = teardown.plan_reap_without_state(home, all_homes, default_cache())
    store = emu.store if emu is not None else None
    if reset_state:
        plan += teardown.plan_move_state_aside(home, store)
    if everything and (broken is None or reset_state):  # a database set aside is forgotten with it
        plan += teardown.plan_forget_data(home, None if reset_state else store)
    if dry_run:
        show_plan(plan, output)
    else:
        confirm(yes, f"every job of {home.root} will be stopped and its nodes and runs removed"
                     + (", and the workspace's datastores and data forgotten" if everything else "")
                     + f" ({len(plan)} action(s); --dry-run lists them)")
        _report(execute(plan), output)
    if broken is not None and not reset_state:
        raise broken  # the way out (--reset-state) in one line, after what could be done was done
