"""`amlemu compute preempt|preemption-policy` and `amlemu fault ...`: faults injected on purpose,
each logged in the affected run's system_logs/faults.txt (emulator/cluster/faults.py does the work)."""
from __future__ import annotations

import click

from emulator.cli.common import _emu, compute, console, fault, handle_errors


@compute.command("preempt")
@click.argument("name")
@click.option("--node", default=None, help="node index or name (default: every node of the compute)")
@click.pass_context
@handle_errors
def compute_preempt(ctx: click.Context, name: str, node: str | None) -> None:
    """Take low-priority nodes away now: their runs restart on fresh nodes."""
    gone = _emu(ctx).faults.preempt(name, node)
    console.print(f"preempted {', '.join(gone) or 'nothing (no node is up)'}", highlight=False)


@compute.command("preemption-policy")
@click.argument("name")
@click.option("--rate-per-node-hour", type=float, required=True, help="mean preemptions per busy node-hour (0: none)")
@click.option("--seed", type=int, default=0, show_default=True, help="same seed, same preemption times")
@click.option("--max-preemptions", type=int, default=3, show_default=True,
              help="restarts a run survives; one more preemption fails it")
@click.pass_context
@handle_errors
def compute_preemption_policy(ctx: click.Context, name: str, rate_per_node_hour: float, seed: int,
                              max_preemptions: int) -> None:
    """Preempt a low-priority compute's busy nodes at random, reproducibly."""
    _emu(ctx).faults.set_preemption_policy(name, rate_per_node_hour, seed, max_preemptions)
    console.print(f"compute {name}: {rate_per_node_hour:g} preemption(s) per node-hour, seed {seed}, "
                  f"at most {max_preemptions} restart(s) per run", highlight=False)




@fault.command("kill-node")
@click.argument("compute_name")
@click.argument("node")
@click.pass_context
@handle_errors
def fault_kill_node(ctx: click.Context, compute_name: str, node: str) -> None:
    """SIGKILL the node (its run fails: gang semantics)."""
    console.print(f"killed {_emu(ctx).faults.kill_node(compute_name, node)}", highlight=False)


@fault.command("partition")
@click.argument("compute_name")
@click.argument("node")
@click.pass_context
@handle_errors
def fault_partition(ctx: click.Context, compute_name: str, node: str) -> None:
    """Cut the node off from the cluster network (docker nodes)."""
    console.print(f"cut off {_emu(ctx).faults.partition(compute_name, node)}", highlight=False)


@fault.command("slow")
@click.argument("compute_name")
@click.argument("node")
@click.option("--cpus", type=float, required=True, help="CPU time the node keeps, in cores")
@click.pass_context
@handle_errors
def fault_slow(ctx: click.Context, compute_name: str, node: str, cpus: float) -> None:
    """Throttle the node's CPU (docker nodes)."""
    console.print(f"slowed {_emu(ctx).faults.slow(compute_name, node, cpus)} to {cpus:g} CPU(s)", highlight=False)


@fault.command("data-error")
@click.argument("compute_name")
@click.argument("node")
@click.argument("uri")
@click.pass_context
@handle_errors
def fault_data_error(ctx: click.Context, compute_name: str, node: str, uri: str) -> None:
    """Make reads of one cached datastore file fail on the node."""
    _emu(ctx).faults.fail_data_read(compute_name, node, uri)
    console.print(f"reads of {uri} now fail on node {node}", highlight=False)
