"""`amlemu datastore ...` and `amlemu data ...`: the workspace's datastores and the data on them."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from amlemu.cli.common import (
    console,
    data,
    datastore,
    dry_run_option,
    emit,
    emulator_of,
    handle_errors,
    name_argument,
    output_option,
    progress_bar,
    report,
    show_plan,
)
from amlemu.errors import NotFoundError
from amlemu.storage.datastores import DatastoreSpec, credential_from_env, parse_uri

# --- datastores and data ---------------------------------------------------------------------------


@datastore.command("list")
@output_option
@click.pass_context
@handle_errors
def datastore_list(ctx: click.Context, output: str) -> None:
    rows = [asdict(d) for d in emulator_of(ctx).datastores.list()]

    def human(data: list[dict[str, Any]]) -> None:
        table = Table("name", "type", "where", "credential")
        for d in data:
            where = d["folder"] or (f"{d['account'] or 'azurite'}/{d['container']}")
            table.add_row(d["name"], d["kind"], where, d["credential"])
        console.print(table)
    emit(rows, output, human)


@datastore.command("show")
@name_argument("datastore")
@output_option(default="json")
@click.pass_context
@handle_errors
def datastore_show(ctx: click.Context, name: str, output: str) -> None:
    """The datastore's record (JSON unless -o says otherwise, as it always was)."""
    emit(asdict(emulator_of(ctx).datastores.get(name)), output,
         lambda d: [console.print(f"{k}: {v}", highlight=False, markup=False) for k, v in d.items()])


@datastore.command("create")
@click.option("-n", "--name", required=True)
@click.option("--type", "kind", type=click.Choice(["local", "azurite", "azure_blob"]), required=True)
@click.option("--path", "folder", type=click.Path(path_type=Path), help="folder of a local datastore")
@click.option("--account-name", default="")
@click.option("--container-name", default="")
@click.option("--account-key-env", metavar="VAR", help="environment variable holding the account key")
@click.option("--sas-token-env", metavar="VAR", help="environment variable holding a SAS token")
@click.option("--identity", is_flag=True, help="authenticate with DefaultAzureCredential")
@click.option("--endpoint", default="", help="blob endpoint other than https://<account>.blob.core.windows.net")
@dry_run_option
@output_option
@click.pass_context
@handle_errors
def datastore_create(ctx: click.Context, name: str, kind: str, folder: Path | None, account_name: str,
                     container_name: str, account_key_env: str | None, sas_token_env: str | None,
                     identity: bool, endpoint: str, dry_run: bool, output: str) -> None:
    """Secrets are read from environment variables, never from the command line (shell history)."""
    credential = "account_key" if account_key_env else "sas" if sas_token_env else \
        "identity" if identity else "none"
    spec = DatastoreSpec(name, kind, container=container_name, account=account_name,
                         folder=str(folder.resolve()) if folder else "", credential=credential, endpoint=endpoint)
    datastores = emulator_of(ctx).datastores
    secret = credential_from_env(account_key_env or sas_token_env)
    if dry_run:
        show_plan(datastores.plan_create(spec, secret), output)
        return
    datastores.create(spec, secret)
    report([name], output, lambda _: console.print(f"created datastore {name} ({kind})", highlight=False))


@data.command("upload")
@click.argument("local", type=click.Path(exists=True, path_type=Path))
@click.argument("uri")
@dry_run_option
@output_option
@click.pass_context
@handle_errors
def data_upload(ctx: click.Context, local: Path, uri: str, dry_run: bool, output: str) -> None:
    """Copy a file or folder up; files already there with the same size are skipped."""
    if dry_run:
        show_plan(emulator_of(ctx).datastores.plan_upload(local, uri), output)
        return
    bar, update = progress_bar(f"upload {local.name}")
    with bar:
        size = emulator_of(ctx).datastores.upload(local, uri, update)
    report([uri], output, lambda _: console.print(f"{uri}: {size / 2**20:.1f} MiB in place", highlight=False))


@data.command("download")
@click.argument("uri")
@click.argument("local", type=click.Path(path_type=Path))
@dry_run_option
@output_option
@click.pass_context
@handle_errors
def data_download(ctx: click.Context, uri: str, local: Path, dry_run: bool, output: str) -> None:
    if dry_run:
        show_plan(emulator_of(ctx).datastores.plan_download(uri, local), output)
        return
    bar, update = progress_bar(f"download {uri.rsplit('/', 1)[-1]}")
    with bar:
        size = emulator_of(ctx).datastores.download(uri, local, update)
    report([str(local)], output, lambda _: console.print(f"downloaded {size / 2**20:.1f} MiB to {local}",
                                                         highlight=False))


@data.command("ls")
@click.argument("uri")
@output_option
@click.pass_context
@handle_errors
def data_ls(ctx: click.Context, uri: str, output: str) -> None:
    rows = [{"path": p, "size": size} for p, size in emulator_of(ctx).datastores.ls(uri)]
    name, path = parse_uri(uri)
    if not rows and path:  # a datastore's empty root is a listing; a missing path is an error
        raise NotFoundError("path", uri, f"list what is there with `amlemu data ls azureml://datastores/{name}/paths/`")
    emit(rows, output, lambda d: [console.print(f"{r['size']:>12}  {r['path']}", highlight=False) for r in d])
