"""The service's TLS: a CA of its own kept under the home, a server certificate it signs, and the
CA bundle clients are pointed at.

The CA is made once and kept (<home>/service/ca.pem, its key owner-only), so a trust set up once
(REQUESTS_CA_BUNDLE, a browser) survives restarts; the server certificate is re-issued when the
names it must cover change. The bundle is certifi's roots plus this CA: a process pointed at the
service still verifies the real Azure (REQUESTS_CA_BUNDLE replaces requests' roots, it does not add).
azure-ai-ml refuses bearer tokens over plain http, so TLS is not optional.
"""
from __future__ import annotations

import datetime
import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path

import certifi
import psutil
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from amlemu import statefile
from amlemu.errors import ConfigError
from amlemu.servicefile import is_loopback
from amlemu.servicekeys import alt_names, issue_server_cert, make_ca, now_utc, pem_key

CA_YEARS, SERVER_DAYS = 10, 365


@dataclass(frozen=True)
class TlsFiles:
    ca: Path  # our CA alone
    bundle: Path  # certifi's roots + our CA: what clients trust
    cert: Path  # the server's certificate chain
    key: Path  # the server's key (owner-only)


def machine_names() -> list[str]:
    """This machine's names as other machines reach it (`amlemu serve --allow-remote` certifies
    them and prints the first): its full and short host names, then its addresses, IPv4 first.
    Loopback is left out, and so are link-local addresses (no URL can name one without its zone)."""
    names = [n.lower() for n in (socket.getfqdn(), socket.gethostname())
             if n and not is_loopback(n) and not n.lower().startswith("localhost")]
    found = [ipaddress.ip_address(a.address.split("%")[0]) for addrs in psutil.net_if_addrs().values()
             for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)]
    usable = sorted((ip for ip in found if not ip.is_loopback and not ip.is_link_local), key=lambda ip: ip.version)
    return list(dict.fromkeys([*names, *(str(ip) for ip in usable)]))


def _load_or_make_ca(folder: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = folder / "ca.pem", folder / "ca-key.pem"
    if cert_path.exists() and key_path.exists():
        try:
            cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        except (ValueError, TypeError) as exc:  # cut short, or not ours: never replaced behind the user's back
            raise ConfigError(str(cert_path), f"the service's CA cannot be read ({exc})",
                              f"move {cert_path.name} and {key_path.name} away: a new CA is made, and clients "
                              "trust it through the new ca-bundle.pem `amlemu env` points at") from None
        if isinstance(key, ec.EllipticCurvePrivateKey) and cert.not_valid_after_utc > now_utc():
            return cert, key
    cert, key = make_ca(f"amlemu local CA {folder.parent.name}", 365 * CA_YEARS)
    statefile.write_text(key_path, pem_key(key), owner_only=True)
    statefile.write_bytes(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def _covers(cert_path: Path, hosts: list[str], ca: x509.Certificate) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return False
    fresh = cert.not_valid_after_utc > now_utc() + datetime.timedelta(days=7)
    return fresh and cert.issuer == ca.subject and set(san) == set(alt_names(hosts))


def ensure(folder: Path, hosts: list[str]) -> TlsFiles:
    """The CA (made once), a server certificate for `hosts` (re-issued when they change or it
    nears its end) and the bundle, under `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = _load_or_make_ca(folder)
    files = TlsFiles(folder / "ca.pem", folder / "ca-bundle.pem", folder / "server.pem", folder / "server-key.pem")
    if not (_covers(files.cert, hosts, ca_cert) and files.key.exists()):
        cert_pem, key_pem = issue_server_cert(ca_cert, ca_key, hosts, SERVER_DAYS)
        statefile.write_text(files.key, key_pem, owner_only=True)
        statefile.write_bytes(files.cert, cert_pem)
    ours = files.ca.read_text()
    bundle = Path(certifi.where()).read_text() + "\n# amlemu local CA\n" + ours
    if not files.bundle.exists() or files.bundle.read_text() != bundle:
        statefile.write_text(files.bundle, bundle)
    return files
