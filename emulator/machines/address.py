"""An engine's address, as Docker names it (`docker -H`, DOCKER_HOST), checked before anything
connects to it. Pure: whether TLS files exist is engines.py's to find out.

Three forms are taken:
- unix:///path/to/docker.sock: an engine on this machine (or a socket forwarded to it);
- ssh://user@host[:port]: dockerd on another machine, through its ssh server (the docker SDK's
  paramiko transport; the user's keys and ~/.ssh/config, host keys must be known);
- tcp://host:port with TLS (--tls-ca, --tls-cert, --tls-key): Docker's daemon docs warn that an
  unencrypted tcp socket gives root on that machine to anyone who reaches it, so plain tcp is refused.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from amlemu.errors import ConfigError

SCHEMES = ("unix", "ssh", "tcp")
FORMS = "unix:///path/docker.sock, ssh://user@host[:port] or tcp://host:port with --tls-ca/--tls-cert/--tls-key"
_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME_RE = re.compile(rf"^{_HOST_LABEL}(?:\.{_HOST_LABEL})*$")
USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$")  # POSIX portable user names
MAX_ADDRESS = 1024


@dataclass(frozen=True)
class TlsFiles:
    """A tcp:// engine's client TLS: the CA that signed the engine's certificate, and this client's
    certificate and key (`docker --tlsverify --tlscacert --tlscert --tlskey`)."""

    ca: str
    cert: str
    key: str

    def paths(self) -> dict[str, str]:
        return {"--tls-ca": self.ca, "--tls-cert": self.cert, "--tls-key": self.key}


def tls_files(ca: str | None, cert: str | None, key: str | None) -> TlsFiles | None:
    """The three --tls-* options: all or none."""
    given = {"--tls-ca": ca, "--tls-cert": cert, "--tls-key": key}
    if not any(given.values()):
        return None
    missing = [option for option, value in given.items() if not value]
    if missing:
        raise ConfigError(missing[0], "missing", "give --tls-ca, --tls-cert and --tls-key together")
    return TlsFiles(str(ca), str(cert), str(key))


def _bad(address: str, problem: str) -> ConfigError:
    return ConfigError("address", f"{address[:120]!r}: {problem}", f"give {FORMS}")


def _check_host(address: str, host: str | None) -> None:
    if not host:
        raise _bad(address, "no host")
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    if not HOSTNAME_RE.fullmatch(host) or len(host) > 253:
        raise _bad(address, f"{host[:80]!r} is not a host name or IP address")


def _port(address: str, parts) -> int | None:  # type: ignore[no-untyped-def]
    try:
        port = parts.port
    except ValueError:
        raise _bad(address, "the port is not a number from 1 to 65535") from None
    if port is not None and not 1 <= port <= 65535:
        raise _bad(address, "the port is not a number from 1 to 65535")
    return port


def check_address(address: str, tls: TlsFiles | None = None) -> str:
    """The address, checked (its scheme lower-cased); raises ConfigError naming what is wrong."""
    if not isinstance(address, str) or not address or len(address) > MAX_ADDRESS or not address.isprintable() \
            or address.strip() != address:
        raise _bad(str(address), "not an engine address")
    scheme, sep, rest = address.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in SCHEMES:
        raise _bad(address, f"the scheme must be one of {', '.join(s + '://' for s in SCHEMES)}")
    address = f"{scheme}://{rest}"
    if scheme == "unix":
        if not rest.startswith("/") or "/../" in rest + "/" or "?" in rest or "#" in rest:
            raise _bad(address, "a unix socket is given by its absolute path (unix:///run/docker.sock)")
    else:
        parts = urlsplit(address)
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise _bad(address, "nothing may follow the host and port")
        _check_host(address, parts.hostname)
        port = _port(address, parts)
        if scheme == "ssh" and (not parts.username or not USER_RE.fullmatch(parts.username) or parts.password):
            raise _bad(address, "ssh:// needs the user to log in as, and no password (ssh://user@host)")
        if scheme == "tcp" and (parts.username or port is None):
            raise _bad(address, "tcp:// is host:port, with no user (tcp://host:2376)")
    if scheme == "tcp" and tls is None:
        raise ConfigError("address", f"{address[:120]!r} is plain tcp: an unencrypted Docker socket gives root on "
                          "that machine to anyone who reaches it (Docker's daemon docs)",
                          "serve the engine with --tlsverify and give --tls-ca, --tls-cert and --tls-key, or "
                          "use ssh://user@host")
    if scheme != "tcp" and tls is not None:
        raise ConfigError("--tls-ca", f"TLS files are for tcp:// engines, not {scheme}://",
                          "leave --tls-ca/--tls-cert/--tls-key out")
    return address


def check_ip(text: str | None, option: str) -> str:
    """An IPv4 or IPv6 address (`machine add --service-address`), or "" when not given."""
    if not text:
        return ""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise ConfigError(option, f"{text[:80]!r} is not an IP address", "give the address as digits (10.0.0.2)") \
            from None
