"""Hostile input that a table row cannot show: state that cannot be read and the way out,
cleanup and cleanup --all, the home rule, the job name as az ml takes it, unexpected errors, and
storage that refuses or drops every request. The table itself: test_hostile_input.py."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_hostile_input import JOB, SAS, corrupt_db, run_cli, template, world  # noqa: F401 - fixtures too

from amlemu.api import Emulator
from amlemu.cli import cli
from amlemu.specs import ClusterSpec
from amlemu.storage.datastores import DatastoreSpec


def test_cleanup_works_without_the_database_and_reset_state_recovers(tmp_path: Path, monkeypatch) -> None:
    """A corrupt database: cleanup still stops supervisors and removes nodes (found by their
    folders and Docker labels, not by the records), then says how to recover; --reset-state does."""
    monkeypatch.chdir(tmp_path)
    emu = Emulator(tmp_path / "home", backend="process")
    emu.create_compute(ClusterSpec("c1", "STANDARD_D2_V2", min_nodes=1, max_nodes=1))
    home = emu.home.root
    assert (home / "nodes" / "c1" / "c1-node-0").is_dir()
    emu.store.close()
    # Stands in for a run's supervisor: found by `amlemu.runs.supervisor <home>` in its argv alone.
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "amlemu.runs.supervisor",
                                str(home), "some_run"], start_new_session=True)
    try:
        corrupt_db(home, tmp_path)
        broken = run_cli(home, "cleanup", "--yes")
        assert broken.exit_code == 1 and "Traceback" not in broken.output
        assert broken.stderr.count("\n") == 1 and "amlemu cleanup --reset-state" in broken.stderr
        assert "process node c1-node-0" in broken.stdout and f"process group {sleeper.pid}" in broken.stdout
        assert sleeper.wait(timeout=10) == -9
        assert not (home / "nodes" / "c1" / "c1-node-0").exists()
        assert run_cli(home, "compute", "list").exit_code == 1  # still broken: nothing was moved yet
        fixed = run_cli(home, "cleanup", "--reset-state", "--yes")
        assert fixed.exit_code == 0, fixed.output
        assert "state database (moved to" in fixed.stdout
        [aside] = home.glob("amlemu.db.broken-*")
        assert aside.read_bytes().startswith(b"this is not a database")
        assert run_cli(home, "compute", "list", "-o", "json").stdout.strip() == "[]"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_cleanup_keeps_the_workspace_and_all_forgets_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    outside = tmp_path / "my-own-data"
    monkeypatch.setenv("MY_SAS", SAS)
    for argv in (["workspace", "set", "--name", "kept-ws"],
                 ["datastore", "create", "--name", "mine", "--type", "local", "--path", str(outside)],
                 ["datastore", "create", "--name", "held", "--type", "local", "--path", str(home / "datastores" / "held")],
                 ["datastore", "create", "--name", "blob", "--type", "azure_blob", "--account-name", "acct",
                  "--container-name", "data", "--sas-token-env", "MY_SAS"]):
        assert run_cli(home, *argv).exit_code == 0
    (outside / "a.txt").write_text("the user's own")
    (home / "datastores" / "held" / "b.txt").write_text("held by the emulator")
    assert "persist" in run_cli(home, "cleanup", "--help").stdout
    assert run_cli(home, "cleanup", "--yes").exit_code == 0
    names = [d["name"] for d in json.loads(run_cli(home, "datastore", "list", "-o", "json").stdout)]
    assert {"mine", "held", "blob"} <= set(names)
    assert (home / "secrets" / "blob").read_text() == SAS
    assert "kept-ws" in run_cli(home, "workspace", "show").stdout
    gone = run_cli(home, "cleanup", "--all", "--yes")
    assert gone.exit_code == 0, gone.output
    assert not (home / "secrets").exists() and not (home / "datastores" / "held").exists()
    assert (outside / "a.txt").read_text() == "the user's own"  # never the user's own folder
    assert "amlemu-ws" in run_cli(home, "workspace", "show").stdout
    assert run_cli(home, "datastore", "show", "blob").exit_code == 3  # az: ResourceNotFound


def test_datastore_list_shows_a_table_and_json(world) -> None:
    home, _ = world
    table = run_cli(home, "datastore", "list")
    assert table.exit_code == 0 and "localds" in table.stdout and "deadblob" in table.stdout, table.output
    assert {"localds", "deadblob"} <= {d["name"] for d in json.loads(
        run_cli(home, "datastore", "list", "-o", "json").stdout)}


def test_the_yaml_name_is_the_job_name_in_a_dry_run(world) -> None:
    home, files = world
    (files / "job.yml").write_text(JOB + "name: my_job-1\n")
    result = run_cli(home, "job", "create", "-f", str(files / "job.yml"), "--dry-run")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["run_id"] == "my_job-1"


def test_the_yaml_name_is_the_run_id_and_a_taken_name_is_refused(tmp_path: Path) -> None:
    emu = Emulator(tmp_path / "home", backend="process")
    try:
        emu.create_compute(ClusterSpec("c1", "STANDARD_D2_V2", max_nodes=1, idle_seconds_before_scaledown=0))
        (tmp_path / "src").mkdir()
        (tmp_path / "src" / "hi.py").write_text("print('hi', flush=True)\n")
        (tmp_path / "job.yml").write_text("name: named_run_1\ncode: src\ncommand: python hi.py\ncompute: c1\n")
        run = emu.submit(tmp_path / "job.yml")
        assert run.id == "named_run_1" and (emu.home.root / "runs" / "named_run_1").is_dir()
        assert run.wait(timeout=120).value == "Completed", run.record.error
        with pytest.raises(Exception, match="name: a job named 'named_run_1' already exists"):
            emu.submit(tmp_path / "job.yml")
        assert [r.id for r in emu.runs()] == ["named_run_1"]
    finally:
        emu.cleanup()


def test_the_default_home_and_amlemu_home_are_created_on_first_use(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.delenv("AMLEMU_HOME", raising=False)
    shown = CliRunner().invoke(cli, ["workspace", "show", "-o", "json"])
    assert shown.exit_code == 0 and (tmp_path / "user" / ".amlemu" / "amlemu.db").exists(), shown.output
    monkeypatch.setenv("AMLEMU_HOME", str(tmp_path / "from-env"))
    assert CliRunner().invoke(cli, ["compute", "list"]).exit_code == 0
    assert (tmp_path / "from-env" / "amlemu.db").exists()


def test_an_unexpected_error_is_one_line_unless_debugging(world, monkeypatch) -> None:
    home, _ = world

    def broken(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("boom\nwith a second line")

    monkeypatch.setattr(Emulator, "computes", broken)
    result = run_cli(home, "compute", "list")
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == ("amlemu: error: unexpected RuntimeError: boom; this is a bug in amlemu: run with "
                             "AMLEMU_DEBUG=1 for the traceback and report it\n")
    monkeypatch.setenv("AMLEMU_DEBUG", "1")
    assert isinstance(run_cli(home, "compute", "list").exception, RuntimeError)


@pytest.mark.filterwarnings("ignore::UserWarning")  # adlfs on the refused credential (the CLI silences it)
def test_a_refused_blob_credential_is_one_redacted_line(tmp_path: Path, monkeypatch) -> None:
    """A SAS token the storage refuses (Azurite stands in for Azure) or cannot even parse."""
    from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas  # noqa: PLC0415

    from amlemu.storage.azurite import ACCOUNT, ACCOUNT_KEY  # noqa: PLC0415

    monkeypatch.chdir(tmp_path)
    emu = Emulator(tmp_path / "home", backend="process")
    try:
        endpoint = emu.datastores.azurite.ensure().blob_url
        sas = generate_account_sas(ACCOUNT, ACCOUNT_KEY, ResourceTypes(container=True, object=True),
                                   AccountSasPermissions(read=True, list=True), expiry="2099-01-01")
        bad = sas.replace("sig=", "sig=AAAA")
        for name, secret in (("badsas", bad), ("garbled", "not;a=sas")):
            emu.datastores.create(DatastoreSpec(name, "azure_blob", container="data", account=ACCOUNT,
                                                credential="sas", endpoint=endpoint), secret)
            started = time.monotonic()
            result = run_cli(emu.home.root, "data", "ls", f"azureml://datastores/{name}/paths/x")
            assert result.exit_code == 1 and time.monotonic() - started < 30  # no retry storm (minutes)
            assert result.stderr.startswith(f"amlemu: error: datastore {name}: ") and result.stderr.count("\n") == 1
            assert "Traceback" not in result.output and bad.split("sig=")[1].split("&")[0] not in result.output
    finally:
        emu.cleanup()


@pytest.mark.filterwarnings("ignore::UserWarning")  # adlfs, as above
def test_a_blob_endpoint_that_resets_every_connection_fails_within_seconds(world) -> None:
    """It answers the TCP connect (so the probe passes) and drops every request: the storage SDK's
    own retries took 87 s per call, 247 s for one command; bounded, it is seconds."""
    import socket  # noqa: PLC0415
    import threading  # noqa: PLC0415

    home, _ = world
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)

    def drop() -> None:
        while True:
            try:
                server.accept()[0].close()
            except OSError:
                return
    threading.Thread(target=drop, daemon=True).start()
    try:
        emu = Emulator(home)
        emu.datastores.create(DatastoreSpec("resetting", "azure_blob", container="data", account="acct",
                                            credential="sas", endpoint=f"http://127.0.0.1:{server.getsockname()[1]}"), SAS)
        started = time.monotonic()
        result = run_cli(home, "data", "ls", "azureml://datastores/resetting/paths/x")
        assert result.exit_code == 1 and time.monotonic() - started < 60, time.monotonic() - started  # was 247 s
        assert result.stderr.startswith("amlemu: error: datastore resetting: ") and result.stderr.count("\n") == 1
        assert "Traceback" not in result.output and "NOTREAL" not in result.output
    finally:
        server.close()
