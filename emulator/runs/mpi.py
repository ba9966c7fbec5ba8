"""mpirun command lines, built as argv lists by pure functions (never shell strings).

Open MPI facts this encodes (measured on 2-core machines, see shared/research/environment.md):
as root it needs --allow-run-as-root; more ranks than cores need --oversubscribe; the default
core binding and busy polling made 2 ranks on 2 shared cores 2-3x slower, hence --bind-to none
and mpi_yield_when_idle.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class MpiLaunch:
    """One mpirun invocation: `nprocs` ranks of `program`, with `env` exported to every rank."""

    program: Sequence[str]
    nprocs: int
    hosts: Sequence[tuple[str, int]] = ()  # (host, slots); empty: all ranks on this machine
    env: dict[str, str] = field(default_factory=dict)
    as_root: bool = False
    tag_output: bool = False
    mpirun: str = "mpirun"

    def __post_init__(self) -> None:
        if self.nprocs < 1:
            raise ValueError(f"nprocs must be at least 1, got {self.nprocs}")
        if not self.program:
            raise ValueError("program must not be empty")
        if self.hosts and sum(slots for _, slots in self.hosts) < self.nprocs:
            raise ValueError(f"{self.nprocs} ranks do not fit the {sum(s for _, s in self.hosts)} host slots")


def host_list(hosts: Iterable[tuple[str, int]]) -> str:
    """Open MPI's -H syntax: node0:2,node1:2."""
    return ",".join(f"{host}:{slots}" for host, slots in hosts)


def mpirun_argv(launch: MpiLaunch) -> list[str]:
    argv = [launch.mpirun, "-np", str(launch.nprocs)]
    if launch.as_root:
        argv.append("--allow-run-as-root")
    if launch.hosts:
        argv += ["-H", host_list(launch.hosts)]
    argv += ["--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1"]
    if launch.tag_output:
        argv.append("--tag-output")
    for name in sorted(launch.env):
        argv += ["-x", name]  # -x NAME exports the launcher's value: values never enter argv
    return argv + list(launch.program)


def launch_env(launch: MpiLaunch, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment mpirun itself must run with, so that `-x NAME` has values to export."""
    env = dict(os.environ if base is None else base)
    env.update(launch.env)
    return env


# What makes an Open MPI launch take another allocation or job for its own: a resource manager's
# job (SLURM, PBS/Torque, LSF, Grid Engine, Flux) or an MPI job this process runs in (OMPI_*, PMIx,
# PMI). The emulated cluster is mpirun's whole allocation, as on AmlCompute, where nothing of the
# submitting machine reaches the nodes' mpirun.
FOREIGN_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "SLURM_", "PBS_", "LSB_", "FLUX_", "SGE_", "HYDRA_", "I_MPI_")
FOREIGN_NAMES = frozenset({"PE_HOSTFILE", "NSLOTS"})


def platform_env(environ: dict[str, str]) -> dict[str, str]:
    """This machine's environment less what would give the platform's mpirun another allocation. Pure."""
    return {k: v for k, v in environ.items() if not k.startswith(FOREIGN_PREFIXES) and k not in FOREIGN_NAMES}
