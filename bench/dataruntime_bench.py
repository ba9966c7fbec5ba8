"""The data runtime's mount (emulator/storage/dataruntime/, issue 32) measured against Azurite.
Not a test: goals are targets, the figures are reported.

    .venv/bin/python bench/dataruntime_bench.py [--sizes 10,100,1000,3000] [--big-mb 256] [--repeats 2]

1. time to first byte against dataset size: mount, list the root and the first folder, read the
   first byte of one file (whole-file mode, the default: local placeholders, and the FUSE mount
   beside them), against prefetching the whole input into a node cache first; goal: flat for the mount;
2. sequential read of one large blob in block mode through the mount against adlfs' own streaming
   read (`fs.open(...).read()` in 1 MiB chunks) in this process (goal >= 0.9x the throughput);
   whole-file mode (open downloads, then reads) beside it;
3. disk used by a job that reads 1% of its input: the mount's cache against a prefetch's;
4. warm reads (a second pass over files already in the cache) through the mount against the same
   files on local disk, for small (64 KiB) and 1 MiB files: placeholders (the default) and FUSE.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common import bench_home, report  # noqa: E402 - bench/common.py

from amlemu.storage.datastores import DEFAULT  # noqa: E402
from amlemu.actions import execute  # noqa: E402
from amlemu.storage.dataruntime.mount import plan_unmount, start_process  # noqa: E402
from amlemu.storage.dataruntime.settings import from_env  # noqa: E402
from amlemu.storage.nodecache import CachePolicy, NodeCache, Source  # noqa: E402

MB = 1024 * 1024
MECHANISMS = {"placeholders": {}, "fuse": {"AMLEMU_DATASET_MOUNT_PLACEHOLDERS": "false"}}
SMALL = 64 * 1024  # one file of the time-to-first-byte sets
PER_FOLDER = 100


def upload(fs, root: str, files: dict[str, bytes]) -> None:  # type: ignore[no-untyped-def]
    fs.pipe({f"{root}/{name}": data for name, data in files.items()})


class Mounted:
    """A mount of `root` in a scratch folder, served by its own process as nodes will get it (the
    reader here does not share the server's interpreter lock), unmounted on exit."""

    def __init__(self, fs, root: str, work: Path, env: dict[str, str] | None = None) -> None:  # type: ignore[no-untyped-def]
        self.dir = Path(tempfile.mkdtemp(dir=work))
        (self.dir / "mnt").mkdir()
        self.settings = from_env(env or {})
        self.fs, self.root = fs, root

    def __enter__(self) -> Mounted:
        start_process(self.fs.to_json(), self.root, self.path, self.dir / "state", self.cache, self.dir / "logs",
                      self.settings)
        return self

    def __exit__(self, *_: object) -> None:
        execute([a for a in plan_unmount(self.dir / "state") if a.what != "data runtime cache"])  # kept for disk_bytes

    @property
    def path(self) -> Path:
        return self.dir / "mnt"

    @property
    def cache(self) -> Path:
        return self.dir / "cache"

    def disk_bytes(self) -> int:  # allocated: a placeholder never read takes no room
        return sum(p.stat().st_blocks * 512 for p in self.cache.rglob("*") if p.is_file() and p.suffix != ".ext4")


def first_byte(fs, container: str, work: Path, sizes: list[int]) -> dict:  # type: ignore[no-untyped-def]
    out = {}
    for n in sizes:
        root = f"{container}/ttfb-{n}"
        upload(fs, root, {f"d{i // PER_FOLDER:03d}/f{i:05d}.bin": os.urandom(SMALL) for i in range(n)})
        figures = {}
        for name, env in MECHANISMS.items():
            start = time.perf_counter()
            with Mounted(fs, root, work, env) as m:
                mounted = time.perf_counter()
                folder = sorted(os.listdir(m.path))[0]
                with open(m.path / folder / sorted(os.listdir(m.path / folder))[0], "rb") as f:
                    f.read(1)
                done = time.perf_counter()
            figures[f"{name}_mount_s"], figures[f"{name}_then_first_byte_s"] = (round(mounted - start, 3),
                                                                                round(done - mounted, 3))
        start = time.perf_counter()
        NodeCache(Path(tempfile.mkdtemp(dir=work))).sync(Source(DEFAULT, fs, container), f"ttfb-{n}", CachePolicy())
        out[f"{n}_files_{n * SMALL // MB}MiB"] = {**figures, "prefetch_s": round(time.perf_counter() - start, 3)}
    return out


def read_through(path: Path) -> float:
    start = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(MB):
            pass
    return time.perf_counter() - start


def sequential(fs, container: str, work: Path, big_mb: int, repeats: int) -> dict:  # type: ignore[no-untyped-def]
    root = f"{container}/big"
    upload(fs, root, {"big.bin": os.urandom(big_mb * MB)})
    size = big_mb * MB
    adlfs_s, block_s, whole_s = [], [], []
    for _ in range(repeats):  # alternated: this machine's speed drifts
        start = time.perf_counter()
        with fs.open(f"{root}/big.bin", "rb") as f:
            while f.read(MB):
                pass
        adlfs_s.append(time.perf_counter() - start)
        with Mounted(fs, root, work, {"DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED": "true"}) as m:
            block_s.append(read_through(m.path / "big.bin"))
        with Mounted(fs, root, work) as m:
            whole_s.append(read_through(m.path / "big.bin"))
    adlfs, block, whole = (size / statistics.median(x) / 1e6 for x in (adlfs_s, block_s, whole_s))
    return {"file_MiB": big_mb, "adlfs_stream_MB_per_s": round(adlfs), "block_mode_MB_per_s": round(block),
            "whole_file_mode_MB_per_s": round(whole), "block_vs_adlfs": round(block / adlfs, 2),
            "whole_vs_adlfs": round(whole / adlfs, 2)}


def warm(fs, root: str, work: Path) -> dict:  # type: ignore[no-untyped-def]
    local = Path(tempfile.mkdtemp(dir=work))
    fs.get(root, str(local), recursive=True)

    def read_all(base: Path) -> float:
        start, total = time.perf_counter(), 0
        for folder, _, files in os.walk(base):
            for name in files:
                with open(os.path.join(folder, name), "rb") as f:
                    total += len(f.read())
        return total / (time.perf_counter() - start)

    mount = {}
    for name, env in MECHANISMS.items():
        with Mounted(fs, root, work, env) as m:
            read_all(m.path)  # cold: fills the cache
            mount[name] = max(read_all(m.path) for _ in range(10))
    read_all(local)
    disk = max(read_all(local) for _ in range(10))
    files = sum(len(f) for _, _, f in os.walk(local))
    return {"files": files, "file_KiB": os.path.getsize(next(local.rglob("*.bin"))) // 1024,
            "local_disk_MB_per_s": round(disk / 1e6),
            **{f"{name}_MB_per_s": round(speed / 1e6) for name, speed in mount.items()},
            **{f"{name}_ratio": round(speed / disk, 2) for name, speed in mount.items()}}


def one_percent(fs, container: str, work: Path) -> dict:  # type: ignore[no-untyped-def]
    root = f"{container}/pct"
    upload(fs, root, {f"f{i:03d}.bin": os.urandom(MB) for i in range(100)})
    with Mounted(fs, root, work) as m:
        (m.path / "f042.bin").read_bytes()  # 1 file of 100: 1% of the input
    whole = m.disk_bytes()
    with Mounted(fs, f"{container}/big", work, {"DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED": "true"}) as m:
        size = os.stat(m.path / "big.bin").st_size
        with open(m.path / "big.bin", "rb") as f:
            f.read(size // 100)  # the first 1% of one large file
    block = m.disk_bytes()  # after the unmount: the read-ahead in flight has landed
    cache = NodeCache(Path(tempfile.mkdtemp(dir=work)))
    cache.sync(Source(DEFAULT, fs, container), "pct", CachePolicy())
    prefetch = sum(p.stat().st_size for p in cache.data.rglob("*") if p.is_file())
    return {"input_MiB": 100, "whole_file_mode_cache_MiB": round(whole / MB, 1), "prefetch_MiB": round(prefetch / MB, 1),
            "block_mode_1pct_of_one_file": {"file_MiB": size // MB, "cache_MiB": round(block / MB, 1)}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000,3000")
    parser.add_argument("--big-mb", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with bench_home("amlemu-drbench-", "process") as (work, emu):
        fs, container = emu.datastores.filesystem(DEFAULT)
        results = {"time_to_first_byte": first_byte(fs, container, work, [int(s) for s in args.sizes.split(",")])}
        results["sequential_read"] = sequential(fs, container, work, args.big_mb, args.repeats)
        results["disk_used_reading_1pct"] = one_percent(fs, container, work)
        sizes = [int(s) for s in args.sizes.split(",")]
        results["warm_read_vs_local_disk"] = [warm(fs, f"{container}/ttfb-{max(sizes)}", work),
                                              warm(fs, f"{container}/pct", work)]
        return report(results)


if __name__ == "__main__":
    sys.exit(main())
