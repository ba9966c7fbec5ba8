"""Datastores on the emulated nodes, end to end on both backends: read-only mounts prefetched into each
node's own cache, stale reads on a long-lived node, download mode, outputs written back whatever
the ending, v1's data references, errors that name the input, and no credential anywhere."""
from __future__ import annotations

import errno
from pathlib import Path

import pytest
from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas
from conftest import STARTUP, wait_until

from amlemu.api import Emulator
from amlemu.errors import ConfigError
from amlemu.specs import RunStatus
from amlemu.storage.azurite import ACCOUNT, ACCOUNT_KEY
from amlemu.storage.datastores import DEFAULT, DatastoreSpec

pytestmark = pytest.mark.slow
WS = f"azureml://datastores/{DEFAULT}/paths"
PREFETCH = "AMLEMU_DATA_PREFETCH"  # these tests are of the prefetched node cache (the data runtime's mount: test_datamounts.py)


def _put(emu: Emulator, path: str, data: bytes) -> None:
    fs, root = emu.datastores.filesystem(DEFAULT)
    fs.pipe(f"{root}/{path}", data)


def _get(emu: Emulator, path: str, datastore: str = DEFAULT) -> bytes:
    fs, root = emu.datastores.filesystem(datastore)
    return fs.cat(f"{root}/{path}")


READ_AND_TRY_WRITE = """
import errno, os, socket, sys
rank = os.environ["OMPI_COMM_WORLD_RANK"]
mounted, copied = sys.argv[1], sys.argv[2]
print("content", rank, open(os.path.join(mounted, "v.txt")).read(), flush=True)
try:
    open(os.path.join(mounted, "new.txt"), "w").write("x")
    print("write", rank, "allowed")
except OSError as exc:
    print("write", rank, errno.errorcode[exc.errno])
open(os.path.join(copied, "scratch.txt"), "w").write("download mode gives a writable copy")
print("copied", rank, open(os.path.join(copied, "v.txt")).read())
print("reference", rank, os.environ["AZUREML_DATAREFERENCE_mounted"] == mounted)
"""


def test_ro_mount_is_read_only_per_node_cache_and_download_is_a_copy(emu: Emulator, cluster, make_job) -> None:
    cluster()
    _put(emu, "shared/v.txt", b"hello blob")
    job = make_job(READ_AND_TRY_WRITE, nodes=2, extra=f"""
inputs:
  mounted: {{path: {WS}/shared, mode: ro_mount}}
  copied: {{path: {WS}/shared, mode: download}}
environment_variables:
  {PREFETCH}: "true"
""",
                   args="${{inputs.mounted}} ${{inputs.copied}}")
    run = emu.submit(job)
    assert run.wait(timeout=120) is RunStatus.COMPLETED, run.record.error
    for rank in (0, 1):
        log = run.logs(rank)
        assert f"content {rank} hello blob" in log
        assert f"write {rank} {errno.errorcode[errno.EROFS]}" in log  # a write fails with EROFS
        assert f"copied {rank} hello blob" in log and f"reference {rank} True" in log
    for node in ("c1-node-0", "c1-node-1"):  # every node has its own cache, filled on its own
        assert (emu.home.cache_dir("c1", node) / "data" / DEFAULT / "shared" / "v.txt").read_bytes() == b"hello blob"
    lifecycle = (run.dir / "system_logs" / "lifecycle.txt").read_text()
    assert lifecycle.count("inputs.mounted: ro_mount of") == 2 and "1 fetched" in lifecycle
    assert emu.datastores.ls(f"{WS}/shared") == [("shared/v.txt", 10)]  # the write never reached the store


READ_ONCE = """
import sys
print("read:", open(sys.argv[1] + "/v.txt").read(), flush=True)
"""


def test_a_long_lived_node_serves_stale_data_within_the_ttl(emu: Emulator, cluster, make_job) -> None:
    """blobfuse's behaviour on AmlCompute: a node that cached a file keeps serving it while the TTL
    runs, whatever happens to the blob; a job with the default TTL (its lifetime) sees the change."""
    cluster(max_nodes=1, idle_seconds_before_scaledown=600)
    _put(emu, "d/v.txt", b"version 1")

    def run_job(env: str = "") -> str:
        job = make_job(READ_ONCE, extra=f"inputs:\n  d: {{path: {WS}/d}}\n{env or 'environment_variables:'}\n"
                                        f"  {PREFETCH}: 'true'\n",
                       args="${{inputs.d}}")
        run = emu.submit(job)
        assert run.wait(timeout=120) is RunStatus.COMPLETED, run.record.error
        return run.logs().strip()

    long_ttl = "environment_variables:\n  DATASET_MOUNT_ATTRIBUTE_CACHE_TTL: 3600000"
    assert run_job(long_ttl) == "read: version 1"
    _put(emu, "d/v.txt", b"version 2")
    assert run_job(long_ttl) == "read: version 1"  # stale: the node's cache is younger than the TTL
    assert run_job() == "read: version 2"  # the next job's mount revalidates by ETag
    assert len(emu.store.nodes("c1")) == 1  # one node served all three


WATCH = """
import sys, time
path = sys.argv[1] + "/v.txt"
first = open(path).read()
print("first:", first, flush=True)
deadline = time.time() + 60
while open(path).read() == first and time.time() < deadline:
    time.sleep(0.1)
print("now:", open(path).read(), flush=True)
"""


def test_a_running_job_sees_a_changed_blob_once_the_ttl_has_passed(emu: Emulator, cluster, make_job) -> None:
    cluster(max_nodes=1)
    _put(emu, "w/v.txt", b"before")
    job = make_job(WATCH, extra=f"inputs:\n  d: {{path: {WS}/w}}\n"
                                f"environment_variables:\n  DATASET_MOUNT_ATTRIBUTE_CACHE_TTL: 1000\n  {PREFETCH}: 'true'\n",
                   args="${{inputs.d}}")
    run = emu.submit(job)
    wait_until(lambda: "first: before" in run.logs(), STARTUP, "the job read the file")
    _put(emu, "w/v.txt", b"after!")
    assert run.wait(timeout=90) is RunStatus.COMPLETED, run.record.error
    assert run.logs().splitlines()[-1] == "now: after!"
    assert "refreshed on c1-node-0 after the TTL" in (run.dir / "system_logs" / "lifecycle.txt").read_text()


# Both ranks write, then meet (an MPI barrier), then rank 1 fails: its failure stops rank 0, which
# must have written by then (a loaded machine once started rank 0 after rank 1 had already failed).
WRITE_THEN_FAIL = """
import os, sys
from mpi4py import MPI
rank = os.environ["OMPI_COMM_WORLD_RANK"]
open(os.path.join(sys.argv[1], f"rank-{rank}.txt"), "w").write(f"from rank {rank}")
os.makedirs(os.path.join(sys.argv[2], "nested"), exist_ok=True)
open(os.path.join(sys.argv[2], "nested", f"model-{rank}.bin"), "wb").write(b"weights")
MPI.COMM_WORLD.Barrier()
sys.exit(3 if rank == "1" else 0)
"""


def test_outputs_are_written_back_even_when_the_job_fails(emu: Emulator, cluster, make_job) -> None:
    cluster()
    job = make_job(WRITE_THEN_FAIL, nodes=2, extra=f"""
outputs:
  results: {{mode: rw_mount}}
  model: {{path: {WS}/models/exp1, mode: upload}}
""",
                   args="${{outputs.results}} ${{outputs.model}}")
    run = emu.submit(job)
    assert run.wait(timeout=120) is RunStatus.FAILED
    assert "rank 1 on node c1-node-1 failed with exit code 3" in run.record.error
    default = f"azureml/{run.id}/results"  # Azure ML's default output path
    assert _get(emu, f"{default}/rank-0.txt") == b"from rank 0" and _get(emu, f"{default}/rank-1.txt") == b"from rank 1"
    assert [p for p, _ in emu.datastores.ls(f"{WS}/models/exp1")] == [
        "models/exp1/nested/model-0.bin", "models/exp1/nested/model-1.bin"]


def test_missing_datastore_is_refused_at_submit_and_missing_path_fails_the_run(emu: Emulator, cluster, make_job) -> None:
    cluster(max_nodes=1)
    job = make_job(READ_ONCE, extra="inputs:\n  d: {path: azureml://datastores/nowhere/paths/x}\n")
    with pytest.raises(ConfigError, match=r"^inputs.d.path: datastore 'nowhere' not found; known: workspaceblobstore"):
        emu.submit(job)
    job = make_job(READ_ONCE, extra=f"inputs:\n  d: {{path: {WS}/absent/folder}}\n")
    run = emu.submit(job)
    assert run.wait(timeout=60) is RunStatus.FAILED
    assert run.record.error.startswith(f"inputs.d ({WS}/absent/folder): path 'absent/folder in datastore "
                                       f"workspaceblobstore' not found")
    assert not run.logs()  # the job never started


def test_credentials_never_reach_runs_logs_or_nodes(emu: Emulator, cluster, make_job) -> None:
    """An azure_blob datastore with a SAS token (served by Azurite through the same adlfs path as
    real Azure): the job reads through it, and the token is nowhere but the owner-only secret file."""
    cluster(max_nodes=1, idle_seconds_before_scaledown=120)  # the node's disk stays to be searched (not removed mid-walk)
    endpoint = emu.datastores.azurite.ensure().blob_url
    _put(emu, "secure/v.txt", b"private data")
    sas = generate_account_sas(ACCOUNT, ACCOUNT_KEY, ResourceTypes(container=True, object=True),
                               AccountSasPermissions(read=True, list=True, write=True), expiry="2099-01-01")
    container = emu.datastores.get(DEFAULT).container  # the workspace's own (azureml-blobstore-<guid>)
    emu.datastores.create(DatastoreSpec("securestore", "azure_blob", container=container, account=ACCOUNT,
                                        credential="sas", endpoint=endpoint), sas)
    emu.datastores.create(DatastoreSpec("badstore", "azure_blob", container=container, account=ACCOUNT,
                                        credential="sas", endpoint=endpoint), sas.replace("sig=", "sig=AAAA"))
    signature = sas.split("sig=")[1].split("&")[0]
    job = make_job(READ_ONCE, extra="inputs:\n  d: {path: azureml://datastores/securestore/paths/secure}\n",
                   args="${{inputs.d}}")
    run = emu.submit(job)
    assert run.wait(timeout=120) is RunStatus.COMPLETED, run.record.error
    assert run.logs().strip() == "read: private data"
    bad = emu.submit(job, overrides=["inputs.d.path=azureml://datastores/badstore/paths/secure"])
    assert bad.wait(timeout=60) is RunStatus.FAILED and "inputs.d" in bad.record.error
    leaks = [p for p in emu.home.root.rglob("*") if p.is_file() and "azurite" not in p.parts
             and p.parent.name != "secrets" and (signature.encode() in p.read_bytes() or
                                                 ACCOUNT_KEY.encode() in p.read_bytes())]
    assert leaks == []


def test_without_azurite_jobs_read_workspaceblobstore_from_a_local_folder(emu: Emulator, cluster, make_job,
                                                                            monkeypatch) -> None:
    monkeypatch.setattr("amlemu.storage.azurite.find_binary", lambda cache: None)  # as on a machine without Node.js
    cluster(max_nodes=1)
    spec = emu.datastores.get(DEFAULT)
    assert spec.kind == "local"
    (Path(spec.folder) / "d").mkdir(parents=True)
    (Path(spec.folder) / "d" / "v.txt").write_text("from a folder")
    job = make_job(READ_ONCE, extra=f"inputs:\n  d: {{path: {WS}/d}}\n",
                   args="${{inputs.d}}")
    run = emu.submit(job)
    assert run.wait(timeout=60) is RunStatus.COMPLETED, run.record.error
    assert run.logs().strip() == "read: from a folder"
