"""Horovod PyTorch MNIST: the job of the seed article (Azure ML's distributed-pytorch-with-horovod
sample), modernised. It runs unchanged on an AmlCompute node and on amlemu:

    mpirun -np 2 python train.py --data-dir <folder holding MNIST/raw>

Rank 0 logs metrics with MLflow (Azure ML v2 collects them that way; locally MLflow's default
store, or MLFLOW_TRACKING_URI) and writes the model, a JSON summary and one checkpoint per epoch
to ./outputs. A restarted job (a preempted low-priority node) resumes from the newest checkpoint.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
CHECKPOINT_RE = re.compile(r"^checkpoint-epoch(\d+)\.pt$")


class DataError(Exception):
    """The data directory does not hold MNIST as torchvision expects it."""


# --- arguments and files (pure, no torch) -------------------------------------------------------

def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="train.py", description="Horovod PyTorch MNIST")
    p.add_argument("--data-dir", type=Path, required=True,
                   help="folder holding MNIST/raw/<the four IDX files> (a datastore mount on AmlCompute)")
    p.add_argument("--epochs", type=_positive_int, default=2, help="training epochs (default %(default)s)")
    p.add_argument("--batch-size", type=_positive_int, default=64, help="per-rank batch (default %(default)s)")
    p.add_argument("--test-batch-size", type=_positive_int, default=1000)
    p.add_argument("--lr", type=_positive_float, default=0.01,
                   help="learning rate for one rank; scaled by the number of ranks (default %(default)s)")
    p.add_argument("--momentum", type=float, default=0.9,
                   help="SGD momentum (default %(default)s; the Azure sample's 0.5 reached only ~0.96 in 2 epochs)")
    p.add_argument("--max-steps", type=_positive_int, default=None,
                   help="stop each epoch after this many steps (fast tests); default: the whole epoch")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--log-interval", type=_positive_int, default=10, help="steps between loss logs")
    p.add_argument("--output-dir", type=Path, default=Path("outputs"),
                   help="model, summary and checkpoints (default ./outputs, which Azure ML uploads)")
    p.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16 for allreduce")
    p.add_argument("--no-cuda", action="store_true", help="train on the CPU even when a GPU is present")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def resolve_data_root(path: Path) -> Path:
    """The root torchvision wants (it reads root/MNIST/raw); also accept the MNIST or raw folder."""
    candidates = [path, path.parent if path.name == "MNIST" else None,
                  path.parent.parent if path.name == "raw" else None]
    for root in filter(None, candidates):
        if all((root / "MNIST" / "raw" / name).is_file() for name in MNIST_FILES):
            return root
    expected = ", ".join(f"MNIST/raw/{name}" for name in MNIST_FILES)
    raise DataError(f"--data-dir {path}: MNIST not found; expected the uncompressed IDX files {expected} "
                    f"under it (prepare them with `python -m pytest_amlemu.mnist prepare`)")


def find_checkpoint(outputs: Path) -> Path | None:
    """The checkpoint of the highest epoch in `outputs`, if any."""
    if not outputs.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in outputs.iterdir() if (m := CHECKPOINT_RE.match(p.name))]
    return max(found)[1] if found else None


def checkpoint_path(outputs: Path, epoch: int) -> Path:
    return outputs / f"checkpoint-epoch{epoch}.pt"


# --- metrics -------------------------------------------------------------------------------------

class Metrics:
    """MLflow on rank 0 (printing too); silent elsewhere. Runs without MLflow, with a warning."""

    def __init__(self, enabled: bool) -> None:
        self._mlflow: Any = None
        self.enabled = enabled
        if not enabled:
            return
        try:
            import mlflow  # noqa: PLC0415 - optional on nodes, and only rank 0 pays for the import
        except ImportError:
            print("train.py: mlflow is not installed; metrics are printed only", file=sys.stderr)
            return
        self._mlflow = mlflow
        mlflow.start_run()  # attaches to the job's run when MLFLOW_RUN_ID is set (Azure ML, amlemu)

    def params(self, params: dict[str, Any]) -> None:
        if self._mlflow:
            self._mlflow.log_params(params)

    def log(self, name: str, value: float, step: int) -> None:
        if self._mlflow:
            self._mlflow.log_metric(name, value, step=step)

    def close(self, status: str = "FINISHED") -> None:
        if self._mlflow:
            self._mlflow.end_run(status=status)


# --- training ------------------------------------------------------------------------------------

def param_digest(model: Any) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class Training:
    """One rank's training: Horovod, the data, the model and its optimizer, set up from `args`."""

    def __init__(self, args: argparse.Namespace, data_root: Path) -> None:
        import horovod.torch as hvd  # noqa: PLC0415 - heavy imports after argument checks
        import torch  # noqa: PLC0415

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from model import Net  # noqa: PLC0415

        self.args, self.hvd, self.torch = args, hvd, torch
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()
        use_cuda = not args.no_cuda and torch.cuda.is_available()
        torch.manual_seed(args.seed)
        if use_cuda:
            torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
            torch.cuda.manual_seed(args.seed)
        # Ranks on one node share its cores; oversubscribed intra-op threads slow everyone down.
        # OMP_NUM_THREADS, when the platform or the user sets it, says how many this rank may use.
        threads = int(os.environ.get("OMP_NUM_THREADS") or 0) or (os.cpu_count() or 1) // hvd.local_size()
        torch.set_num_threads(max(1, threads))
        self.device = torch.device("cuda" if use_cuda else "cpu")
        self._load_data(data_root, use_cuda)
        self.model = Net().to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=args.lr * self.size, momentum=args.momentum)
        self.start_epoch, self.global_step, self.resumed_from = 1, 0, None

    def _load_data(self, data_root: Path, use_cuda: bool) -> None:
        from torch.utils.data import DataLoader, DistributedSampler  # noqa: PLC0415
        from torchvision import datasets, transforms  # noqa: PLC0415

        args = self.args
        transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
        self.train_set = datasets.MNIST(str(data_root), train=True, download=False, transform=transform)
        test_set = datasets.MNIST(str(data_root), train=False, download=False, transform=transform)
        self.train_sampler = DistributedSampler(self.train_set, num_replicas=self.size, rank=self.rank, seed=args.seed)
        self.test_sampler = DistributedSampler(test_set, num_replicas=self.size, rank=self.rank, shuffle=False)
        loader_kw = {"num_workers": 1, "pin_memory": True} if use_cuda else {}
        self.train_loader = DataLoader(self.train_set, batch_size=args.batch_size, sampler=self.train_sampler,
                                       **loader_kw)
        self.test_loader = DataLoader(test_set, batch_size=args.test_batch_size, sampler=self.test_sampler, **loader_kw)

    def resume(self) -> None:
        """Rank 0 restores the newest checkpoint, if any; its state becomes everyone's. Then the
        optimizer becomes Horovod's (allreduced gradients)."""
        hvd, outputs = self.hvd, self.args.output_dir
        if self.rank == 0:
            outputs.mkdir(parents=True, exist_ok=True)
            newest = find_checkpoint(outputs)
            if newest:
                state = self.torch.load(newest, map_location=self.device)
                self.model.load_state_dict(state["model"])
                self.optimizer.load_state_dict(state["optimizer"])
                self.start_epoch, self.global_step, self.resumed_from = \
                    state["epoch"] + 1, state["global_step"], newest.name
                print(f"resuming from {newest.name}: epoch {state['epoch']} done", flush=True)
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)
        self.start_epoch, self.global_step, self.resumed_from = hvd.broadcast_object(
            (self.start_epoch, self.global_step, self.resumed_from), 0)
        compression = hvd.Compression.fp16 if self.args.fp16_allreduce else hvd.Compression.none
        self.optimizer = hvd.DistributedOptimizer(self.optimizer, named_parameters=self.model.named_parameters(),
                                                  compression=compression)

    def train_epoch(self, epoch: int, metrics: Metrics) -> int:
        """One epoch (or its first `--max-steps` steps); returns the samples all ranks trained on."""
        import torch.nn.functional as F  # noqa: PLC0415

        args, trained = self.args, 0
        self.model.train()
        self.train_sampler.set_epoch(epoch)
        for batch_idx, (data, target) in enumerate(self.train_loader):
            if args.max_steps is not None and batch_idx >= args.max_steps:
                break
            data, target = data.to(self.device), target.to(self.device)
            self.optimizer.zero_grad()
            loss = F.nll_loss(self.model(data), target)
            loss.backward()
            self.optimizer.step()
            self.global_step += 1
            trained += len(data) * self.size
            if batch_idx % args.log_interval == 0 and self.rank == 0:
                seen = batch_idx * len(data) * self.size
                print(f"epoch {epoch} [{seen}/{len(self.train_set)}] loss {loss.item():.4f}", flush=True)
                metrics.log("train_loss", loss.item(), self.global_step)
        return trained

    def evaluate(self) -> tuple[float, float]:
        """Test loss and accuracy over the whole test set (each rank evaluates its share)."""
        import torch.nn.functional as F  # noqa: PLC0415

        torch, hvd = self.torch, self.hvd
        self.model.eval()
        loss_sum, correct = 0.0, 0.0
        with torch.no_grad():
            for data, target in self.test_loader:
                data, target = data.to(self.device), target.to(self.device)
                output = self.model(data)
                loss_sum += F.nll_loss(output, target, reduction="sum").item()
                correct += output.argmax(dim=1).eq(target).sum().item()
        n = len(self.test_sampler)
        # Every rank saw an equal share, so the mean of the per-rank means is the global mean.
        loss = hvd.allreduce(torch.tensor(loss_sum / n), name="avg_loss").item()
        accuracy = hvd.allreduce(torch.tensor(correct / n), name="avg_accuracy").item()
        return loss, accuracy

    def checkpoint(self, epoch: int) -> None:
        ckpt = checkpoint_path(self.args.output_dir, epoch)
        self.torch.save({"epoch": epoch, "global_step": self.global_step, "model": self.model.state_dict(),
                         "optimizer": self.optimizer.state_dict()}, ckpt.with_suffix(".tmp"))
        ckpt.with_suffix(".tmp").replace(ckpt)  # a preemption never leaves half a checkpoint


def train(args: argparse.Namespace, data_root: Path, metrics_class: type[Metrics] = Metrics) -> dict[str, Any]:
    run = Training(args, data_root)
    run.resume()
    rank, size = run.rank, run.size
    metrics = metrics_class(enabled=rank == 0)
    metrics.params({"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                    "momentum": args.momentum, "world_size": size, "seed": args.seed,
                    "max_steps": args.max_steps, "device": run.device.type})
    test_loss = test_accuracy = float("nan")
    trained_samples, train_seconds = 0, 0.0
    status = "FAILED"
    try:
        for epoch in range(run.start_epoch, args.epochs + 1):
            started = time.perf_counter()
            trained_samples += run.train_epoch(epoch, metrics)
            train_seconds += time.perf_counter() - started
            test_loss, test_accuracy = run.evaluate()
            if rank == 0:
                print(f"epoch {epoch} test loss {test_loss:.4f} accuracy {test_accuracy:.4f}", flush=True)
                metrics.log("test_loss", test_loss, epoch)
                metrics.log("test_accuracy", test_accuracy, epoch)
                run.checkpoint(epoch)
        if run.start_epoch > args.epochs:  # restarted after the last epoch: report, do not retrain
            test_loss, test_accuracy = run.evaluate()
        status = "FINISHED"
    finally:
        metrics.close(status)

    digests = run.hvd.allgather_object(param_digest(run.model))
    summary = {
        "world_size": size,
        "epochs": args.epochs,
        "global_step": run.global_step,
        "test_loss": test_loss,
        "test_accuracy": test_accuracy,
        "resumed_from": run.resumed_from,
        "device": run.device.type,
        "train_seconds": round(train_seconds, 3),
        "samples_per_second": round(trained_samples / train_seconds, 1) if train_seconds else None,
        # What this rank's throughput was planned on (benchmarks compare like with like).
        "threads": {"torch": run.torch.get_num_threads(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")},
        "param_digests": digests,
        "params_in_sync": len(set(digests)) == 1,
    }
    if rank == 0:
        run.torch.save(run.model.state_dict(), args.output_dir / "model.pt")
        (args.output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(f"final test accuracy {test_accuracy:.4f} (loss {test_loss:.4f}); "
              f"parameters identical on all {size} ranks: {summary['params_in_sync']}", flush=True)
    run.hvd.shutdown()
    return summary


def main(argv: list[str] | None = None, metrics_class: type[Metrics] = Metrics) -> int:
    """`metrics_class`: how rank 0 reports (train_v1.py's: azureml-core's run.log instead of MLflow)."""
    args = parse_args(argv)
    try:
        data_root = resolve_data_root(args.data_dir)
    except DataError as exc:
        print(f"train.py: error: {exc}", file=sys.stderr)
        return 2
    summary = train(args, data_root, metrics_class)
    return 0 if summary["params_in_sync"] else 1


if __name__ == "__main__":
    sys.exit(main())
