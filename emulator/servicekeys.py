"""The home's keys to its Azure ML service: the HMAC key its bearer tokens are signed with, and
its CA, which signs server certificates.

Low in the layers on purpose: the service (emulator/service/auth.py, tls.py) issues and checks
with them, and a run's supervisor (emulator/runs/servicelink.py), which may not import the
service, mints the run's own token (AZUREML_RUN_TOKEN) and the certificate of the link its docker
nodes reach the service through; the studio page (emulator/studio/) signs its logins with the same
key. The secrets file is made on first use, owner-only (`load_or_create`); the CA by the service.

Tokens are JWTs (HS256 under the home's key): azureml-core decodes them, unverified, for the
tenant and expiry. A run token carries RUN_CLAIM (its run's id) and is good for that run's own
routes only (emulator/service/routes.py checks the scope).
"""
from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import ipaddress
import json
import secrets
import time
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from amlemu.statefile import write_text

ISSUER = "amlemu"
TENANT = "00000000-0000-0000-0000-000000000000"
RUN_CLAIM = "amlemu.run"  # a run token's run id: the one run it may act on
_HEADER = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').rstrip(b"=").decode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, signing_input: str) -> str:
    return _b64(hmac.new(key, signing_input.encode(), hashlib.sha256).digest())


def encode(key: bytes, seconds: int, audience: str = "", **extra: Any) -> tuple[str, int]:
    """A token valid for `seconds` from now; (token, its expiry as a Unix time)."""
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": audience, "iat": now, "nbf": now, "exp": now + seconds, "tid": TENANT,
              "oid": TENANT, "jti": secrets.token_hex(8), **extra}
    body = f"{_HEADER}.{_b64(json.dumps(claims, separators=(',', ':')).encode())}"
    return f"{body}.{_mac(key, body)}", now + seconds


def decode(key: bytes, token: str) -> dict[str, Any] | None:
    """The claims of a token this key signed that has not expired, else None."""
    parts = token.split(".")
    # Bytes, not str: compare_digest raises a TypeError on a str with non-ASCII characters.
    if len(parts) != 3 or parts[0] != _HEADER or not hmac.compare_digest(
            parts[2].encode(errors="surrogateescape"), _mac(key, f"{parts[0]}.{parts[1]}").encode()):
        return None
    try:
        claims = json.loads(_unb64(parts[1]))
    except ValueError:
        return None
    if not isinstance(claims, dict) or claims.get("iss") != ISSUER:
        return None
    try:
        return claims if int(claims.get("exp", 0)) > time.time() else None
    except (TypeError, ValueError):
        return None


def run_token(key: bytes, run_id: str, seconds: int) -> tuple[str, int]:
    """AZUREML_RUN_TOKEN: good for `run_id`'s own routes only, while the run is active (the
    service also refuses it once the run has ended) and at most `seconds`."""
    return encode(key, seconds, audience="run", **{RUN_CLAIM: run_id})


def load_or_create(path: Path) -> tuple[str, bytes]:
    """The home's secrets (its identity header and signing key) from `path`, made once (owner-only
    from the start): stable across restarts."""
    try:
        saved = json.loads(path.read_text())
        return saved["identity_header"], bytes.fromhex(saved["key"])
    except (OSError, ValueError, KeyError, TypeError):
        header, key = secrets.token_hex(16), secrets.token_bytes(32)
        write_text(path, json.dumps({"identity_header": header, "key": key.hex()}), owner_only=True)
        return header, key


def home_key(service_dir: Path) -> bytes | None:
    """The key the home's service signs with (its secrets file), or None when it has none yet."""
    try:
        return bytes.fromhex(json.loads((service_dir / "secrets.json").read_text())["key"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


# --- certificates ----------------------------------------------------------------------------------
def cert_name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "amlemu"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


def now_utc() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def pem_key(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def alt_names(hosts: list[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def load_ca(folder: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    """The home's CA (ca.pem, ca-key.pem under the service folder) while it is valid, else None."""
    try:
        cert = x509.load_pem_x509_certificate((folder / "ca.pem").read_bytes())
        key = serialization.load_pem_private_key((folder / "ca-key.pem").read_bytes(), password=None)
    except (OSError, ValueError):
        return None
    return (cert, key) if isinstance(key, ec.EllipticCurvePrivateKey) and cert.not_valid_after_utc > now_utc() else None


def make_ca(common: str, days: int) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A CA of its own (a certificate that signs others, valid `days`) and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = cert_name(common)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now_utc() - datetime.timedelta(hours=1))
            .not_valid_after(now_utc() + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def issue_client_cert(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, common: str,
                      days: int) -> tuple[bytes, str]:
    """A client certificate (TLS client auth: a Docker engine's --tlsverify) signed by the CA: (its
    PEM, its key's PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(cert_name(common)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now_utc() - datetime.timedelta(hours=1))
            .not_valid_after(now_utc() + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), pem_key(key)


def issue_server_cert(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, hosts: list[str],
                      days: int) -> tuple[bytes, str]:
    """A server certificate for `hosts` signed by the CA: (its PEM, its key's PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(cert_name(hosts[0])).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now_utc() - datetime.timedelta(hours=1))
            .not_valid_after(now_utc() + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(alt_names(hosts)), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), pem_key(key)
