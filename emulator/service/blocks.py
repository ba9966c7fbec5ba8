"""Block uploads, as Azure Storage takes them: azure-storage-blob sends a file over its single-put
size (64 MiB) as Put Block (`?comp=block&blockid=...`) for each piece, then Put Block List
(`?comp=blocklist`) naming the pieces in order. The pieces wait here, in memory, until the list
joins them into one blob; a list naming a piece never put is refused, as Azure does."""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field

from amlemu.service.state import ServiceError, bad_request

MAX_STAGED = 2 * 1024**3  # all uncommitted pieces together: more waits for `amlemu data upload`
# The block list body. Read with a pattern, not an XML parser: it comes from the client, and the
# standard library's parsers expand entities.
_BLOCK = re.compile(rb"<(Latest|Committed|Uncommitted)>\s*([A-Za-z0-9+/=_-]*)\s*</\1>")


def block_list_ids(body: bytes) -> list[str]:
    """The block ids of a Put Block List body, in order."""
    if b"<BlockList" not in body:
        raise bad_request("comp", "a Put Block List needs a <BlockList> body")
    return [match[2].decode() for match in _BLOCK.finditer(body)]


@dataclass
class Blocks:
    staged: dict[tuple[str, str], dict[str, bytes]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def stage(self, container: str, blob: str, block_id: str, data: bytes) -> None:
        if not block_id:
            raise bad_request("blockid", "Put Block needs a blockid")
        with self.lock:
            held = sum(len(piece) for pieces in self.staged.values() for piece in pieces.values())
            if held + len(data) > MAX_STAGED:
                raise ServiceError(413, "RequestBodyTooLarge", f"more than {MAX_STAGED >> 30} GiB of uncommitted blocks;"
                                   " put large data on a datastore with `amlemu data upload`", "blockid")
            self.staged.setdefault((container, blob), {})[block_id] = data

    def commit(self, container: str, blob: str, body: bytes) -> bytes:
        """The blob the list makes; its pieces are forgotten, as Azure drops uncommitted blocks."""
        ids = block_list_ids(body)
        with self.lock:
            pieces = self.staged.pop((container, blob), {})
        missing = [i for i in ids if i not in pieces]
        if missing:
            raise ServiceError(400, "InvalidBlockList", f"block {missing[0]} of {container}/{blob} was never put",
                               "blocklist")
        return b"".join(pieces[i] for i in ids)

    def upload(self, container: str, blob: str, query: dict[str, str], raw: bytes) -> bytes | None:
        """A PUT's blob content: the body, or a committed list's pieces; None for a staged piece.
        Any other `comp` (append or page blobs) is refused naming it."""
        comp = query.get("comp")
        if comp == "block":
            self.stage(container, blob, query.get("blockid", ""), raw)
            return None
        if comp == "blocklist":
            return self.commit(container, blob, raw)
        if comp:
            raise ServiceError(400, "UnsupportedQueryParameter", f"comp={comp} is not served: only block blobs",
                               "comp")
        return raw
