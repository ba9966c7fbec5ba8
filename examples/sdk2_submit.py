"""An ordinary Azure ML SDK v2 submit script, as in Azure's examples: create a compute, submit a
command() job on 2 nodes x 2 processes (MPI, or --distribution pytorch), stream its log, read its
status, download its outputs.

Nothing in it knows about amlemu: with the variables `amlemu env` prints (and the config.json
`amlemu workspace config` writes) it runs on the emulator; without them, on Azure ML.

    eval "$(amlemu env)" && amlemu workspace config && python examples/sdk2_submit.py
"""
import argparse
from pathlib import Path

from azure.ai.ml import MLClient, MpiDistribution, Output, PyTorchDistribution, command
from azure.ai.ml.entities import AmlCompute
from azure.identity import DefaultAzureCredential

parser = argparse.ArgumentParser()
parser.add_argument("--compute", default="cpu-cluster")
parser.add_argument("--exit-code", type=int, default=0, help="make the job fail with this exit code")
parser.add_argument("--distribution", choices=("mpi", "pytorch"), default="mpi")
parser.add_argument("--download-path", default="./downloads")
args = parser.parse_args()

ml_client = MLClient.from_config(credential=DefaultAzureCredential())

cluster = AmlCompute(name=args.compute, size="STANDARD_D2_V2", min_instances=0, max_instances=2,
                     idle_time_before_scale_down=120)
cluster = ml_client.compute.begin_create_or_update(cluster).result()
print(f"compute {cluster.name}: {cluster.provisioning_state}, up to {cluster.max_instances} nodes")

job = command(
    code=str(Path(__file__).parent / "sdk2_src"),
    command="python hello.py --greeting ${{inputs.greeting}} --exit-code ${{inputs.exit_code}} "
            "--model-dir ${{outputs.model}}",
    inputs={"greeting": "hello", "exit_code": args.exit_code},
    outputs={"model": Output(type="uri_folder")},
    environment="AzureML-sklearn-1.5@latest",
    compute=args.compute,
    instance_count=2,
    distribution=MpiDistribution(process_count_per_instance=2) if args.distribution == "mpi"
    else PyTorchDistribution(process_count_per_instance=2),
    experiment_name="sdk2-hello",
    display_name="hello from 4 ranks",
)
returned_job = ml_client.jobs.create_or_update(job)
print(f"submitted {returned_job.name}: {returned_job.status}; studio: {returned_job.studio_url}")

ml_client.jobs.stream(returned_job.name)

finished = ml_client.jobs.get(returned_job.name)
print(f"job {finished.name}: {finished.status}")
ml_client.jobs.download(returned_job.name, download_path=args.download_path, all=True)
print(f"downloaded to {args.download_path}")
