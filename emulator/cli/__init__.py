"""The `amlemu` command line, with verbs shaped after `az ml`. One module per command group; every
module imports its groups and helpers from cli.common and none imports another."""
from __future__ import annotations

from amlemu.cli import (  # noqa: F401 - each registers
    assets,
    cleanup,
    compute,
    components,  # amlemu component (pipelines/registry.py)
    convert,
    data,
    environment,
    faults,
    jobs,
    machines,
    serve,
    sync,
    ui,
    validate,  # its commands on the groups of cli.common
    workspace,
)
from amlemu.cli.common import cli


def main() -> None:
    cli(prog_name="amlemu")
