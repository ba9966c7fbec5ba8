"""Datastores through fsspec: URIs, the registry, transfers on a real Azurite and a local folder,
secrets kept out of everything printed, and the fallback when Azurite is not installed."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from amlemu.cli import cli
from amlemu.cluster.teardown import plan_stop_azurite
from amlemu.cluster.store import Store
from amlemu.errors import ConfigError, NotFoundError
from amlemu.home import default_cache
from amlemu.storage.azurite import SHARED_ENV
from amlemu.storage.datastores import DEFAULT, Datastores, DatastoreSpec, parse_uri, redact


@pytest.mark.parametrize(("uri", "expected"), [
    ("azureml://datastores/workspaceblobstore/paths/mnist", ("workspaceblobstore", "mnist")),
    ("azureml://datastores/ds/paths/a//b/./c/", ("ds", "a/b/c")),
    ("azureml://datastores/ds/paths/", ("ds", "")),
])
def test_uris(uri: str, expected: tuple[str, str]) -> None:
    assert parse_uri(uri) == expected


@pytest.mark.parametrize(("uri", "message"), [
    ("azureml://datastores/ds/paths/a/../../etc", "path: 'a/../../etc' contains '..'"),
    ("wasbs://container@account/x", "path: 'wasbs://container@account/x' is not a datastore URI"),
    ("azureml://datastores/ds/mnist", "is not a datastore URI; write azureml://datastores/<datastore>/paths/<path>"),
])
def test_bad_uris_are_refused(uri: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("*", r"\*")):
        parse_uri(uri)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"kind": "s3"}, "type: 's3' is not a datastore type"),
    ({"kind": "local"}, "path: a local datastore needs a folder"),
    ({"kind": "azure_blob", "container": "Bad_Name", "account": "a"}, "container_name: 'Bad_Name' is not a valid"),
    ({"kind": "azure_blob", "container": "data"}, "account_name: missing"),
])
def test_bad_datastore_specs_name_the_field(kwargs, message) -> None:
    with pytest.raises(ConfigError, match="^" + message):
        DatastoreSpec("d1", **kwargs)


def test_secrets_are_redacted_from_text() -> None:
    text = ("https://acct.blob.core.windows.net/c/x?sv=2024&sig=SeCrEt%3D&se=2030 failed; "
            "DefaultEndpointsProtocol=https;AccountKey=abc123==;EndpointSuffix=core")
    cleaned = redact(text, ["my-raw-key"])
    assert "SeCrEt" not in cleaned and "abc123" not in cleaned and "sig=***" in cleaned
    assert redact("the key my-raw-key leaked", ["my-raw-key"]) == "the key *** leaked"


@pytest.fixture
def datastores(tmp_path: Path):
    ds = Datastores(Store(tmp_path / "amlemu.db"), tmp_path / "home", default_cache())
    yield ds
    ds.azurite.stop()


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    folder = tmp_path / "sample"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("alpha")
    (folder / "sub" / "b.bin").write_bytes(bytes(range(256)) * 100)
    return folder


def test_the_default_datastore_is_azurite_and_round_trips(datastores: Datastores, sample: Path, tmp_path: Path) -> None:
    [spec] = datastores.list()
    assert (spec.name, spec.kind) == (DEFAULT, "azurite")
    uri = "azureml://datastores/workspaceblobstore/paths/runs/sample"
    assert datastores.upload(sample, uri) == 5 + 25600
    assert datastores.ls(uri) == [("runs/sample/a.txt", 5), ("runs/sample/sub/b.bin", 25600)]
    datastores.download(uri, tmp_path / "back")
    assert (tmp_path / "back" / "a.txt").read_text() == "alpha"
    assert (tmp_path / "back" / "sub" / "b.bin").read_bytes() == (sample / "sub" / "b.bin").read_bytes()
    assert not (datastores.azurite.dir / "azurite.log").exists()  # the debug log (SAS tokens) is off


def test_homes_sharing_one_azurite_each_have_their_workspaces_container(tmp_path: Path, sample: Path) -> None:
    """AMLEMU_AZURITE_DIR (set for this session by conftest): one server for every home, never
    stopped by a home's cleanup, and each home's workspaceblobstore in a container of its own."""
    a, b = (Datastores(Store(tmp_path / f"{n}.db"), tmp_path / n, default_cache()) for n in ("a", "b"))
    assert a.azurite.shared and a.azurite.dir == b.azurite.dir == Path(os.environ[SHARED_ENV]).absolute()
    containers = [d.get(DEFAULT).container for d in (a, b)]
    assert containers[0] != containers[1] and all(re.fullmatch(r"azureml-blobstore-[0-9a-f-]{36}", c) for c in containers)
    uri = "azureml://datastores/workspaceblobstore/paths/mine"
    a.upload(sample, uri)
    assert b.ls(uri) == [] and len(a.ls(uri)) == 2
    assert a.azurite.ensure().port == b.azurite.ensure().port
    assert plan_stop_azurite(a.azurite) == []  # the home's cleanup leaves the shared server running
    assert Datastores(Store(tmp_path / "a.db"), tmp_path / "a", default_cache()).get(DEFAULT).container == containers[0]


def test_upload_skips_what_is_already_there(datastores: Datastores, sample: Path) -> None:
    uri = "azureml://datastores/workspaceblobstore/paths/once"
    datastores.upload(sample, uri)
    fs, root = datastores.filesystem(DEFAULT)
    etag = fs.info(f"{root}/once/a.txt")["etag"]
    datastores.upload(sample, uri)
    assert fs.info(f"{root}/once/a.txt")["etag"] == etag  # not written again


def test_a_local_folder_datastore(datastores: Datastores, sample: Path, tmp_path: Path) -> None:
    datastores.create(DatastoreSpec("folder", "local", folder=str(tmp_path / "store")))
    datastores.upload(sample / "a.txt", "azureml://datastores/folder/paths/x")
    assert (tmp_path / "store" / "x" / "a.txt").read_text() == "alpha"
    assert datastores.ls("azureml://datastores/folder/paths/x") == [("x/a.txt", 5)]


def test_missing_datastore_and_path_are_named(datastores: Datastores, tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="datastore 'nope' not found; known: workspaceblobstore"):
        datastores.ls("azureml://datastores/nope/paths/x")
    with pytest.raises(NotFoundError, match="path 'azureml://datastores/workspaceblobstore/paths/absent' not found"):
        datastores.download("azureml://datastores/workspaceblobstore/paths/absent", tmp_path / "x")


def test_without_azurite_the_default_is_a_local_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no azurite-blob on PATH either
    ds = Datastores(Store(tmp_path / "db"), tmp_path / "home", tmp_path / "empty-cache")
    spec = ds.get(DEFAULT)
    assert spec.kind == "local" and spec.folder == str(tmp_path / "home" / "datastores" / DEFAULT)


def test_secrets_stay_out_of_the_cli_and_the_database(tmp_path: Path, monkeypatch) -> None:
    secret = "sv=2030-01-01&sig=TOPSECRETSIGNATURE"
    monkeypatch.setenv("MY_SAS", secret)
    runner = CliRunner()
    (tmp_path / "home").mkdir()
    home = ["--home", str(tmp_path / "home")]
    created = runner.invoke(cli, [*home, "datastore", "create", "--name", "realblob", "--type", "azure_blob",
                                  "--account-name", "acct", "--container-name", "data", "--sas-token-env", "MY_SAS"])
    assert created.exit_code == 0, created.output
    shown = runner.invoke(cli, [*home, "datastore", "show", "realblob"]).output
    listed = runner.invoke(cli, [*home, "datastore", "list", "-o", "json"]).output
    assert json.loads(shown)["credential"] == "sas"
    for text in (created.output, shown, listed, (tmp_path / "home" / "amlemu.db").read_bytes().decode("latin1")):
        assert "TOPSECRET" not in text
    secret_file = tmp_path / "home" / "secrets" / "realblob"
    assert secret_file.read_text() == secret and secret_file.stat().st_mode & 0o077 == 0
    missing = runner.invoke(cli, [*home, "datastore", "create", "--name", "other", "--type", "azure_blob",
                                  "--account-name", "acct", "--container-name", "data", "--account-key-env", "UNSET_VAR"])
    assert missing.exit_code == 1 and "amlemu: error: $UNSET_VAR: is empty or unset" in missing.output


def test_concurrent_starts_share_one_azurite(tmp_path: Path, own_azurite) -> None:
    """A supervisor prepares its nodes in parallel threads: they must not start a server each."""
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    ds = Datastores(Store(tmp_path / "db"), tmp_path / "home", default_cache())
    try:
        with ThreadPoolExecutor(4) as pool:
            ports = {e.port for e in pool.map(lambda _: ds.azurite.ensure(), range(4))}
        assert len(ports) == 1
        servers = [p for p in psutil.process_iter(["cmdline"]) if str(ds.azurite.dir) in " ".join(p.info["cmdline"] or [])]
        assert len(servers) == 1, servers
    finally:
        ds.azurite.stop()
