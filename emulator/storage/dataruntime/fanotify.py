"""Linux fanotify's pre-content events (FAN_PRE_ACCESS, Linux 6.14+), through libc: the kernel holds
a read (or mmap fault, splice, write) of a marked file until a listener answers, so the listener can
fill the file's content first. Made for hierarchical storage managers; the data runtime's
placeholder mounts use it (placeholders.py). Needs CAP_SYS_ADMIN and a file system that allows it
(ext4, xfs, btrfs).

The constants are the kernel's uapi values (include/uapi/linux/fanotify.h), which this machine's
headers predate.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

FAN_CLOEXEC, FAN_NONBLOCK, FAN_CLASS_PRE_CONTENT = 0x1, 0x2, 0x8
FAN_UNLIMITED_QUEUE, FAN_UNLIMITED_MARKS = 0x10, 0x20
FAN_MARK_ADD, FAN_MARK_REMOVE, FAN_MARK_FLUSH = 0x1, 0x2, 0x80
FAN_PRE_ACCESS = 0x00100000
FAN_Q_OVERFLOW = 0x4000
FAN_ALLOW, FAN_DENY = 0x1, 0x2
METADATA = struct.Struct("=IBBHQii")  # event_len, vers, reserved, metadata_len, mask, fd, pid
METADATA_VERSION = 3
RESPONSE = struct.Struct("=iI")  # fd, response
# The only errors a listener may deny a read with (fanotify_is_valid_errno); ENOENT and EACCES are not.
DENY_ERRNOS = frozenset({errno.EPERM, errno.EIO, errno.EBUSY, errno.ETXTBSY, errno.EAGAIN, errno.ENOSPC,
                         errno.EDQUOT})
AT_FDCWD = -100

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fanotify_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
_libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


@dataclass(frozen=True)
class Event:
    mask: int
    fd: int  # the accessed file, opened for the listener (FMODE_NONOTIFY: its own reads raise nothing)
    pid: int  # the process whose access waits for the answer


def deny_response(code: int) -> int:
    """FAN_DENY carrying the errno the reader gets (FAN_DENY_ERRNO); EIO where the kernel allows no other."""
    return FAN_DENY | ((code if code in DENY_ERRNOS else errno.EIO) & 0xFF) << 24


class Group:
    """One fanotify group of the pre-content class: marks on files, their events, the answers."""

    def __init__(self) -> None:
        self.fd = _check(_libc.fanotify_init(FAN_CLASS_PRE_CONTENT | FAN_CLOEXEC | FAN_UNLIMITED_QUEUE
                                             | FAN_UNLIMITED_MARKS, os.O_RDONLY | os.O_LARGEFILE), "fanotify_init")

    def mark(self, path: str) -> None:
        """Hold every access to this file's content until answered (an inode mark: any mount of it)."""
        _check(_libc.fanotify_mark(self.fd, FAN_MARK_ADD, FAN_PRE_ACCESS, AT_FDCWD, os.fsencode(path)),
               f"fanotify_mark {path}")

    def mark_open(self, fd: int) -> None:
        """mark() of the file open as `fd` (no path looked up again)."""
        _check(_libc.fanotify_mark(self.fd, FAN_MARK_ADD, FAN_PRE_ACCESS, fd, None), "fanotify_mark")

    def unmark(self, path: str) -> None:
        _check(_libc.fanotify_mark(self.fd, FAN_MARK_REMOVE, FAN_PRE_ACCESS, AT_FDCWD, os.fsencode(path)),
               f"fanotify_mark remove {path}")

    def flush(self) -> None:
        """Every inode mark removed (their inodes are no longer pinned by the group)."""
        _check(_libc.fanotify_mark(self.fd, FAN_MARK_FLUSH, 0, AT_FDCWD, None), "fanotify_mark flush")

    def read(self) -> Iterator[Event]:
        """The events waiting now (blocks until there is one)."""
        buf = os.read(self.fd, 64 * 1024)
        offset = 0
        while offset + METADATA.size <= len(buf):
            length, version, _, _, mask, fd, pid = METADATA.unpack_from(buf, offset)
            if version != METADATA_VERSION or length < METADATA.size:
                raise OSError(errno.EPROTO, f"fanotify event version {version}, expected {METADATA_VERSION}")
            offset += length
            yield Event(mask, fd, pid)

    def answer(self, event: Event, response: int) -> None:
        """Let the access go on (FAN_ALLOW) or fail it (deny_response), and close the event's file."""
        try:
            os.write(self.fd, RESPONSE.pack(event.fd, response))
        finally:
            os.close(event.fd)

    def close(self) -> None:
        os.close(self.fd)


def unsupported(folder: str) -> str | None:
    """Why files in `folder` cannot be placeholders here (None: they can): the kernel, the
    capability or the file system refuses a pre-content mark."""
    probe = os.path.join(folder, ".fanotify-probe")
    try:
        with open(probe, "wb"):
            pass
        group = Group()
        try:
            group.mark(probe)
        finally:
            group.close()
    except OSError as exc:
        return str(exc)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(probe)
    return None

