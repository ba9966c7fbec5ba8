"""A user's data loader: each rank reads its own shard of the input folder."""
import os
import sys

rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
shards = sorted(os.listdir(sys.argv[1]))
mine = shards[rank::size]
for name in mine:
    with open(os.path.join(sys.argv[1], name)) as fh:
        print(f"rank {rank} read {name}: {fh.read().strip()}", flush=True)
