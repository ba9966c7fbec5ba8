"""Tiny pure-Python wheels made on the spot (no network, no build backend): a find-links folder the
environment tests install from with no index."""
from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def make_wheel(dest: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """`name==version`, whose module holds __version__, declaring `requires`."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n".encode(),
        f"{info}/METADATA": (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                             + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: amlemu-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }

    def digest(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record = "".join(f"{p},sha256={digest(d)},{len(d)}\n" for p, d in files.items()) + f"{info}/RECORD,,\n"
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in {**files, f"{info}/RECORD": record.encode()}.items():
            archive.writestr(member, data)
    return path


def wheelhouse(dest: Path) -> Path:
    """amlemupin 1.0 and 2.0, and amlemudep 1.0 (which requires amlemupin)."""
    for version in ("1.0", "2.0"):
        make_wheel(dest, "amlemupin", version)
    make_wheel(dest, "amlemudep", "1.0", ("amlemupin>=1.0",))
    return dest
