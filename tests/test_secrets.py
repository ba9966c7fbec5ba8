"""No secret leaks: a datastore's SAS token, planted in the environment of the shell that submits, is
after a job that reads through it found nowhere but the owner-only file meant to hold it: not in
any file of the home (Azurite's included), not in any CLI output, not in the job's own view of its
environment or of any process it can see (/proc/*/environ, ps eww), on each backend."""
from __future__ import annotations

import datetime as dt
import os
import secrets
import stat
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest
from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas

from amlemu.api import Emulator
from amlemu.storage.azurite import ACCOUNT, ACCOUNT_KEY, DEBUG_ENV, Azurite
from amlemu.storage.datastores import DEFAULT

pytestmark = pytest.mark.slow
AMLEMU = [sys.executable, "-c", "from amlemu.cli import main; main()"]
SECRET_VAR = "AMLEMU_TEST_DATASTORE_SAS"

SNOOP = r"""
import os, subprocess, sys
print("input:", open(os.path.join(sys.argv[1], "v.txt")).read(), flush=True)
print("environ:", dict(os.environ), flush=True)
for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ")[:160]
        env = open(f"/proc/{pid}/environ", "rb").read().replace(b"\0", b" ")
    except OSError as exc:
        continue
    print("proc", pid, cmd, env, flush=True)
for argv in (["sh", "-c", "cat /proc/*/environ | tr '\\0' ' '"], ["ps", "eww"], ["ps", "axeww"]):
    try:
        done = subprocess.run(argv, capture_output=True, timeout=30)
        print("ran", argv, done.stdout, done.stderr[-200:], flush=True)
    except Exception as exc:
        print("ran", argv, "failed:", exc, flush=True)
print("snooped", flush=True)
"""


def _sas() -> str:
    """A real SAS for Azurite's account, unique to this test (its expiry is random, so is its signature)."""
    expiry = dt.datetime(2099, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=secrets.randbelow(10**7))
    return generate_account_sas(ACCOUNT, ACCOUNT_KEY, ResourceTypes(service=True, container=True, object=True),
                                AccountSasPermissions(read=True, list=True), expiry=expiry)


def _needles(sas: str) -> list[bytes]:
    """The token, and its signature as sent (URL-encoded) and decoded: any of them is a leak."""
    sig = sas.split("sig=")[1].split("&")[0]
    return sorted({sas.encode(), sig.encode(), unquote(sig).encode()}, key=len)


def _found(data: bytes, needles: list[bytes]) -> str | None:
    """The start of each line holding a needle (for the job's output: whose environment it was),
    or None: a readable failure that does not print the secret."""
    lines = [line for line in data.splitlines() if any(n in line for n in needles)]
    if not lines:
        return None
    heads = [line[:150].decode(errors="replace") for line in lines]
    for needle in needles:
        heads = [h.replace(needle.decode(errors="replace"), "<SECRET>") for h in heads]
    return "\n    " + "\n    ".join(heads)


def _files_holding(root: Path, needles: list[bytes]) -> dict[str, str]:
    """Every regular file under `root`, recursively, read as bytes (no link followed, no fifo opened)."""
    hits = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder, name)
            if not stat.S_ISREG(path.lstat().st_mode):
                continue
            where = _found(path.read_bytes(), needles)
            if where is not None:
                hits[str(path)] = where
    return hits


def _put(emu: Emulator, path: str, data: bytes) -> None:
    fs, root = emu.datastores.filesystem(DEFAULT)
    fs.pipe(f"{root}/{path}", data)


def test_a_planted_sas_token_is_only_in_the_owner_only_secret_file(emu: Emulator, cluster, make_job,
                                                                     tmp_path: Path) -> None:
    cluster(max_nodes=1)
    endpoint = emu.datastores.azurite.ensure().blob_url
    _put(emu, "secure/v.txt", b"private data")
    sas = _sas()
    needles = _needles(sas)
    shell = {**os.environ, SECRET_VAR: sas}  # a CI step with the secret exported
    outputs: dict[str, str] = {}

    def amlemu(*args: str, ok: bool = True) -> str:
        done = subprocess.run([*AMLEMU, "--home", str(emu.home.root), *args], env=shell, capture_output=True,
                              text=True, timeout=300)
        outputs[" ".join(args)] = done.stdout + done.stderr
        assert not ok or done.returncode == 0, f"amlemu {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    amlemu("datastore", "create", "--name", "securestore", "--type", "azure_blob", "--account-name", ACCOUNT,
           "--container-name", emu.datastores.get(DEFAULT).container, "--endpoint", endpoint, "--sas-token-env", SECRET_VAR)
    job = make_job(SNOOP, extra="inputs:\n  d: {path: azureml://datastores/securestore/paths/secure}\n",
                   args="${{inputs.d}}")
    amlemu("job", "validate", "-f", str(job), ok=False)  # no environment: an error, but it must not leak
    amlemu("job", "create", "-f", str(job), "--dry-run")
    streamed = amlemu("job", "create", "-f", str(job), "--stream")  # the submitter stays alive while it runs
    assert "input: private data" in streamed and "snooped" in streamed, streamed
    [run] = emu.runs()
    amlemu("job", "show", run.id)
    amlemu("job", "show", run.id, "-o", "json")
    amlemu("job", "list", "-o", "json")
    amlemu("job", "list")
    amlemu("job", "stream", run.id)
    amlemu("job", "download", run.id, "--download-path", str(tmp_path / "download"))
    amlemu("datastore", "show", "securestore")
    amlemu("datastore", "list", "-o", "json")
    amlemu("data", "ls", "azureml://datastores/securestore/paths/secure")

    secret_file = emu.home.root / "secrets" / "securestore"
    home = _files_holding(emu.home.root, needles)
    assert home.pop(str(secret_file), None) is not None, "the secret file does not hold the token"
    leaks = {**home, **_files_holding(tmp_path / "download", needles)}
    leaks |= {f"output of `amlemu {cmd}`": where for cmd, out in outputs.items()
              if (where := _found(out.encode(), needles)) is not None}
    assert leaks == {}, "the SAS token leaked:\n" + "\n".join(f"{k}:{v}" for k, v in leaks.items())
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(secret_file.parent.stat().st_mode) == 0o700


def test_azurite_keeps_no_request_log_unless_asked_and_then_owner_only(tmp_path: Path, monkeypatch, own_azurite) -> None:
    """Azurite's debug log holds every request URL, SAS tokens included: off by default; with
    AMLEMU_AZURITE_DEBUG=1 on, readable by its owner alone."""
    from amlemu.home import default_cache  # noqa: PLC0415

    for debug, home in (("", tmp_path / "quiet"), ("1", tmp_path / "debug")):
        monkeypatch.setenv(DEBUG_ENV, debug)
        azurite = Azurite(home, default_cache())
        try:
            endpoint = azurite.ensure()
            from azure.storage.blob import BlobServiceClient  # noqa: PLC0415

            sas = _sas()
            client = BlobServiceClient(endpoint.blob_url, credential=sas)
            list(client.list_containers())  # a request that carries the token
        finally:
            azurite.stop()
        log = azurite.dir / "azurite.log"
        assert stat.S_IMODE(azurite.dir.stat().st_mode) == 0o700
        assert stat.S_IMODE((azurite.dir / "stdout.log").stat().st_mode) == 0o600
        if debug:
            assert stat.S_IMODE(log.stat().st_mode) == 0o600
            assert list(_files_holding(home, _needles(sas))) == [str(log)]  # what the docs warn of
        else:
            assert not log.exists()
            assert _files_holding(home, _needles(sas)) == {}
