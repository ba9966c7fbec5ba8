"""The seed article's notebook cells (Azure ML SDK v1, azureml-core), as a plain script: connect to
the workspace, find or create the low-priority cluster, submit a job on 2 nodes x 1 process (MPI),
stream its log, then read its status, details and files.

Nothing in it knows about amlemu: with the variables `amlemu env` prints (and the config.json
`amlemu workspace config` writes) it runs on the emulator; without them, on Azure ML.

    eval "$(amlemu env)" && amlemu workspace config && python examples/sdk1_submit.py examples/sdk2_src

The source folder is the one argument (the article's `project_folder`); `--estimator` submits the
article's PyTorch estimator instead of the ScriptRunConfig that replaced it.
"""
import argparse

from azureml.core import Experiment, Run, ScriptRunConfig, Workspace
from azureml.core.compute import AmlCompute, ComputeTarget
from azureml.core.compute_target import ComputeTargetException
from azureml.core.runconfig import MpiConfiguration

parser = argparse.ArgumentParser()
parser.add_argument("project_folder")
parser.add_argument("--entry-script", default="hello.py")
parser.add_argument("--estimator", action="store_true", help="the article's azureml.train.dnn.PyTorch estimator")
parser.add_argument("--download-path", default="./downloads")
args = parser.parse_args()
project_folder = args.project_folder

# ② the workspace
ws = Workspace.from_config()
print("workspace:", ws.name, ws.resource_group, ws.location, ws.subscription_id, sep="\n")

# ③ the AmlCompute cluster: attach the existing one, or create it
cluster_name = "gpucluster"
try:
    compute_target = ComputeTarget(workspace=ws, name=cluster_name)
    print("Found existing compute target.")
except ComputeTargetException:
    print("Creating a new compute target...")
    compute_config = AmlCompute.provisioning_configuration(vm_size="STANDARD_NC6",
                                                           vm_priority="lowpriority",
                                                           max_nodes=2)
    compute_target = ComputeTarget.create(ws, cluster_name, compute_config)
    compute_target.wait_for_completion(show_output=True)
print(compute_target.status.serialize())

# ⑤ the experiment
experiment_name = "pytorch-distr-hvd"
experiment = Experiment(ws, name=experiment_name)

# ⑥ the job: the article's estimator, or the ScriptRunConfig Microsoft replaced it with
if args.estimator:
    from azureml.train.dnn import PyTorch
    src = PyTorch(source_directory=project_folder, compute_target=compute_target, entry_script=args.entry_script,
                  node_count=2, process_count_per_node=1, distributed_backend="mpi", use_gpu=True)
else:
    src = ScriptRunConfig(source_directory=project_folder, script=args.entry_script, compute_target=compute_target,
                          distributed_job_config=MpiConfiguration(process_count_per_node=1, node_count=2))

# ⑦ run it and follow its log
run = experiment.submit(src)
print(run)
run.wait_for_completion(show_output=True)

print("status:", run.get_status())
details = run.get_details()
print("details:", details["runId"], details["status"], details["target"])
print("files:", run.get_file_names())
run.download_files(output_directory=args.download_path)
print("experiments:", [e.name for e in Experiment.list(ws)])
print("runs:", [r.id for r in Run.list(experiment)])
