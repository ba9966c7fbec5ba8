"""`amlemu job convert FILE.py`: an SDK v1 submission script -> the CLI v2 job YAML (emulator/sdk1.py)."""
from __future__ import annotations

from pathlib import Path

import click

from amlemu.cli.common import console, handle_errors, job
from amlemu.jobs.sdk1 import load_v1_file, yaml_from_v1


@job.command("convert")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--variable", metavar="NAME", help="the module-level ScriptRunConfig/estimator, when the file has several")
@click.option("--compute", metavar="NAME", help="the cluster, instead of the config's compute_target")
@click.option("--experiment-name", metavar="NAME", help="default: the source directory's name")
@click.option("-o", "--output-file", type=click.Path(path_type=Path, dir_okay=False),
              help="write the YAML here (code is written relative to it); default: print it")
@handle_errors
def job_convert(file: Path, variable: str | None, compute: str | None, experiment_name: str | None,
                output_file: Path | None) -> None:
    """Print the v2 job YAML for a v1 ScriptRunConfig or estimator (the file's submit does not run)."""
    src = load_v1_file(file, variable)
    folder = output_file.resolve().parent if output_file else Path.cwd()
    text = yaml_from_v1(src, compute=compute, experiment_name=experiment_name, relative_to=folder)
    if output_file is None:
        click.echo(text, nl=False)
        return
    output_file.parent.mkdir(parents=True, exist_ok=True)
    output_file.write_text(text)
    console.print(f"wrote {output_file}", highlight=False)
