"""The trainer's argument handling, data checks and checkpoint discovery (no MPI needed)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TRAINER_DIR


def test_defaults(trainer_module) -> None:
    args = trainer_module.parse_args(["--data-dir", "/data"])
    assert (args.epochs, args.batch_size, args.lr, args.momentum) == (2, 64, 0.01, 0.9)
    assert args.output_dir == Path("outputs") and args.max_steps is None and not args.no_cuda


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        ([], "--data-dir"),
        (["--data-dir", "d", "--epochs", "0"], "--epochs: must be a positive integer, got 0"),
        (["--data-dir", "d", "--batch-size", "-3"], "--batch-size: must be a positive integer"),
        (["--data-dir", "d", "--lr", "0"], "--lr: must be a positive number, got 0"),
        (["--data-dir", "d", "--max-steps", "ten"], "--max-steps: invalid _positive_int value"),
    ],
)
def test_bad_arguments_name_the_option(trainer_module, capsys, argv, named) -> None:
    with pytest.raises(SystemExit) as exit_info:
        trainer_module.parse_args(argv)
    assert exit_info.value.code == 2
    assert named in capsys.readouterr().err


def test_data_root_accepts_root_mnist_or_raw_folder(trainer_module, mnist_subset: Path) -> None:
    for given in (mnist_subset, mnist_subset / "MNIST", mnist_subset / "MNIST" / "raw"):
        assert trainer_module.resolve_data_root(given) == mnist_subset


def test_missing_data_names_the_expected_files(trainer_module, tmp_path: Path) -> None:
    (tmp_path / "MNIST" / "raw").mkdir(parents=True)
    (tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte").write_bytes(b"")
    with pytest.raises(trainer_module.DataError) as err:
        trainer_module.resolve_data_root(tmp_path)
    message = str(err.value)
    assert f"--data-dir {tmp_path}: MNIST not found" in message
    for name in trainer_module.MNIST_FILES:
        assert f"MNIST/raw/{name}" in message


def test_missing_data_is_a_one_line_error_from_the_script(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(TRAINER_DIR / "train.py"), "--data-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"train.py: error: --data-dir {tmp_path}: MNIST not found")


def test_newest_checkpoint_is_by_epoch_number(trainer_module, tmp_path: Path) -> None:
    assert trainer_module.find_checkpoint(tmp_path / "absent") is None
    assert trainer_module.find_checkpoint(tmp_path) is None
    for epoch in (1, 2, 9, 10):
        trainer_module.checkpoint_path(tmp_path, epoch).write_bytes(b"")
    (tmp_path / "checkpoint-epoch99.tmp").write_bytes(b"")  # an interrupted write is not a checkpoint
    (tmp_path / "model.pt").write_bytes(b"")
    assert trainer_module.find_checkpoint(tmp_path).name == "checkpoint-epoch10.pt"
