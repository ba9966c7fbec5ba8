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
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amlemu import servicekeys

TOKEN_SECONDS = 3600
URL_SECONDS = 4 * 3600  # a signed URL with an expiry (a run's log files): as long as a SAS the SDK reads
# azureml-core decodes its ARM token, unverified, for the tenant and expiry: tokens are JWTs
# (amlemu.servicekeys), not opaque strings.
TENANT = servicekeys.TENANT


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
        return cls(*servicekeys.load_or_create(path))

    def _mac(self, text: str) -> str:
        return hmac.new(self.key, text.encode(), hashlib.sha256).hexdigest()

    def check_identity(self, header: str | None) -> bool:
        return header is not None and hmac.compare_digest(header, self.identity_header)

    def issue(self, resource: str = "") -> tuple[str, int]:
        token, expires = servicekeys.encode(self.key, TOKEN_SECONDS, audience=resource)
        self.issued.add(token)
        return token, expires

    def issue_for_run(self, run_id: str, seconds: int) -> tuple[str, int]:
        """A run's token (AZUREML_RUN_TOKEN), good for its own routes only."""
        token, expires = servicekeys.run_token(self.key, run_id, seconds)
        self.issued.add(token)
        return token, expires

    def claims(self, authorization: str | None) -> dict[str, Any] | None:
        """The claims of the bearer token in an Authorization header, if this home issued it and
        it has not expired; a run token's name its run (servicekeys.RUN_CLAIM)."""
        return servicekeys.decode(self.key, (authorization or "").removeprefix("Bearer ").strip())

    def sign(self, resource: str) -> str:
        """The `sig` of a URL the service hands out (a blob container's SAS, a log file)."""
        return self._mac("url:" + resource)[:43]

    def check_signature(self, resource: str, sig: str | None) -> bool:
        # As bytes: a str with non-ASCII characters would raise a TypeError.
        return sig is not None and hmac.compare_digest(sig.encode(), self.sign(resource).encode())

    def sign_until(self, resource: str, seconds: int = URL_SECONDS) -> str:
        """The query of a URL good for `seconds`: `se=<its expiry, Unix time>&sig=...`, the expiry
        signed with the resource (a SAS's se=)."""
        expiry = int(time.time()) + seconds
        return f"se={expiry}&sig={self.sign(f'{resource}?se={expiry}')}"

    def check_until(self, resource: str, query: Mapping[str, str]) -> bool:
        """A query `sign_until` made for `resource`, not expired; a signature without se= never is."""
        expiry = query.get("se", "")
        return (expiry.isascii() and expiry.isdigit() and len(expiry) < 12 and int(expiry) > time.time()
                and self.check_signature(f"{resource}?se={expiry}", query.get("sig")))
