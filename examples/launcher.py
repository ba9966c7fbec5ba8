"""A user's entry point that branches on the AmlCompute contract, as many do."""
import os

if "AZ_BATCH_MASTER_NODE" in os.environ:  # set by AmlCompute on multi-node jobs only
    master, port = os.environ["AZ_BATCH_MASTER_NODE"].split(":")
    print(f"multi-node: rendezvous at {master}:{port} as node {os.environ['AZ_BATCHAI_TASK_INDEX']}", flush=True)
else:
    print(f"single node: master {os.environ['AZ_BATCHAI_MPI_MASTER_NODE']}", flush=True)
