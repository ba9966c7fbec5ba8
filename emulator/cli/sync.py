"""`amlemu data sync`: the emulator's datastore content -> the real workspace's datastores."""
from __future__ import annotations

from pathlib import Path

import click

from amlemu.actions import Action
from amlemu.cli.common import (
    console,
    data,
    dry_run_option,
    emit,
    emulator_of,
    handle_errors,
    is_human,
    output_option,
    progress_bar,
    show_plan,
    workspace_options,
)
from amlemu.errors import ConfigError
from amlemu.targets.azureml import AzureMLTarget
from amlemu.targets.datasync import job_data_uris, plan_sync, sync


@data.command("sync", workspace="azureml")
@click.argument("uris", nargs=-1, metavar="[azureml://datastores/<ds>/paths/<path>]...")
@click.option("-f", "--file", "job_file", type=click.Path(path_type=Path), help="sync every datastore input of this job")
@dry_run_option
@output_option
@click.pass_context
@handle_errors
def data_sync(ctx: click.Context, uris: tuple[str, ...], job_file: Path | None, dry_run: bool, output: str) -> None:
    """Copy datastore paths from the emulator to the real workspace's datastore of the same name
    (workspace and credential as for --target azureml); files already there with the same size
    are skipped. --subscription, -g and -w name that real workspace."""
    wanted = list(uris) + (job_data_uris(job_file) if job_file else [])
    if not wanted:
        raise ConfigError("URI", "nothing to sync", "give azureml://datastores/<ds>/paths/<path> or -f job.yml")
    emu, target = emulator_of(ctx), AzureMLTarget(options=workspace_options(ctx))
    if dry_run:
        plan: list[Action] = []
        for uri in wanted:
            plan += plan_sync(emu, target, uri)[0]
        show_plan(plan, output)
        return
    lines = []
    for uri in wanted:
        bar, update = progress_bar(f"sync {uri.rsplit('/', 1)[-1] or uri}")
        with bar:
            result = sync(emu, target, uri, update)
        lines.append(f"{uri} -> {result.destination}: {len(result.copied)} file(s) copied, "
                     f"{len(result.skipped)} already there")
        if is_human(output):  # each as it is done
            console.print(lines[-1], highlight=False)
    if not is_human(output):
        emit({"done": lines}, output)
