"""A v2 job's ro_mount inputs served on its nodes by the data runtime's mount (runs/datamounts.py),
on both backends: the listing at once, only the file read transferred, a change in storage not
seen until the attribute cache's TTL passes, the logs in system_logs/data_capability/, nothing
left mounted; and the pure parts: which inputs are mounted, the settings from the job's variables."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import STARTUP, wait_until

from amlemu.api import Emulator
from amlemu.errors import ConfigError
from amlemu.names import check_environment_variables
from amlemu.runs.contract import bindings
from amlemu.runs.datamounts import PREFETCH_VAR, DataMount, fsname, plan_mounts
from amlemu.specs import DataInput, DataMode, JobSpec, RunStatus
from amlemu.storage.datastores import DEFAULT

WS = f"azureml://datastores/{DEFAULT}/paths"
TTL_MS = 4000

READER = """
import errno, json, os, sys, time
folder, single = sys.argv[1], sys.argv[2]
listed_at = time.time()
print("listed", len(os.listdir(folder)), sorted(os.listdir(os.path.dirname(single))), flush=True)
path = os.path.join(folder, "f07.txt")
print("first", listed_at, open(path).read()[:6], open(single).read()[:6], flush=True)
try:
    open(os.path.join(folder, "new.txt"), "w")
    print("write allowed")
except OSError as exc:
    print("write", errno.errorcode[exc.errno])
reads, deadline = [], time.time() + 60
while time.time() < deadline:
    text = open(path).read()
    reads.append((time.time(), text[:6]))
    if text.startswith("after"):
        break
    time.sleep(0.1)
print("reads", json.dumps(reads), flush=True)
"""


def _job(inputs: dict[str, DataInput], env: dict[str, str] | None = None, layout: str = "v2") -> JobSpec:
    return JobSpec(code=None, compute="c1", experiment_name="e", command="true", inputs=inputs,
                   environment_variables=env or {}, log_layout=layout)


def test_which_inputs_the_data_runtime_mounts_and_its_settings() -> None:
    inputs = {"folder": DataInput(type="uri_folder", path=f"{WS}/d"),
              "file": DataInput(type="uri_file", path=f"{WS}/d/f.csv"),
              "copied": DataInput(type="uri_folder", path=f"{WS}/d", mode=DataMode.DOWNLOAD)}
    job = _job(inputs, {"DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED": "true"})
    mounts, settings = plan_mounts(job, bindings(job, "r1"), cores=2)
    by_ref = {m.ref: m for m in mounts}
    assert set(by_ref) == {"inputs.folder", "inputs.file"}  # download is a copy, as before
    assert by_ref["inputs.folder"] == DataMount("inputs.folder", by_ref["inputs.folder"].node_path, DEFAULT, "d")
    assert by_ref["inputs.folder"].node_path.endswith("/INPUT_folder")
    # a uri_file input: its folder on the node is the mount, showing that one file
    assert (by_ref["inputs.file"].path, by_ref["inputs.file"].only) == ("d", "f.csv")
    assert by_ref["inputs.file"].node_path.endswith("/INPUT_file")
    assert settings is not None and settings.block_based and settings.read_threads == 8  # 4 per core of the node
    # prefetch chosen: for every ro_mount input, or for the inputs named
    for choice, left in (("true", set()), ("file", {"inputs.folder"}), ("false", {"inputs.folder", "inputs.file"})):
        chosen = _job(inputs, {PREFETCH_VAR: choice})
        assert {m.ref for m in plan_mounts(chosen, bindings(chosen, "r1"))[0]} == left
    # amlemu's own choice of mechanism, a variable a job may set (not a platform one)
    fuse = _job(inputs, check_environment_variables({"AMLEMU_DATASET_MOUNT_PLACEHOLDERS": "false",
                                                     "AMLEMU_DATASET_MOUNT_PLACEHOLDER_MAX_FILES": "50"}))
    fuse_settings = plan_mounts(fuse, bindings(fuse, "r1"))[1]
    assert fuse_settings is not None and not fuse_settings.placeholders and fuse_settings.placeholder_max_files == 50
    assert settings.placeholders and settings.placeholder_max_files == 10_000
    v1 = _job(inputs, layout="v1")  # v1's datastore mounts stay blobfuse's long-TTL cache
    assert plan_mounts(v1, bindings(v1, "r1")) == ((), None)


@pytest.mark.parametrize(("env", "named"), [
    ({"DATASET_MOUNT_READ_THREADS": "0"}, "environment_variables.DATASET_MOUNT_READ_THREADS"),
    ({"DATASET_MOUNT_CACHE_SIZE": "lots"}, "environment_variables.DATASET_MOUNT_CACHE_SIZE"),
    ({"DATASET_UNMOUNT_TIMEOUT_SECONDS": "$(reboot)"}, "environment_variables.DATASET_UNMOUNT_TIMEOUT_SECONDS"),
    ({PREFETCH_VAR: "nope"}, f"environment_variables.{PREFETCH_VAR}"),
    ({"AMLEMU_DATASET_MOUNT_PLACEHOLDERS": "maybe"}, "environment_variables.AMLEMU_DATASET_MOUNT_PLACEHOLDERS"),
])
def test_a_bad_variable_is_one_line_naming_it(env: dict[str, str], named: str) -> None:
    job = _job({"d": DataInput(type="uri_folder", path=f"{WS}/d")}, env)
    with pytest.raises(ConfigError) as caught:
        plan_mounts(job, bindings(job, "r1"))
    assert str(caught.value).startswith(named + ":") and "\n" not in str(caught.value)


def test_each_mount_has_its_own_name_in_the_mount_table() -> None:
    names = {fsname(run, node, name) for run in ("r1", "r2") for node in ("c-node-0", "c-node-1") for name in ("a", "b")}
    assert len(names) == 8 and all(re.fullmatch(r"amlemu-dataruntime:[A-Za-z0-9_.:-]+", n) for n in names)


def _put(emu: Emulator, path: str, data: bytes) -> None:
    fs, root = emu.datastores.filesystem(DEFAULT)
    fs.pipe(f"{root}/{path}", data)


def _mounted(name_part: str) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if name_part in line]


def test_a_job_reads_one_file_of_many_through_the_mount_and_sees_a_change_after_the_ttl(
        emu: Emulator, cluster, make_job) -> None:
    cluster(max_nodes=1)
    before, after = b"before" + b"." * 65530, b"after!" + b"," * 1000
    fs, root = emu.datastores.filesystem(DEFAULT)
    fs.pipe({f"{root}/many/f{i:02d}.txt": before for i in range(30)})
    job = make_job(READER, extra=f"""
inputs:
  folder: {{path: {WS}/many, mode: ro_mount}}
  single: {{type: uri_file, path: {WS}/many/f03.txt, mode: ro_mount}}
environment_variables:
  DATASET_MOUNT_ATTRIBUTE_CACHE_TTL: {TTL_MS}
""", args="${{inputs.folder}} ${{inputs.single}}")
    run = emu.submit(job)
    first = wait_until(lambda: re.search(r"^first (\S+) before before$", run.logs(), re.MULTILINE), STARTUP,
                       "the job read the file through the mount")
    _put(emu, "many/f07.txt", after)
    changed_at = __import__("time").time()
    assert run.wait(timeout=120) is RunStatus.COMPLETED, run.record.error
    log = run.logs()
    assert "listed 30 ['f03.txt']" in log  # the whole listing at once; a uri_file's folder shows that file
    assert "write EROFS" in log
    listed_at = float(first.group(1))
    reads = json.loads(re.search(r"^reads (.*)$", log, re.MULTILINE).group(1))
    assert reads[-1][1] == "after!"  # seen once the TTL passed...
    seen = next(at for at, text in reads if text == "after!")
    assert seen >= listed_at + TTL_MS / 1000 and changed_at < listed_at + TTL_MS / 1000
    assert any(text == "before" and at > changed_at for at, text in reads)  # ...and not before: a stale read
    logs = run.dir / "system_logs" / "data_capability" / "c1-node-0"
    session = (logs / "data-capability.log").read_text()
    fetched = sorted(int(n) for n in re.findall(r"unmounted \S+: (\d+) bytes fetched", session))
    # only the files opened were transferred: f03 once (the uri_file), f07 twice (the change); never the other 28
    assert fetched == sorted([len(before), len(before) + len(after)])
    rslex = "".join(p.read_text() for p in logs.glob("rslex.log.*"))
    assert {m for m in re.findall(r"opened /(\S+) \(", rslex)} == {"f07.txt", "f03.txt"}
    plan = json.loads((run.dir / "system_logs" / "launch.json").read_text())["data_runtime"]
    assert {m["ref"] for m in plan["mounts"]} == {"inputs.folder", "inputs.single"}
    assert plan["settings"]["attribute_cache_ttl"] == TTL_MS / 1000
    assert not _mounted("amlemu-dataruntime:" + fsname(run.id, "x", "x").split(":")[1])  # unmounted at the end
    assert not list(emu.home.cache_dir("c1", "c1-node-0").glob("dataruntime/*/*"))  # records and caches removed


PLACEHOLDER_READER = """
import errno, mmap, os, sys, time
folder = sys.argv[1]
names = sorted(os.listdir(folder))
print("listed", len(names), os.stat(os.path.join(folder, "f05.bin")).st_size, flush=True)
path = os.path.join(folder, "f05.bin")
first = open(path, "rb").read()
with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
    assert mapped[:] == first
started = time.perf_counter()
for _ in range(200):
    assert open(path, "rb").read() == first
print("read", len(first), first[:4].hex(), "warm", round((time.perf_counter() - started) / 200 * 1e6), "us", flush=True)
for name in ("f05.bin", "new.bin"):
    try:
        open(os.path.join(folder, name), "ab")
        print("write allowed")
    except OSError as exc:  # EROFS; EACCES first for a node's user that is not root (the files are 0444)
        print("write", "refused" if exc.errno in (errno.EROFS, errno.EACCES) else errno.errorcode[exc.errno])
"""


def test_with_the_default_settings_files_are_local_placeholders_filled_on_first_read(
        emu: Emulator, cluster, make_job) -> None:
    """The runtime's defaults served as placeholders (docs/dataruntime.md): the listing and sizes at
    once; the first read (mmap too) downloads that one file whole, later reads are the node disk's
    own; writes are refused; nothing left mounted or held."""
    cluster(max_nodes=1)
    fs, root = emu.datastores.filesystem(DEFAULT)
    files = {f"f{i:02d}.bin": bytes([i]) * (64 << 10) for i in range(20)}
    fs.pipe({f"{root}/ph/{name}": data for name, data in files.items()})
    job = make_job(PLACEHOLDER_READER, extra=f"inputs:\n  folder: {{path: {WS}/ph, mode: ro_mount}}\n",
                   args="${{inputs.folder}}")
    run = emu.submit(job)
    assert run.wait(timeout=120) is RunStatus.COMPLETED, run.record.error
    log = run.logs()
    assert f"listed 20 {64 << 10}" in log and f"read {64 << 10} 05050505 warm" in log
    assert log.count("write refused") == 2
    logs = run.dir / "system_logs" / "data_capability" / "c1-node-0"
    rslex = "".join(p.read_text() for p in logs.glob("rslex.log.*"))
    assert "20 files, 0 folders as placeholders" in rslex
    assert re.findall(r"opened /(\S+) \(", rslex) == ["f05.bin"]  # once, whoever read it and however often
    session = (logs / "data-capability.log").read_text()
    assert "local placeholders filled on first read" in session
    assert re.search(rf"unmounted \S+: {64 << 10} bytes fetched, 1 files", session)
    assert not _mounted(fsname(run.id, "c1-node-0", "inputs.folder").split(":", 1)[1].replace(":", "_"))
    assert not list(emu.home.cache_dir("c1", "c1-node-0").glob("dataruntime/*/*"))  # records and caches removed


BIG = """
import hashlib, sys
digest, size = hashlib.sha256(), 0
with open(sys.argv[1], "rb") as f:
    while chunk := f.read(1 << 20):
        digest.update(chunk)
        size += len(chunk)
print("read", size, digest.hexdigest(), flush=True)
"""


def test_a_file_four_times_the_cache_limit_is_read_in_blocks_within_it(emu: Emulator, cluster, make_job) -> None:
    """Data larger than the node's cache (here, than its limit): block mode streams it, pruning
    blocks behind the reader; the cache never holds more than DATASET_MOUNT_CACHE_SIZE."""
    import hashlib
    import os

    cluster(max_nodes=1)
    data = os.urandom(8 << 20)
    _put(emu, "big/data.bin", data)
    job = make_job(BIG, extra=f"""
inputs:
  big: {{type: uri_file, path: {WS}/big/data.bin, mode: ro_mount}}
environment_variables:
  DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED: 'true'
  DATASET_MOUNT_CACHE_SIZE: 2MB
  DATASET_MOUNT_READ_BLOCK_SIZE: 256KB
  DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT: '2'
""", args="${{inputs.big}}")
    run = emu.submit(job)
    assert run.wait(timeout=STARTUP) is RunStatus.COMPLETED, run.record.error
    assert f"read {len(data)} {hashlib.sha256(data).hexdigest()}" in run.logs()
    log = (run.dir / "system_logs" / "data_capability" / "c1-node-0" / "data-capability.log").read_text()
    fetched, blocks, pruned, peak = map(int, re.search(
        r"(\d+) bytes fetched, \d+ files, (\d+) blocks, (\d+) pruned, peak cache (\d+) bytes", log).groups())
    assert fetched >= len(data) and blocks >= len(data) // (256 << 10) and pruned > 0
    assert 0 < peak <= 2 << 20  # the whole file is 4 times that


def test_cleanup_finds_and_unmounts_a_mount_left_behind_even_where_a_job_moved_it(tmp_path: Path) -> None:
    """What recovery and `amlemu cleanup` do with a mount whose supervisor died: found by its record
    in the node's cache folder, unmounted where the mount table has it (a job renamed a folder above
    its mount point), its server ended, its cache and record removed."""
    import fsspec
    import psutil

    from amlemu.actions import execute
    from amlemu.runs.datamounts import state_dir, unmount_node
    from amlemu.storage.dataruntime.mount import is_mounted, plan_unmount_under, start_process
    from amlemu.storage.dataruntime.settings import Settings

    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "a.txt").write_text("a")
    caches, records = tmp_path / "caches", []
    for node in ("c-node-0", "c-node-1"):
        point = tmp_path / "nodes" / node / "wd" / "INPUT_d"
        point.mkdir(parents=True)
        state = state_dir(caches / "c" / node, "run-1", "d")
        records.append(start_process(fsspec.filesystem("file").to_json(), str(tmp_path / "store"), point, state,
                                     state / "cache", tmp_path / "logs", Settings(unmount_timeout=5),
                                     fsname=fsname("run-1", node, "d")))
        assert (point / "a.txt").read_text() == "a"
    moved = tmp_path / "nodes" / "c-node-0" / "elsewhere"
    (tmp_path / "nodes" / "c-node-0" / "wd").rename(moved)  # the mount moves with its folder
    assert is_mounted(moved / "INPUT_d")
    unmount_node(caches / "c" / "c-node-0", "run-1", print)  # the run's end (or its recovery) on one node
    plan = plan_unmount_under(caches)  # cleanup: whatever is still recorded in the home's caches
    assert [a.what for a in plan].count("data runtime mount") == 1
    execute(plan)
    for record in records:
        assert not _mounted(record.fsname)
        assert not psutil.pid_exists(record.pid) or psutil.Process(record.pid).status() == psutil.STATUS_ZOMBIE
    assert not list(caches.glob("*/*/dataruntime/*/*/*"))


def test_the_mount_logs_never_hold_the_datastore_credential(tmp_path: Path) -> None:
    """A storage error may quote its request: the SAS token (and its signature alone) are masked."""
    import errno

    from amlemu.storage.dataruntime.logs import RuntimeLog, secrets_of

    fs_json = json.dumps({"cls": "adlfs.spec:AzureBlobFileSystem", "account_name": "acct",
                          "sas_token": "sv=2020-10-02&ss=b&sig=S3CRETsignature%3D"})
    log = RuntimeLog(tmp_path, secrets=secrets_of(fs_json))
    log.error("open", "/a.txt", errno.EACCES, "https://acct/c/a.txt?sv=2020-10-02&ss=b&sig=S3CRETsignature%3D")
    log.error("open", "/b.txt", errno.EACCES, "signature S3CRETsignature%3D did not match")
    text = "".join(p.read_text() for p in tmp_path.iterdir())
    assert "S3CRET" not in text and "acct" in text and text.count("***") == 2
