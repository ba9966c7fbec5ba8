"""`amlemu job validate -f job.yml`: would AmlCompute accept this job? (emulator/validate.py)"""
from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

import click

from amlemu.cli.common import console, emit, emulator_of, escaped, handle_errors, is_human, job, output_option
from amlemu.validate import validate_file


@job.command("validate")
@click.option("-f", "--file", "file", type=click.Path(path_type=Path), required=True, help="job YAML (CLI v2)")
@click.option("-n", "--name", default=None, help="the job's name (instead of the YAML's)")
@click.option("--set", "overrides", multiple=True, metavar="FIELD=VALUE", help="override a field, as az ml does")
@output_option
@click.pass_context
@handle_errors
def job_validate(ctx: click.Context, file: Path, name: str | None, overrides: tuple[str, ...], output: str) -> None:
    """Check the job against Azure ML's rules and this workspace; exit 1 on any error."""
    findings = validate_file(file, [*overrides, *([f"name={name}"] if name else [])], emulator_of(ctx))
    if not is_human(output):
        emit([asdict(f) for f in findings], output)
    else:
        for finding in findings:
            console.print(escaped(finding.line()), highlight=False, soft_wrap=True, markup=False)
        errors = sum(f.severity == "error" for f in findings)
        console.print(f"{file}: {errors} error(s), {len(findings) - errors} warning(s)", highlight=False)
    if any(f.severity == "error" for f in findings):
        sys.exit(1)
