"""Who may call the service: the managed-identity secret, the bearer tokens it issues, and the
signatures of the URLs it hands out (blob SAS, log files).

Tokens and signatures are HMACs under a key kept owner-only in the home, so they outlive a
restart (a client's cached token keeps working) and no list of them needs keeping; `issued`
still records the tokens of this process, for a test to look for them where they must not be.
The identity header is what `amlemu env` prints (IDENTITY_HEADER): whoever has it gets tokens.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from amlemu.servicefile import owner_only_write

TOKEN_SECONDS = 3600
ISSUER = "amlemu"
# Tokens are JWTs (HS256 under the home's key): azureml-core decodes its ARM token, unverified, for
# the tenant and expiry, so an opaque string would fail there; nothing else in them is read.
_HEADER = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').rstrip(b"=").decode()
TENANT = "00000000-0000-0000-0000-000000000000"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


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

    def _jwt_mac(self, signing_input: str) -> str:
        return _b64(hmac.new(self.key, signing_input.encode(), hashlib.sha256).digest())

    def issue(self, resource: str = "") -> tuple[str, int]:
        now = int(time.time())
        expires = now + TOKEN_SECONDS
        claims = {"iss": ISSUER, "aud": resource, "iat": now, "nbf": now, "exp": expires, "tid": TENANT,
                  "oid": TENANT, "jti": secrets.token_hex(8)}
        body = f"{_HEADER}.{_b64(json.dumps(claims, separators=(',', ':')).encode())}"
        token = f"{body}.{self._jwt_mac(body)}"
        self.issued.add(token)
        return token, expires

    def check_token(self, authorization: str | None) -> bool:
        token = (authorization or "").removeprefix("Bearer ").strip()
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != _HEADER:
            return False
        if not hmac.compare_digest(parts[2], self._jwt_mac(f"{parts[0]}.{parts[1]}")):
            return False
        try:
            claims = json.loads(_unb64(parts[1]))
        except ValueError:
            return False
        return isinstance(claims, dict) and claims.get("iss") == ISSUER and int(claims.get("exp", 0)) > time.time()

    def sign(self, resource: str) -> str:
        """The `sig` of a URL the service hands out (a blob container's SAS, a log file)."""
        return self._mac("url:" + resource)[:43]

    def check_signature(self, resource: str, sig: str | None) -> bool:
        return sig is not None and hmac.compare_digest(sig, self.sign(resource))
