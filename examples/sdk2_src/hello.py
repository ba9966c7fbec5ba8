"""The job's code: each MPI rank says where it runs; rank 0 writes an output file and one into the named output folder. --exit-code N
makes every rank end with N (a failing job)."""
import argparse
import os
import socket
import sys
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--greeting", default="hello")
parser.add_argument("--exit-code", type=int, default=0)
parser.add_argument("--model-dir", help="a named output folder")
args = parser.parse_args()
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
print(f"{args.greeting} from rank {rank} of {size} on {socket.gethostname()}", flush=True)
if rank == 0:
    Path("outputs").mkdir(exist_ok=True)
    Path("outputs/greeting.txt").write_text(f"{args.greeting} from {size} ranks\n")
    if args.model_dir:
        Path(args.model_dir, "model.txt").write_text(f"weights of {size} ranks\n")
if args.exit_code:
    print(f"rank {rank}: exiting with code {args.exit_code}", file=sys.stderr, flush=True)
sys.exit(args.exit_code)
