"""`amlemu job validate -f job.yml`: would AmlCompute accept this job? (emulator/validate.py)"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import click

from emulator.cli.common import _emu, console, handle_errors, job, output_option
from emulator.validate import validate_file


@job.command("validate")
@click.option("-f", "--file", "file", type=click.Path(path_type=Path), required=True, help="job YAML (CLI v2)")
@click.option("--set", "overrides", multiple=True, metavar="FIELD=VALUE", help="override a field, as az ml does")
@output_option
@click.pass_context
@handle_errors
def job_validate(ctx: click.Context, file: Path, overrides: tuple[str, ...], output: str) -> None:
    """Check the job against Azure ML's rules and this workspace; exit 1 on any error."""
    findings = validate_file(file, list(overrides), _emu(ctx))
    if output == "json":
        click.echo(json.dumps([asdict(f) for f in findings], indent=2))
    else:
        for finding in findings:
            console.print(finding.line(), highlight=False, soft_wrap=True)
        errors = sum(f.severity == "error" for f in findings)
        console.print(f"{file}: {errors} error(s), {len(findings) - errors} warning(s)", highlight=False)
    if any(f.severity == "error" for f in findings):
        sys.exit(1)
