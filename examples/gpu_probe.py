"""Reports the GPUs this rank can see."""
import os

import torch

rank = os.environ["OMPI_COMM_WORLD_RANK"]
print(f"rank {rank} sees {torch.cuda.device_count()} GPU(s): CUDA_VISIBLE_DEVICES="
      f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}", flush=True)
