"""`amlemu compute preempt|preemption-policy` and `amlemu fault ...`: faults injected on purpose,
each logged in the affected run's system_logs/faults.txt (emulator/cluster/faults.py does the work,
and plans it first: --dry-run prints that plan)."""
from __future__ import annotations

from collections.abc import Callable

import click

from amlemu.actions import Action, execute
from amlemu.cli.common import (
    compute,
    console,
    dry_run_option,
    emulator_of,
    fault,
    handle_errors,
    name_argument,
    output_option,
    report,
    show_plan,
)


def _carry_out(plan: list[Action], dry_run: bool, output: str, say: Callable[[list[Action]], str]) -> None:
    """A fault command's plan: printed (--dry-run) or carried out and said in the command's words."""
    if dry_run:
        show_plan(plan, output)
        return
    done = execute(plan)
    report(done, output, lambda _: console.print(say(plan), highlight=False))


@compute.command("preempt")
@name_argument("compute")
@click.option("--node", default=None, help="node index or name (default: every node of the compute)")
@dry_run_option
@output_option
@click.pass_context
@handle_errors
def compute_preempt(ctx: click.Context, name: str, node: str | None, dry_run: bool, output: str) -> None:
    """Take low-priority nodes away now: their runs restart on fresh nodes."""
    _carry_out(emulator_of(ctx).faults.plan_preempt(name, node), dry_run, output,
               lambda plan: f"preempted {', '.join(a.name for a in plan) or 'nothing (no node is up)'}")


@compute.command("preemption-policy")
@name_argument("compute")
@click.option("--rate-per-node-hour", type=float, required=True, help="mean preemptions per busy node-hour (0: none)")
@click.option("--seed", type=int, default=0, show_default=True, help="same seed, same preemption times")
@click.option("--max-preemptions", type=int, default=3, show_default=True,
              help="restarts a run survives; one more preemption fails it")
@dry_run_option
@output_option
@click.pass_context
@handle_errors
def compute_preemption_policy(ctx: click.Context, name: str, rate_per_node_hour: float, seed: int,
                              max_preemptions: int, dry_run: bool, output: str) -> None:
    """Preempt a low-priority compute's busy nodes at random, reproducibly."""
    _carry_out(emulator_of(ctx).faults.plan_set_preemption_policy(name, rate_per_node_hour, seed, max_preemptions),
               dry_run, output, lambda _: f"compute {name}: {rate_per_node_hour:g} preemption(s) per node-hour, "
                                          f"seed {seed}, at most {max_preemptions} restart(s) per run")


@fault.command("kill-node")
@click.argument("compute_name")
@click.argument("node")
@dry_run_option
@output_option
@click.pass_context
@handle_errors
def fault_kill_node(ctx: click.Context, compute_name: str, node: str, dry_run: bool, output: str) -> None:
    """SIGKILL the node (its run fails: gang semantics)."""
    _carry_out(emulator_of(ctx).faults.plan_kill_node(compute_name, node), dry_run, output,
               lambda plan: f"killed {plan[0].name}")


@fault.command("partition")
@click.argument("compute_name")
@click.argument("node")
@dry_run_option
@output_option
@click.pass_context
@handle_errors
def fault_partition(ctx: click.Context, compute_name: str, node: str, dry_run: bool, output: str) -> None:
    """Cut the node off from the cluster network (docker nodes)."""
    _carry_out(emulator_of(ctx).faults.plan_partition(compute_name, node), dry_run, output,
               lambda plan: f"cut off {plan[0].name}")


@fault.command("slow")
@click.argument("compute_name")
@click.argument("node")
@click.option("--cpus", type=float, required=True, help="CPU time the node keeps, in cores")
@dry_run_option
@output_option
@click.pass_context
@handle_errors
def fault_slow(ctx: click.Context, compute_name: str, node: str, cpus: float, dry_run: bool, output: str) -> None:
    """Throttle the node's CPU (docker nodes)."""
    _carry_out(emulator_of(ctx).faults.plan_slow(compute_name, node, cpus), dry_run, output,
               lambda plan: f"slowed {plan[0].name} to {cpus:g} CPU(s)")


@fault.command("data-error")
@click.argument("compute_name")
@click.argument("node")
@click.argument("uri")
@dry_run_option
@output_option
@click.pass_context
@handle_errors
def fault_data_error(ctx: click.Context, compute_name: str, node: str, uri: str, dry_run: bool, output: str) -> None:
    """Make reads of one cached datastore file fail on the node."""
    _carry_out(emulator_of(ctx).faults.plan_fail_data_read(compute_name, node, uri), dry_run, output,
               lambda _: f"reads of {uri} now fail on node {node}")
