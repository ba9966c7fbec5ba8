"""The data runtime's knobs: Azure ML's environment variables for a v2 `ro_mount`, parsed as pure data.

Defaults are the ones Azure ML documents for its data runtime (the page "Access data in a job",
its mount settings): whole-file open mode, an attribute cache that never expires, 2 MB blocks with
32 read ahead in block mode through a 128 MB memory cache, 4 threads per core, an unlimited disk
cache that leaves 150 MB free, 30 s to unmount. A bad value is one line naming the variable and the fix.
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from typing import Any

from amlemu.errors import ConfigError

MB = 1024 * 1024
VARIABLES = ("DATASET_MOUNT_ATTRIBUTE_CACHE_TTL", "DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED",
             "DATASET_MOUNT_READ_BLOCK_SIZE", "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT", "DATASET_MOUNT_READ_THREADS",
             "DATASET_MOUNT_CACHE_SIZE", "DATASET_RESERVED_FREE_DISK_SPACE", "DATASET_UNMOUNT_TIMEOUT_SECONDS",
             "RSLEX_DOWNLOADER_THREADS", "DATASET_MOUNT_MEMORY_CACHE_SIZE", "DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED")
# Documented knobs of the runtime that this mount reads but does not act on (its disk writes have no
# queue of their own, its pruning no thresholds, its fetches no retry count): named in the mount's
# log so a user sees they were taken in and not honoured.
NOT_EMULATED = ("DATASET_MOUNT_BLOCK_FILE_CACHE_MAX_QUEUE_SIZE", "DATASET_MOUNT_BLOCK_FILE_CACHE_WRITE_THREADS",
                "DATASET_MOUNT_FILE_CACHE_PRUNE_THRESHOLD", "DATASET_MOUNT_FILE_CACHE_PRUNE_TARGET",
                "AZUREML_DATASET_HTTP_RETRY_COUNT")
TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


@dataclass(frozen=True)
class Settings:
    """One mount's settings. Sizes in bytes, times in seconds; None where Azure means 'no limit'."""

    attribute_cache_ttl: float | None = None  # None: attributes and listings never expire
    block_based: bool = False  # False: open() downloads the whole file (the runtime's default)
    read_block_size: int = 2 * MB
    read_buffer_block_count: int = 32  # blocks read ahead of the one asked for
    read_threads: int = 4
    memory_cache_size: int = 128 * MB  # block mode: blocks read ahead wait here, then go to disk
    block_file_cache: bool = True  # block mode: blocks are also kept on disk (within cache_size)
    cache_size: int | None = None  # None: unlimited
    keep_free: int | None = None  # a negative DATASET_MOUNT_CACHE_SIZE: disk space the cache leaves free
    reserved_free_disk_space: int = 150 * MB
    unmount_timeout: float = 30.0
    downloader_threads: int = 4
    ignored: tuple[str, ...] = ()  # documented variables given but not emulated (logged at mount)
    # amlemu's own: serve default settings as local placeholders (placeholders.py); false: always FUSE.
    # An input of more files goes through FUSE, whose listing is lazy: placeholders wait for the whole
    # listing (~0.45 ms a blob on Azurite) and are made one file each (~0.07 ms) before a job starts.
    placeholders: bool = True
    placeholder_max_files: int = 10_000

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ignored": list(self.ignored)}

    def _checked(self) -> Settings:
        if self.read_block_size < 4096:
            raise ConfigError("DATASET_MOUNT_READ_BLOCK_SIZE", f"{self.read_block_size} bytes is too small",
                              "use at least 4KB (the default is 2MB)")
        return self

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Settings:
        return cls(**{**data, "ignored": tuple(data.get("ignored", ()))})


def parse_size(value: str, name: str) -> int:
    """'2097152', '2MB', '10 GB' -> bytes (binary units; a bare number is bytes)."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)I?B?\s*", value.upper())
    if not match:
        raise ConfigError(name, f"'{value}' is not a size", "write bytes, or a number with KB, MB or GB (e.g. 2MB)")
    return int(match.group(1)) * 1024 ** " KMGT".index(match.group(2) or " ")


def _int(env: dict[str, str], name: str, default: int, least: int = 1) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not re.fullmatch(r"-?\d+", raw) or int(raw) < least:
        raise ConfigError(name, f"'{raw}' is not a whole number of at least {least}",
                          f"set it to e.g. {default}, or unset it for the default")
    return int(raw)


def _bool(env: dict[str, str], name: str, default: bool = False) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw and raw not in TRUE + FALSE:
        raise ConfigError(name, f"'{env[name]}' is not true or false", "set it to true or false")
    return raw in TRUE if raw else default


def _ttl(env: dict[str, str], name: str = "DATASET_MOUNT_ATTRIBUTE_CACHE_TTL") -> float | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    if not re.fullmatch(r"\d+", raw):
        raise ConfigError(name, f"'{raw}' is not a number of milliseconds",
                          "e.g. 60000 for a minute; unset it for attributes that never expire")
    return int(raw) / 1000


def _cache_size(env: dict[str, str], name: str = "DATASET_MOUNT_CACHE_SIZE") -> tuple[int | None, int | None]:
    """(limit, keep_free): a positive size caps the cache, a negative one is the disk to leave free."""
    raw = env.get(name, "").strip()
    if not raw:
        return None, None
    if raw.startswith("-"):
        return None, parse_size(raw[1:], name)
    return parse_size(raw, name), None


def from_env(env: dict[str, str], cores: int | None = None) -> Settings:
    """A job's environment variables -> the mount's Settings; `cores` scales the per-core thread
    defaults (the node's cores; this machine's when None)."""
    per_core = 4 * (cores or os.cpu_count() or 1)
    limit, keep_free = _cache_size(env)
    timeout = env.get("DATASET_UNMOUNT_TIMEOUT_SECONDS", "").strip()
    if timeout and not re.fullmatch(r"\d+(\.\d+)?", timeout):
        raise ConfigError("DATASET_UNMOUNT_TIMEOUT_SECONDS", f"'{timeout}' is not a number of seconds",
                          "e.g. 30, or unset it for the default")
    reserved = env.get("DATASET_RESERVED_FREE_DISK_SPACE", "").strip()
    return Settings(
        attribute_cache_ttl=_ttl(env),
        block_based=_bool(env, "DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED"),
        read_block_size=parse_size(env["DATASET_MOUNT_READ_BLOCK_SIZE"], "DATASET_MOUNT_READ_BLOCK_SIZE")
        if env.get("DATASET_MOUNT_READ_BLOCK_SIZE", "").strip() else 2 * MB,
        memory_cache_size=parse_size(env["DATASET_MOUNT_MEMORY_CACHE_SIZE"], "DATASET_MOUNT_MEMORY_CACHE_SIZE")
        if env.get("DATASET_MOUNT_MEMORY_CACHE_SIZE", "").strip() else 128 * MB,
        block_file_cache=_bool(env, "DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED", default=True),
        read_buffer_block_count=_int(env, "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT", 32, least=0),
        read_threads=_int(env, "DATASET_MOUNT_READ_THREADS", per_core),
        cache_size=limit, keep_free=keep_free,
        reserved_free_disk_space=parse_size(reserved, "DATASET_RESERVED_FREE_DISK_SPACE") if reserved else 150 * MB,
        unmount_timeout=float(timeout) if timeout else 30.0,
        downloader_threads=_int(env, "RSLEX_DOWNLOADER_THREADS", per_core),
        ignored=tuple(name for name in NOT_EMULATED if env.get(name, "").strip()),
        placeholders=_bool(env, "AMLEMU_DATASET_MOUNT_PLACEHOLDERS", default=True),
        placeholder_max_files=_int(env, "AMLEMU_DATASET_MOUNT_PLACEHOLDER_MAX_FILES", 10_000, least=0),
    )._checked()
