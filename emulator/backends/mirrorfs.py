"""The docker backend's offline node image: its root file system, built here (no registry is
reachable): mount points, usrmerge links and a passwd for root; the rest is this machine's
software, mounted read-only."""
from __future__ import annotations

import io
import tarfile


def mirror_rootfs() -> bytes:
    """The mirror image's file system: mount points, usrmerge links, and a passwd for root."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(name: str, *, kind: bytes = tarfile.DIRTYPE, target: str = "", data: bytes = b"",
                mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.linkname, info.size = kind, mode, target, len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
        for d in ("proc", "sys", "dev", "etc", "root", "mnt", "run", "usr", "var", "var/tmp", "opt"):
            add(d)
        add("tmp", mode=0o1777)
        for link in ("bin", "sbin", "lib", "lib64"):
            add(link, kind=tarfile.SYMTYPE, target=f"usr/{link}")
        add("etc/passwd", kind=tarfile.REGTYPE, data=b"root:x:0:0:root:/root:/bin/bash\n", mode=0o644)
        add("etc/group", kind=tarfile.REGTYPE, data=b"root:x:0:\n", mode=0o644)
    return buf.getvalue()
