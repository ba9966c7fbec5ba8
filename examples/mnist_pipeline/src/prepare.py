"""The pipeline's prepare step: check MNIST's IDX files and write the first N training and M test
images (MNIST is already shuffled) in the same layout, MNIST/raw/<the four files>, which the
trainer and the evaluate step read, plus prepared.json (the counts per label). Standard library
only: it runs before any training software is needed.

    python prepare.py --raw <folder holding MNIST/raw> --train-images 10000 --test-images 2000 --out <folder>
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
from collections import Counter
from pathlib import Path

SPLITS = {"train": "train", "test": "t10k"}  # split -> the IDX files' prefix
IMAGES_MAGIC, LABELS_MAGIC = 0x00000803, 0x00000801  # IDX: unsigned bytes, 3 and 1 dimensions


class DataError(Exception):
    pass


def find_raw(path: Path) -> Path:
    """The MNIST/raw folder under `path` (also accepted: the MNIST folder or the raw folder itself)."""
    for raw in (path / "MNIST" / "raw", path / "raw", path):
        if all((raw / f"{prefix}-{kind}-idx{dims}-ubyte").is_file()
               for prefix in SPLITS.values() for kind, dims in (("images", 3), ("labels", 1))):
            return raw
    raise DataError(f"--raw {path}: no MNIST IDX files (MNIST/raw/train-images-idx3-ubyte, ...) under it")


def header(data: bytes, magic: int, name: str) -> tuple[int, int]:
    """(count, header size) of an IDX file, checked."""
    dims = 3 if magic == IMAGES_MAGIC else 1
    size = 4 + 4 * dims
    if len(data) < size or struct.unpack(">I", data[:4])[0] != magic:
        raise DataError(f"{name}: not an IDX file of {dims} dimension(s)")
    shape = struct.unpack(f">{dims}I", data[4:size])
    item = shape[1] * shape[2] if dims == 3 else 1
    if len(data) != size + shape[0] * item:
        raise DataError(f"{name}: {len(data)} bytes, its header says {size + shape[0] * item}")
    return shape[0], size


def take(data: bytes, magic: int, count: int, name: str) -> bytes:
    """The first `count` items of an IDX file, as an IDX file."""
    total, size = header(data, magic, name)
    if count > total:
        raise DataError(f"{name}: {count} items asked, it has {total}")
    item = (len(data) - size) // total
    return data[:4] + struct.pack(">I", count) + data[8:size] + data[size:size + count * item]


def prepare(raw: Path, out: Path, counts: dict[str, int]) -> dict[str, object]:
    dest = out / "MNIST" / "raw"
    dest.mkdir(parents=True, exist_ok=True)
    summary: dict[str, object] = {}
    for split, prefix in SPLITS.items():
        images = take((raw / f"{prefix}-images-idx3-ubyte").read_bytes(), IMAGES_MAGIC, counts[split], f"{prefix} images")
        labels = take((raw / f"{prefix}-labels-idx1-ubyte").read_bytes(), LABELS_MAGIC, counts[split], f"{prefix} labels")
        (dest / f"{prefix}-images-idx3-ubyte").write_bytes(images)
        (dest / f"{prefix}-labels-idx1-ubyte").write_bytes(labels)
        summary[split] = {"images": counts[split], "per_label": dict(sorted(Counter(labels[8:]).items()))}
    (out / "prepared.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="prepare.py", description=__doc__.splitlines()[0])
    p.add_argument("--raw", type=Path, required=True, help="folder holding MNIST/raw/<the IDX files>")
    p.add_argument("--train-images", type=int, default=60000)
    p.add_argument("--test-images", type=int, default=10000)
    p.add_argument("--out", type=Path, required=True, help="the prepared folder (the step's output)")
    args = p.parse_args(argv)
    try:
        summary = prepare(find_raw(args.raw), args.out, {"train": args.train_images, "test": args.test_images})
    except DataError as exc:
        print(f"prepare.py: error: {exc}", file=sys.stderr)
        return 2
    print(f"prepared {summary['train']['images']} training and {summary['test']['images']} test images "  # type: ignore[index]
          f"into {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
