"""mpirun argv: pure construction, validated inputs, no values of secrets in argv."""
from __future__ import annotations

import pytest

from amlemu.runs.mpi import MpiLaunch, host_list, launch_env, mpirun_argv, platform_env


def test_local_launch() -> None:
    argv = mpirun_argv(MpiLaunch(program=["python", "train.py"], nprocs=2))
    assert argv == ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none",
                    "--mca", "mpi_yield_when_idle", "1", "python", "train.py"]


def test_root_hosts_env_and_tags() -> None:
    launch = MpiLaunch(program=["a"], nprocs=4, hosts=[("node-0", 2), ("node-1", 2)],
                       env={"B_VAR": "1", "A_KEY": "s3cret"}, as_root=True, tag_output=True)
    argv = mpirun_argv(launch)
    assert argv[3] == "--allow-run-as-root"
    assert argv[argv.index("-H") + 1] == "node-0:2,node-1:2"
    assert argv[-5:] == ["-x", "A_KEY", "-x", "B_VAR", "a"]
    assert "--tag-output" in argv and "s3cret" not in " ".join(argv)
    assert launch_env(launch, {"PATH": "/bin"}) == {"PATH": "/bin", "B_VAR": "1", "A_KEY": "s3cret"}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"nprocs": 0}, "nprocs must be at least 1"),
    ({"nprocs": 3, "hosts": [("n0", 1), ("n1", 1)]}, "3 ranks do not fit the 2 host slots"),
    ({"nprocs": 1, "program": []}, "program must not be empty"),
])
def test_invalid_launches_are_refused(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        MpiLaunch(**{"program": ["x"], **kwargs})


def test_host_list() -> None:
    assert host_list([("a", 1)]) == "a:1"


def test_the_platforms_mpirun_leaves_out_what_names_another_allocation_or_mpi_job() -> None:
    host = {"PATH": "/bin", "HOME": "/root", "SLURM_JOB_ID": "7", "SLURM_NODELIST": "n1", "PBS_NODEFILE": "/f",
            "LSB_JOBID": "3", "PE_HOSTFILE": "/h", "NSLOTS": "4", "OMPI_COMM_WORLD_RANK": "0",
            "OMPI_MCA_orte_default_hostfile": "/h", "PMIX_RANK": "0", "FLUX_JOB_ID": "f1", "MY_OMPI_NOTE": "kept"}
    assert platform_env(host) == {"PATH": "/bin", "HOME": "/root", "MY_OMPI_NOTE": "kept"}
