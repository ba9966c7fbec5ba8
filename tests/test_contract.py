"""The node contract and the platform-built launch, checked on the dry run (nothing started)."""
from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from amlemu import backends, procinfo
from amlemu.backends.base import CACHE_ROOT, NODE_ROOT
from amlemu.backends.dockerexec import NODE_EXEC
from amlemu.backends.process import SANDBOX
from amlemu.errors import ConfigError
from amlemu.home import AGENT_CONFIG_VARIABLE
from amlemu.runs import agent, contract, v1injector
from amlemu.runs.agent import CONFIG_VARIABLE, AgentError, agent_command
from amlemu.runs.plan import agent_file, exec_table
from amlemu.runs.launchers import node_processes
from amlemu.runs.contract import (
    LOCAL_SOURCE,
    NodeSlot,
    bindings,
    env_file_text,
    launch_argv,
    node_env,
    rank_layout,
    run_env,
)
from amlemu.specs import DataInput, DataMode, Distribution, DistributionType, JobSpec

WS = {"workspace_name": "ws", "subscription_id": "sub", "resource_group": "rg", "location": "local"}
NODES = [NodeSlot(0, "c1-node-0", "10.0.0.2"), NodeSlot(1, "c1-node-1", "10.0.0.3")]


def _job(kind: DistributionType = DistributionType.MPI, nodes: int = 2, per_node: int = 1, **kw) -> JobSpec:
    return JobSpec(command="python train.py", code=Path("/src"), compute="c1", experiment_name="exp",
                   instance_count=nodes, distribution=Distribution(kind, per_node), **kw)


R1 = contract.run_folder_id("run1")  # the run's folder on a node: a 32-hex id, not the job name
R = contract.run_folder_id("r")


def test_every_process_sees_the_amlcompute_variables() -> None:
    env = run_env(_job(environment_variables={"MY_VAR": "x", "AZUREML_OUTPUT_DIRECTORY": "mine"}),
                  "run1", WS, NODES, node_cpus=2, cluster="c1", node_gpus=2)
    assert env["AZUREML_RUN_ID"] == "run1" and env["AZUREML_ARM_PROJECT_NAME"] == "exp"
    assert (env["AZUREML_ARM_SUBSCRIPTION"], env["AZUREML_ARM_RESOURCEGROUP"], env["AZUREML_ARM_WORKSPACE_NAME"]) == (
        "sub", "rg", "ws")
    assert env["AZ_BATCH_MASTER_NODE"] == "10.0.0.2:6105" and "AZ_BATCHAI_MPI_MASTER_NODE" not in env
    assert env["MY_VAR"] == "x" and env["AZUREML_OUTPUT_DIRECTORY"] == "mine"  # the job's own win
    assert env["MLFLOW_TRACKING_URI"] == f"sqlite:////mnt/azureml/cr/j/{R1}/tracking/mlflow.db"
    assert env["OMP_NUM_THREADS"] == "2"
    assert (env["MLFLOW_RUN_ID"], env["MLFLOW_EXPERIMENT_ID"]) == ("run1", contract.NODE_MLFLOW_EXPERIMENT_ID)
    assert (env["AZ_BATCHAI_JOB_MASTER_NODE_IP"], env["AZ_BATCH_HOST_LIST"]) == ("10.0.0.2", "10.0.0.2,10.0.0.3")
    assert (env["AZ_BATCHAI_CLUSTER_NAME"], env["AZ_BATCHAI_GPU_COUNT"]) == ("c1", "2")
    assert (env["AZ_BATCH_NODE_ROOT_DIR"], env["AZ_BATCH_NODE_SHARED_DIR"]) == ("/mnt/batch/tasks", "/mnt/batch/tasks/shared")


def test_run_folders_and_ids_are_shaped_as_azure_shapes_them() -> None:
    import uuid  # noqa: PLC0415

    from amlemu.service.state import Workspace  # noqa: PLC0415

    assert re.fullmatch(r"[0-9a-f]{32}", R1) and R1 != R and contract.run_folder_id("run1") == R1
    assert contract.node_job_dir("run1") == f"/mnt/azureml/cr/j/{R1}"
    env = run_env(_job(), "run1", WS, NODES, node_cpus=2)
    ws_id, exp_id = env["AZUREML_WORKSPACE_ID"], env["AZUREML_EXPERIMENT_ID"]
    assert str(uuid.UUID(ws_id)) == ws_id and str(uuid.UUID(exp_id)) == exp_id and ws_id != exp_id
    # the workspace's GUID is the one the service reports as its workspaceId
    service_ws = Workspace(WS["subscription_id"], WS["resource_group"], WS["workspace_name"], WS["location"])
    assert ws_id == str(uuid.uuid5(uuid.NAMESPACE_URL, service_ws.id))
    again = run_env(_job(), "run2", WS, NODES, node_cpus=2)  # stable per workspace and experiment
    assert (again["AZUREML_WORKSPACE_ID"], again["AZUREML_EXPERIMENT_ID"]) == (ws_id, exp_id)
    other = run_env(_job(), "run2", {**WS, "workspace_name": "ws2"}, NODES, node_cpus=2)
    assert other["AZUREML_WORKSPACE_ID"] != ws_id and other["AZUREML_EXPERIMENT_ID"] != exp_id


def test_single_node_jobs_get_the_single_node_master_variable() -> None:
    env = run_env(_job(nodes=1, per_node=2), "r", WS, NODES[:1], node_cpus=2)
    assert env["AZ_BATCHAI_MPI_MASTER_NODE"] == "10.0.0.2" and "AZ_BATCH_MASTER_NODE" not in env
    assert env["OMP_NUM_THREADS"] == "1"  # two processes share the node's two cores


def test_per_node_variables() -> None:
    assert node_env(_job(), NODES[1]) == {"AZ_BATCHAI_TASK_INDEX": "1", "AZUREML_CR_NODE_RANK": "1",
                                          "AZ_BATCH_NODE_ID": "c1-node-1"}
    assert node_env(_job(DistributionType.PYTORCH), NODES[1])["NODE_RANK"] == "1"


def test_pytorch_distribution_variables() -> None:
    env = run_env(_job(DistributionType.PYTORCH, per_node=2), "r", WS, NODES, node_cpus=4)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["WORLD_SIZE"]) == ("10.0.0.2", "6105", "4")
    # torch's launch is not MPI's: AmlCompute sets no MPI master for it (nor any OMPI_*)
    assert "AZ_BATCH_MASTER_NODE" not in env and "AZ_BATCHAI_MPI_MASTER_NODE" not in env
    tf = run_env(_job(DistributionType.TENSORFLOW), "r", WS, NODES, node_cpus=4)
    assert not {"AZ_BATCH_MASTER_NODE", "MASTER_ADDR", "WORLD_SIZE"} & set(tf)


def test_ranks_fill_nodes_in_order() -> None:
    layout = rank_layout(_job(per_node=2), NODES)
    assert [(r.rank, r.node, r.local_rank) for r in layout] == [
        (0, "c1-node-0", 0), (1, "c1-node-0", 1), (2, "c1-node-1", 0), (3, "c1-node-1", 1)]


def test_mpi_launch_is_built_by_the_platform() -> None:
    argv = launch_argv(_job(per_node=2), "run1", NODES, agent="/venv/bin/amlemu-agent", as_root=True)
    assert argv[0] == "mpirun"
    assert argv[argv.index("plm_rsh_agent") + 1] == "/venv/bin/amlemu-agent"
    assert argv[argv.index("-np") + 1] == "4" and argv[argv.index("-H") + 1] == "c1-node-0:2,c1-node-1:2"
    assert argv[argv.index("-wdir") + 1] == f"/mnt/azureml/cr/j/{R1}/exe/wd"
    for flag in ("--leave-session-attached", "--oversubscribe", "--tag-output", "--allow-run-as-root"):
        assert flag in argv
    assert argv[argv.index("--bind-to") + 1] == "none" and argv[argv.index("--map-by") + 1] == "slot"
    assert argv[-3:] == ["/bin/bash", "-c", "python train.py"]


def test_hwlocs_device_discovery_is_off_for_the_platform_and_out_of_the_ranks_environment() -> None:
    """mpirun and each node's daemon skip hwloc's PCI walk (~40 ms of CPU each here); the ranks get
    the job's environment, without the variable; a job that sets it keeps hwloc as it asked."""
    argv = launch_argv(_job(), "run1", NODES, agent="a", as_root=True)
    assert argv[argv.index("orte_launch_agent") + 1] == "env HWLOC_COMPONENTS=-linuxio,-pci orted"
    assert argv[-6:] == ["/usr/bin/env", "-u", "HWLOC_COMPONENTS", "/bin/bash", "-c", "python train.py"]
    assert contract.mpirun_env(_job()) == {"HWLOC_COMPONENTS": "-linuxio,-pci"}
    own = _job(environment_variables={"HWLOC_COMPONENTS": "-gl"})
    argv = launch_argv(own, "run1", NODES, agent="a", as_root=True)
    assert "orte_launch_agent" not in argv and "/usr/bin/env" not in argv and contract.mpirun_env(own) == {}


def test_only_mpi_jobs_are_launched_by_mpirun() -> None:
    for kind in (DistributionType.PYTORCH, DistributionType.TENSORFLOW, DistributionType.NONE):
        with pytest.raises(ValueError, match="not launched by mpirun"):
            launch_argv(_job(kind, nodes=1), "r", NODES[:1], agent="a", as_root=True)


def test_non_distributed_jobs_run_without_mpi() -> None:
    [only] = node_processes(_job(DistributionType.NONE, nodes=1), "r", NODES[:1], agent="a")
    assert only.launch == ("a", "c1-node-0", f"cd /mnt/azureml/cr/j/{R}/exe/wd && exec /bin/bash -c 'python train.py'")
    assert (only.rank, only.env, only.argv) == (0, {}, ("/bin/bash", "-c", "python train.py"))


def test_launch_refuses_the_wrong_node_count() -> None:
    with pytest.raises(ValueError, match="2 nodes needed, 1 given"):
        launch_argv(_job(), "r", NODES[:1], agent="a", as_root=True)
    with pytest.raises(ValueError, match="2 nodes needed, 1 given"):
        node_processes(_job(DistributionType.PYTORCH), "r", NODES[:1], agent="a")


AGENT_CONFIG = {
    "backend": "docker", "as_root": True,
    "tools": {"docker": "/usr/bin/docker", "unshare": "/usr/bin/unshare", "sh": "/bin/sh"},
    "host_env": {"PATH": "/usr/bin:/bin"}, "env_file": "/mnt/azureml/cr/j/r/amlemu-env.sh",
    "sandbox_root": "/h/process-nodes/.root", "software": ["/usr", "/venv"],
    "hosts": {"c1-node-1": {"container": "amlemu-x-c1-node-1"},
              "n0": {"node_dir": "/h/nodes/c/n0", "cache_dir": "/h/caches/c/n0/data", "state_dir": "/h/p/c/n0",
                     "shm_bytes": 268435456}}}


def planned(config: dict) -> dict:  # type: ignore[type-arg]
    """The configuration as the supervisor writes it: each host's argv computed by its backend
    (AGENT_CONFIG holds a docker and a process host: each backend's own)."""
    cls = backends.backend_class(config["backend"])
    mine = {h: e for h, e in config["hosts"].items() if ("container" in e) == (config["backend"] == "docker")}
    return {**config, "exec": exec_table(cls, {**config, "hosts": mine})}


def test_agent_runs_the_platforms_docker_with_the_platforms_environment_only() -> None:
    argv, env = agent_command(planned(AGENT_CONFIG), "c1-node-1", "orted -mca x")
    assert argv == ["/usr/bin/docker", "exec", "-i", "amlemu-x-c1-node-1", "/bin/sh", "-c", NODE_EXEC, "amlemu-node",
                    "/mnt/azureml/cr/j/r/amlemu-env.sh", "orted -mca x"]
    assert env == {"PATH": "/usr/bin:/bin"}  # the job's variables never reach the host side
    mirror = {**AGENT_CONFIG, "hosts": {"c1-node-1": {"container": "amlemu-x-c1-node-1", "setpriv": "/usr/bin/setpriv"}}}
    argv, _ = agent_command(planned(mirror), "c1-node-1", "orted")  # below the kept processes' capabilities
    assert argv[4:7] == ["/usr/bin/setpriv", "--bounding-set=-audit_write", "--"] and argv[7:9] == ["/bin/sh", "-c"]


def test_agent_enters_a_process_node_through_its_sandbox() -> None:
    config = planned({**AGENT_CONFIG, "backend": "process", "as_root": False})
    argv, env = agent_command(config, "n0", "orted")
    assert config["exec"]["n0"]["record"] == "/h/p/c/n0/pids"  # the sandbox's pid, for stop_processes
    assert argv == ["/usr/bin/unshare", "--mount", "--uts", "--pid", "--kill-child=SIGKILL", "--propagation", "slave",
                    "--map-root-user", "/bin/sh", str(SANDBOX), "n0", "/h/nodes/c/n0", "/h/caches/c/n0/data",
                    "/h/process-nodes/.root", "/mnt/azureml/cr/j/r/amlemu-env.sh", "268435456", "orted", "/usr", "/venv"]
    assert env == {"PATH": "/usr/bin:/bin"}
    script = SANDBOX.read_text()
    assert 'queue bind,ro "$cache" "$root/mnt/amlemu/cache"' in script  # a line of the node's mount table
    assert (NODE_ROOT, CACHE_ROOT) == (contract.NODE_ROOT, contract.CACHE_ROOT)  # one view on every backend
    assert f'"$root{NODE_ROOT}"' in script and f'"$root{CACHE_ROOT}"' in script
    assert "--bounding-set=-all" in script and "env -i" in script
    assert 'queue "mode=1777,size=$shm" amlemu-shm "$root/dev/shm" tmpfs' in script  # resources.shm_size


def test_the_agent_imports_nothing_of_amlemu_and_records_its_start_as_psutil_sees_it(tmp_path: Path) -> None:
    loaded = subprocess.run([sys.executable, "-c", "import sys, amlemu.runs.agent as a; "
                             "print(sorted(m for m in sys.modules if m.startswith('amlemu')))"],
                            capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['amlemu', 'amlemu.runs', 'amlemu.runs.agent']"  # started once per node
    assert agent.CONFIG_VARIABLE == AGENT_CONFIG_VARIABLE
    agent.record(str(tmp_path / "n0" / "pids"))
    pid, started = (tmp_path / "n0" / "pids").read_text().split(":")
    me = psutil.Process()
    assert int(pid) == me.pid and procinfo.same_start(float(started), me.create_time())  # what _recorded compares


def test_the_agent_loads_only_modules_built_into_the_interpreter_and_reads_the_supervisors_file(tmp_path: Path) -> None:
    """It starts once per node and launch: json's import alone (re, enum) cost it ~17 ms."""
    script = Path(agent.__file__)
    probe = "import sys; before = set(sys.modules); exec(compile(open(sys.argv[1]).read(), sys.argv[1], 'exec'), " \
            "{'__name__': 'agent'}); print(sorted(set(sys.modules) - before)); " \
            "print(sorted(m for m in set(sys.modules) - before if sys.modules[m].__spec__.origin not in ('built-in', 'frozen')))"
    loaded = subprocess.run([sys.executable, "-SI", "-c", probe, str(script)], capture_output=True, text=True, check=True)
    assert loaded.stdout.splitlines()[1] == "[]", loaded.stdout  # json would bring re, enum, ... read from files
    config = {"exec": {"n0": {"before": ["/bin/echo", "on n0:"], "after": ["(end)"], "record": None}},
              "host_env": {"PATH": "/usr/bin:/bin"}, "tools": {"docker": "/usr/bin/docker"}}  # tools: not the agent's
    path = tmp_path / "agent-config.marshal"
    path.write_bytes(agent_file(config))
    shown = subprocess.run([sys.executable, "-SI", str(script), "n0", "orted", "-mca", "x"], capture_output=True,
                           text=True, env={CONFIG_VARIABLE: str(path)}, check=True)
    assert shown.stdout == "on n0: orted -mca x (end)\n"
    path.write_bytes(b"not marshal")
    refused = subprocess.run([sys.executable, "-SI", str(script), "n0", "true"], capture_output=True, text=True,
                             env={CONFIG_VARIABLE: str(path)}, check=False)
    assert refused.returncode == 2 and refused.stderr.startswith("amlemu-agent:") and "Traceback" not in refused.stderr


def test_auto_walks_the_registry_by_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    order = backends.auto_order()
    assert [c.name for c in order] == ["docker", "process"]  # the closest to AmlCompute first
    for cls in order:
        monkeypatch.setattr(cls, "available", classmethod(lambda c: (c.name == "process", f"{c.name} why")))
    assert backends.resolve_backend("auto") == ("process", "backend auto -> process (docker: docker why)")
    monkeypatch.setattr(order[1], "available", classmethod(lambda c: (False, "no unshare")))
    with pytest.raises(ConfigError, match="no backend is usable here .docker: docker why; process: no unshare"):
        backends.resolve_backend("auto")


def test_each_registered_backend_is_one_class_with_its_capabilities() -> None:
    for name in backends.BACKENDS:
        cls = backends.backend_class(name)
        assert cls.name == name and not getattr(cls.agent_argv, "__isabstractmethod__", False)
        assert all(isinstance(getattr(cls, cap), bool) for cap in ("can_partition", "can_slow", "enforces_limits"))
    for name, host in (("docker", "c1-node-1"), ("process", "n0")):  # AGENT_CONFIG's hosts
        tools = backends.backend_class(name).agent_tools()  # what its agent runs, found here by absolute path
        assert agent_command(planned({**AGENT_CONFIG, "backend": name, "tools": tools}), host, "orted")[0][0] in tools.values()
        assert all(Path(path).is_absolute() for path in tools.values())
    assert backends.backend_class("process").limits_note() == "CPU and memory limits are not enforced on process nodes"
    assert backends.backend_class("docker").limits_note() is None


def test_env_file_quotes_every_value_and_refuses_names_a_shell_cannot_set() -> None:
    text = env_file_text({"A": "it's $HOME\nline2", "B_2": ""})
    assert text == "export A='it'\"'\"'s $HOME\nline2'\nexport B_2=''\n"
    out = subprocess.run(["/bin/sh", "-c", '. /dev/stdin; printf %s "$A"'], input=text, capture_output=True,
                         text=True, check=True).stdout
    assert out == "it's $HOME\nline2"
    for bad in ("A=B", "1X", "", "A\nB", "A-B"):
        with pytest.raises(ValueError, match="not valid"):
            env_file_text({bad: "x"})


def test_agent_refuses_hosts_outside_the_run() -> None:
    with pytest.raises(AgentError, match="host c1-node-9 is not a node of this run"):
        agent_command(planned(AGENT_CONFIG), "c1-node-9", "orted")


def test_data_bindings_paths_default_outputs_and_v1_references() -> None:
    job = _job(inputs={"data": DataInput("uri_folder", "azureml://datastores/ws/paths/mnist"),
                       "local": DataInput("uri_file", "/home/me/labels.csv", DataMode.DOWNLOAD), "lr": 0.1},
               outputs={"model": DataInput("uri_folder", "", DataMode.UPLOAD)})
    found = {b.ref: b for b in bindings(job, "r1")}
    wd = f"/mnt/azureml/cr/j/{contract.run_folder_id('r1')}/cap/data-capability/wd"
    assert (found["inputs.data"].datastore, found["inputs.data"].path, found["inputs.data"].node_path) == (
        "ws", "mnist", f"{wd}/INPUT_data")
    assert (found["inputs.local"].datastore, found["inputs.local"].path, found["inputs.local"].node_path) == (
        LOCAL_SOURCE, "home/me/labels.csv", f"{wd}/INPUT_local/labels.csv")
    assert found["outputs.model"].uri == "azureml://datastores/workspaceblobstore/paths/azureml/r1/model/"
    assert found["outputs.model"].node_path == f"{wd}/model" and "inputs.lr" not in found
    env = run_env(job, "r1", WS, NODES, node_cpus=2)
    assert env["AZUREML_DATAREFERENCE_data"] == f"{wd}/INPUT_data"
    assert env["AZUREML_DATAREFERENCE_model"] == f"{wd}/model"



def test_a_v1_jobs_script_runs_through_the_v1_runtimes_injector_and_keeps_its_argv_path_and_exit(tmp_path: Path) -> None:
    v1 = replace(_job(DistributionType.NONE, nodes=1), command="python train.py --lr 0.1", log_layout="v1")
    assert contract.resolve_command(v1, "r") == "python azureml-setup/context_manager_injector.py train.py --lr 0.1"
    assert contract.resolve_command(replace(v1, log_layout="v2"), "r") == "python train.py --lr 0.1"  # as written
    assert contract.resolve_command(replace(v1, command="python -m pkg.train"), "r") == "python -m pkg.train"
    (tmp_path / "azureml-setup").mkdir()
    (tmp_path / "azureml-setup" / "context_manager_injector.py").write_bytes(Path(v1injector.__file__).read_bytes())
    (tmp_path / "helper.py").write_text("VALUE = 'beside the script'\n")
    (tmp_path / "train.py").write_text("import sys, helper\nprint(sys.argv, helper.VALUE)\nsys.exit(3)\n")
    done = subprocess.run(["/bin/bash", "-c", contract.resolve_command(v1, "r")], cwd=tmp_path, capture_output=True,
                          text=True)
    assert (done.returncode, done.stdout) == (3, "['train.py', '--lr', '0.1'] beside the script\n")
