"""Shared fixtures: the real MNIST prepared by the setup, a fast deterministic subset of it, the trainer."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fixtures import mnist

REPO = Path(__file__).resolve().parents[1]
TRAINER_DIR = REPO / "trainer"


@pytest.fixture(scope="session")
def mnist_root() -> Path:
    """The complete real MNIST (60k/10k), verified against the original files' checksums."""
    return mnist.prepare().root


@pytest.fixture(scope="session")
def mnist_subset(mnist_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 2,000 training and 500 test images of the real MNIST: for tests that need speed."""
    dest = tmp_path_factory.mktemp("mnist-subset")
    return mnist.write_subset(mnist.MnistLayout(mnist_root), dest, train=2000, test=500).root


@pytest.fixture(scope="session")
def trainer_module():
    """trainer/train.py imported the way a node runs it (its own folder on sys.path)."""
    sys.path.insert(0, str(TRAINER_DIR))
    try:
        import train  # noqa: PLC0415
        yield train
    finally:
        sys.path.remove(str(TRAINER_DIR))
