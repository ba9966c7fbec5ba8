"""Who may call the service: the managed-identity secret, the bearer tokens it issues, and the
signatures of the URLs it hands out (blob SAS, log files).

Tokens and signatures are HMACs under a key kept owner-only in the home, so they outlive a
restart (a client's cached token keeps working) and no list of them needs keeping; `issued`
still records the tokens of this process, for a test to look for them where they must not be.
The identity header is what `amlemu env` prints (IDENTITY_HEADER): whoever has it gets tokens.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from amlemu.servicefile import owner_only_write

TOKEN_SECONDS = 3600
PREFIX = "amlemu."


@dataclass
class Auth:
    identity_header: str
    key: bytes
    issued: set[str] = field(default_factory=set)

    @classmethod
    def fresh(cls) -> Auth:
        return cls(secrets.token_hex(16), secrets.token_bytes(32))

    @classmethod
    def load_or_create(cls, path: Path) -> Auth:
        """The home's secrets (made once, owner-only): stable across restarts."""
        try:
            saved = json.loads(path.read_text())
            return cls(saved["identity_header"], bytes.fromhex(saved["key"]))
        except (OSError, ValueError, KeyError):
            auth = cls.fresh()
            owner_only_write(path, json.dumps({"identity_header": auth.identity_header, "key": auth.key.hex()}))
            return auth

    def _mac(self, text: str) -> str:
        return hmac.new(self.key, text.encode(), hashlib.sha256).hexdigest()

    def check_identity(self, header: str | None) -> bool:
        return header is not None and hmac.compare_digest(header, self.identity_header)

    def issue(self) -> tuple[str, int]:
        expires = int(time.time()) + TOKEN_SECONDS
        nonce = secrets.token_hex(8)
        token = f"{PREFIX}{expires}.{nonce}.{self._mac(f'{expires}.{nonce}')}"
        self.issued.add(token)
        return token, expires

    def check_token(self, authorization: str | None) -> bool:
        token = (authorization or "").removeprefix("Bearer ").strip()
        parts = token.removeprefix(PREFIX).split(".") if token.startswith(PREFIX) else []
        if len(parts) != 3 or not parts[0].isdigit():
            return False
        expires, nonce, mac = parts
        return int(expires) > time.time() and hmac.compare_digest(mac, self._mac(f"{expires}.{nonce}"))

    def sign(self, resource: str) -> str:
        """The `sig` of a URL the service hands out (a blob container's SAS, a log file)."""
        return self._mac("url:" + resource)[:43]

    def check_signature(self, resource: str, sig: str | None) -> bool:
        return sig is not None and hmac.compare_digest(sig, self.sign(resource))
