"""The pipeline's evaluate step: load the trained model (the train step's folder: model.pt and the
network's model.py) and score it on the prepared test split; writes metrics.json (accuracy, loss,
images) and logs the same with MLflow where it is installed (the step's metrics in `job show`).

    python evaluate.py --model <model folder> --data <prepared folder> --metrics <folder>
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def evaluate(model_dir: Path, data_root: Path) -> dict[str, float]:
    import torch  # noqa: PLC0415 - after the arguments are read
    import torch.nn.functional as F  # noqa: PLC0415
    from torch.utils.data import DataLoader  # noqa: PLC0415
    from torchvision import datasets, transforms  # noqa: PLC0415

    sys.path.insert(0, str(model_dir))  # the network's definition travels with its weights
    from model import Net  # noqa: PLC0415

    net = Net()
    net.load_state_dict(torch.load(model_dir / "model.pt", map_location="cpu"))
    net.eval()
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    test_set = datasets.MNIST(str(data_root), train=False, download=False, transform=transform)
    loss, correct = 0.0, 0
    with torch.no_grad():
        for images, labels in DataLoader(test_set, batch_size=1000):
            output = net(images)
            loss += F.nll_loss(output, labels, reduction="sum").item()
            correct += int(output.argmax(dim=1).eq(labels).sum().item())
    return {"accuracy": correct / len(test_set), "loss": loss / len(test_set), "images": len(test_set)}


def log_metrics(metrics: dict[str, float]) -> None:
    try:
        import mlflow  # noqa: PLC0415 - optional: the file is what the pipeline passes on
    except ImportError:
        return
    with mlflow.start_run():  # the step's own run where MLFLOW_RUN_ID is set (Azure ML, amlemu)
        mlflow.log_metrics({"test_accuracy": metrics["accuracy"], "test_loss": metrics["loss"]})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="evaluate.py", description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True, help="the train step's model folder")
    p.add_argument("--data", type=Path, required=True, help="the prepared folder (MNIST/raw)")
    p.add_argument("--metrics", type=Path, required=True, help="where metrics.json goes")
    args = p.parse_args(argv)
    if not (args.model / "model.pt").is_file() or not (args.model / "model.py").is_file():
        print(f"evaluate.py: error: --model {args.model}: model.pt and model.py expected there", file=sys.stderr)
        return 2
    metrics = evaluate(args.model, args.data)
    args.metrics.mkdir(parents=True, exist_ok=True)
    (args.metrics / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    log_metrics(metrics)
    print(f"test accuracy {metrics['accuracy']:.4f} (loss {metrics['loss']:.4f}) on {metrics['images']} images",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
