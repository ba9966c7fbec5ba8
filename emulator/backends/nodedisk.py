"""A node's local disk (what backs /mnt/azureml on the node: NodeRequest.node_dir) as a file system
of its own, the size of the VM size's local (temp) disk, so that a job that fills it fails with
ENOSPC on its node, as on AmlCompute, instead of filling the home's file system (and with it the
state database and every other run of the home).

As root: a sparse file under IMAGE_ROOT/<home id>/ formatted ext4 and loop-mounted at the node's
folder (not in the home: whatever copies or reads the home's files whole, a backup, a test, a
`cp -r`, would write or read each image's full size, and the image keeps what the job deleted) (`mount -o loop` frees the loop device when the disk is unmounted). Both backends use it
the same way: a docker node bind-mounts that folder, a process node's sandbox binds it. A job may
write only as much as the disk holds, so its image never grows past that; its size is capped by
AMLEMU_NODE_DISK_GB and by half the free space where the images are kept. As another user there is no limit (mounting
needs root), and the notice says so.

The mount is its own record: whatever removes a node (remove_node, a cluster's deletion, cleanup)
detaches every disk mounted under the folders it removes (mounted_under).
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

from amlemu.errors import BackendError, ConfigError
from amlemu.home import Home

IMAGE_ROOT = Path("/var/tmp/amlemu/node-disks")  # <home id>/<cluster>/<node>.ext4 (root's: mounting needs root)
SETTING = "AMLEMU_NODE_DISK_GB"
DEFAULT_GB = 10.0
GIB = 1024**3
MIN_BYTES = 32 << 20  # ext4 and the run's folder (snapshot, MLflow store) need a few MiB
# No journal (a node's scratch disk, emptied after every run) and no inode tables written in the
# background: the image's real size stays a few MiB until the job writes.
MKFS = ("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "nodiscard,lazy_itable_init=1")
MOUNT_OPTIONS = "loop,nosuid,nodev,noinit_itable"
CAP_SYS_ADMIN = 21


def limited() -> bool:
    """Whether node disks can be file systems of their own here: mounting needs root with
    CAP_SYS_ADMIN (a container's root may lack it) and loop devices."""
    return _limited(os.geteuid(), shutil.which(MKFS[0]))


@functools.cache
def _limited(euid: int, mkfs: str | None) -> bool:
    """Kept per user and mkfs found: a value worked out once as another user, or on another PATH,
    is not this process's answer (the dry run and its supervisor disagreed so in a test session)."""
    if euid != 0 or mkfs is None or not os.path.exists("/dev/loop-control"):
        return False
    found = re.search(r"^CapEff:\s*([0-9a-f]+)$", Path("/proc/self/status").read_text(), re.MULTILINE)
    return bool(found and int(found.group(1), 16) & (1 << CAP_SYS_ADMIN))


def _setting() -> float:
    text = os.environ.get(SETTING, "").strip()
    try:
        value = float(text) if text else DEFAULT_GB
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ConfigError(SETTING, f"{text!r} is not a size in GiB",
                          f"set it to a number such as {DEFAULT_GB:g} (0: no limit), or unset it")
    return value


def size(sku_bytes: int) -> tuple[int | None, str | None]:
    """The node disk's size in bytes (None: no limit, a plain folder) and a notice when it is not
    the VM size's own."""
    setting = _setting()
    if not limited():
        return None, ("a node's local disk has no size limit here (a file system of its own needs root with "
                      "CAP_SYS_ADMIN and loop devices): a job can fill the home's file system")
    if setting == 0:
        return None, f"{SETTING}=0: a node's local disk has no size limit; a job can fill the home's file system"
    sku_bytes = sku_bytes or int(setting * GIB)
    where = next(p for p in (IMAGE_ROOT, *IMAGE_ROOT.parents) if p.exists())
    half_free = shutil.disk_usage(where).free // 2
    chosen = max(MIN_BYTES, min(sku_bytes, int(setting * GIB), half_free))
    if chosen >= sku_bytes:
        return chosen, None
    why = f"{SETTING}={setting:g}" if int(setting * GIB) <= half_free else f"half the free space where node disks are kept ({IMAGE_ROOT})"
    return chosen, f"a node's local disk is {_gib(chosen)} (the VM size's is {_gib(sku_bytes)}), capped by {why}"


def _gib(n: int) -> str:
    return f"{n / GIB:.3g} GiB"


def images_dir(home_root: Path, cluster: str) -> Path:
    """Where the images of a cluster's node disks are kept: IMAGE_ROOT/<home id>/<cluster>."""
    return IMAGE_ROOT / Home(home_root).id / cluster


def image_path(node_dir: Path) -> Path:
    """The image of the node disk mounted at <home>/nodes/<cluster>/<node>."""
    return images_dir(node_dir.parents[2], node_dir.parent.name) / f"{node_dir.name}.ext4"


def attach(node_dir: Path, disk_bytes: int | None) -> None:
    """The node's folder, a disk of `disk_bytes` mounted there (None: a plain folder). The disk is a
    shared mount: a data runtime mount made in it later reaches a docker node that binds it with
    slave propagation (runs/datamounts.py)."""
    node_dir.mkdir(parents=True, exist_ok=True)
    if disk_bytes is None or os.path.ismount(node_dir):
        return
    image = image_path(node_dir)
    image.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(image, "wb") as out:
            out.truncate(disk_bytes)  # sparse: blocks are used as the job writes them
        _run([*MKFS, str(image)])
        _run(["mount", "-o", MOUNT_OPTIONS, str(image), str(node_dir)])
        _run(["mount", "--make-shared", str(node_dir)])
    except BaseException:
        image.unlink(missing_ok=True)
        raise
    (node_dir / "lost+found").rmdir()  # ext4's, not the node's


def detach(node_dir: Path) -> None:
    """Unmount the node's disk (if mounted) and remove its image; the loop device goes with it."""
    # Lazily when busy (a sandbox being torn down): the loop device is freed with its last user. A
    # failure with the disk no longer mounted is another detach's success (a scale-down and a compute
    # deletion can both remove a node).
    done = None
    for argv in (["umount", str(node_dir)], ["umount", "--lazy", str(node_dir)]):
        if not os.path.ismount(node_dir):
            break
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode == 0:
            break
    else:
        if done is not None and os.path.ismount(node_dir):
            raise _failure(argv, done)
    image = image_path(node_dir)
    image.unlink(missing_ok=True)
    for folder in (image.parent, image.parent.parent):  # the cluster's and the home's, once empty
        try:
            folder.rmdir()
        except OSError:
            break


def propagates(node_dir: Path) -> bool:
    """Whether the node's disk is a shared mount (attach made it one): mounts made in it later reach
    a container that binds it with slave propagation."""
    try:
        table = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return False
    return any(line.split()[4].encode().decode("unicode_escape") == str(node_dir)
               and "shared:" in line.split(" - ", 1)[0] for line in table.splitlines())


def _mounts() -> list[tuple[Path, str]]:
    """(mount point, source) of this machine's mount table."""
    try:
        table = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return []
    # Field 5 is the mount point (space, tab, newline, backslash as octal escapes); the source
    # follows the " - " separator and the file system type.
    return [(Path(line.split()[4].encode().decode("unicode_escape")), line.split(" - ", 1)[1].split()[1])
            for line in table.splitlines() if " - " in line]


def mounted_under(folder: Path) -> list[Path]:
    """Mount points at or under `folder`, deepest first."""
    points = {p for p, _ in _mounts() if p == folder or folder in p.parents}
    return sorted(points, key=lambda p: -len(p.parts))


def every_home_disk() -> list[Path]:
    """The node disks of every home on this machine (`cleanup --all-homes`): loop mounts whose
    image is the one image_path names for the node folder <home>/nodes/<cluster>/<node> they are on."""
    found = []
    for point, source in _mounts():
        if not source.startswith("/dev/loop"):
            continue
        try:
            backing = Path(Path(f"/sys/block/{Path(source).name}/loop/backing_file").read_text().strip())
        except OSError:
            continue
        if len(point.parts) > 3 and backing == image_path(point):  # exactly the layout nodedisk makes
            found.append(point)
    return found


def detach_all(folder: Path) -> int:
    """Every node disk mounted under `folder` (a cluster's or the home's nodes/), detached."""
    found = mounted_under(folder)
    for point in found:
        detach(point)
    return len(found)


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise _failure(argv, done)


def _failure(argv: list[str], done: subprocess.CompletedProcess) -> BackendError:
    return BackendError(f"a node's disk: `{' '.join(argv)}` failed: {done.stderr.strip() or done.returncode}; "
                        f"{SETTING}=0 makes node disks plain folders (no size limit)")
