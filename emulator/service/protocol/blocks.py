"""Block uploads, as Azure Storage takes them: azure-storage-blob sends a file over its single-put
size (64 MiB) as Put Block (`?comp=block&blockid=...`) for each piece, then Put Block List
(`?comp=blocklist`) naming the pieces in order. The pieces wait here, in memory, until the list
joins them into one blob; a list naming a piece never put is refused, as Azure does.

Memory is bounded: pieces are counted by what they hold (data, id and entry), per owner (the
user's share, each run's, all runs'), and forgotten an hour after their last piece or when
their run ends."""
from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from amlemu.service.state import ServiceError, bad_request

# What uncommitted pieces may hold, counted as they take memory (data, block id, an entry's
# bookkeeping): the user's uploads (a workspace token or a code upload's SAS), and each run's (its
# v1 artifact uploads): a job cannot fill the user's share, nor more than its own.
USER_SHARE = 2 * 1024**3
RUN_SHARE, RUNS_TOTAL = 256 * 1024**2, 1024**3
ENTRY_BYTES = 256  # a dict entry and its key, counted per block so that empty blocks are not free
MAX_ID = 88  # Azure: a block id is at most 64 bytes before its base64 (88 characters after)
MAX_BLOCKS = 100_000  # Azure's limit of uncommitted blocks per blob
EXPIRY = 3600.0  # seconds after its last piece: a blob never committed is dropped (Azure: 7 days)
USER = ""  # the owner of the user's pieces
# The block list body. Read with a pattern, not an XML parser: it comes from the client, and the
# standard library's parsers expand entities.
_BLOCK = re.compile(rb"<(Latest|Committed|Uncommitted)>\s*([A-Za-z0-9+/=_-]*)\s*</\1>")


def block_list_ids(body: bytes) -> list[str]:
    """The block ids of a Put Block List body, in order."""
    if b"<BlockList" not in body:
        raise bad_request("comp", "a Put Block List needs a <BlockList> body")
    return [match[2].decode() for match in _BLOCK.finditer(body)]


@dataclass
class Pending:
    """One blob's uncommitted pieces, whose they are and when the last came."""

    owner: str
    pieces: dict[str, bytes] = field(default_factory=dict)
    size: int = 0
    touched: float = 0.0


def _cost(block_id: str, data: bytes) -> int:
    return len(data) + len(block_id) + ENTRY_BYTES


@dataclass
class Blocks:
    staged: dict[tuple[str, str], Pending] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    def held(self, owner: str | None = None) -> int:
        """What the pieces of `owner` (None: everyone) hold."""
        with self.lock:
            return sum(p.size for p in self.staged.values() if owner is None or p.owner == owner)

    def _expire(self, active: Callable[[str], bool] | None) -> None:
        """Drop blobs whose last piece is over EXPIRY old, and the pieces of runs that ended."""
        now = self.clock()
        ended = {p.owner for p in self.staged.values() if p.owner != USER and active is not None
                 and not active(p.owner)}
        for key, pending in list(self.staged.items()):
            if now - pending.touched > EXPIRY or pending.owner in ended:
                del self.staged[key]

    def stage(self, container: str, blob: str, block_id: str, data: bytes, owner: str = USER,
              active: Callable[[str], bool] | None = None) -> None:
        if not block_id:
            raise bad_request("blockid", "Put Block needs a blockid")
        if len(block_id) > MAX_ID:
            raise bad_request("blockid", f"blockid: {len(block_id)} characters; a block id is at most 64 bytes "
                              f"before base64 ({MAX_ID} characters)")
        with self.lock:
            self._expire(active)
            pending = self.staged.get((container, blob))
            if pending is not None and pending.owner != owner:
                raise ServiceError(409, "BlobBeingUploaded", f"{container}/{blob} has pieces of another uploader",
                                   "blockid")
            pending = pending or Pending(owner)
            old = pending.pieces.get(block_id)
            if old is None and len(pending.pieces) >= MAX_BLOCKS:
                raise ServiceError(409, "BlockCountExceedsLimit", f"{container}/{blob} has {MAX_BLOCKS} uncommitted "
                                   "blocks; commit them with Put Block List", "blockid")
            grows = _cost(block_id, data) - (0 if old is None else _cost(block_id, old))
            self._check_share(owner, grows)
            pending.pieces[block_id] = data
            pending.size += grows
            pending.touched = self.clock()
            self.staged[(container, blob)] = pending

    def _check_share(self, owner: str, grows: int) -> None:
        mine = sum(p.size for p in self.staged.values() if p.owner == owner)
        runs = sum(p.size for p in self.staged.values() if p.owner != USER)
        share = USER_SHARE if owner == USER else RUN_SHARE
        if mine + grows > share or owner != USER and runs + grows > RUNS_TOTAL:
            whose = "the user's" if owner == USER else f"run {owner}'s" if mine + grows > share else "the runs'"
            raise ServiceError(413, "RequestBodyTooLarge", f"blockid: {whose} uncommitted blocks would pass "
                               f"{(share if mine + grows > share else RUNS_TOTAL) >> 20} MiB; commit them with "
                               "Put Block List, or put large data on a datastore with `amlemu data upload`",
                               "blockid")

    def commit(self, container: str, blob: str, body: bytes, owner: str = USER) -> bytes:
        """The blob the list makes; its pieces are forgotten, as Azure drops uncommitted blocks."""
        ids = block_list_ids(body)
        with self.lock:
            pending = self.staged.get((container, blob))
            if pending is not None and pending.owner == owner:
                del self.staged[(container, blob)]
            else:
                pending = Pending(owner)
        missing = [i for i in ids if i not in pending.pieces]
        if missing:
            raise ServiceError(400, "InvalidBlockList", f"block {missing[0]} of {container}/{blob} was never put",
                               "blocklist")
        return b"".join(pending.pieces[i] for i in ids)

    def upload(self, container: str, blob: str, query: dict[str, str], raw: bytes, owner: str = USER,
               active: Callable[[str], bool] | None = None) -> bytes | None:
        """A PUT's blob content: the body, or a committed list's pieces; None for a staged piece.
        Any other `comp` (append or page blobs) is refused naming it. `owner`: the run whose
        pieces these are (USER: the user's); `active` says whether a run still runs."""
        comp = query.get("comp")
        if comp == "block":
            self.stage(container, blob, query.get("blockid", ""), raw, owner, active)
            return None
        if comp == "blocklist":
            return self.commit(container, blob, raw, owner)
        if comp:
            raise ServiceError(400, "UnsupportedQueryParameter", f"comp={comp} is not served: only block blobs",
                               "comp")
        return raw
