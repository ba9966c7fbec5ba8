"""Inputs by URL (`path: https://...`, `wasbs://`, `abfss://`): read by this machine into the node's
cache as a datastore input is, ro_mount or download; refused at submit, in one line naming the input,
its URL and how to stage it instead, when offline or unreachable; never from a link-local (cloud
metadata) address; a literal input holding a URL stays a literal, with a notice. The only server is
a loopback http.server in a thread (its folder listing is an HTML index, which uri_folder reads)."""
from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from amlemu.api import Emulator
from amlemu.errors import AmlEmuError, ConfigError
from amlemu.jobs.jobyaml import job_from_dict
from amlemu.runs.contract import bindings
from amlemu.runs.mounts import RunData
from amlemu.specs import DataInput, DataMode
from amlemu.storage import urlinputs
from amlemu.storage.datastores import Datastores
from amlemu.storage.httptree import HttpTree
from amlemu.storage.nodecache import CachePolicy, NodeCache

STAGE = "azureml://datastores/workspaceblobstore/paths/url-inputs"


class Web:
    """A loopback web server over a folder; `hits` counts the requests it answered."""

    def __init__(self, root: Path) -> None:
        self.hits = 0
        self.redirect: str | None = None
        web = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def send_head(self):  # type: ignore[no-untyped-def]
                web.hits += 1
                if web.redirect and self.path.startswith("/moved"):
                    self.send_response(302)
                    self.send_header("Location", web.redirect)
                    self.end_headers()
                    return None
                return super().send_head()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def web(tmp_path: Path) -> Iterator[Web]:
    root = tmp_path / "site"
    (root / "iris" / "more").mkdir(parents=True)
    (root / "iris.csv").write_text("sepal,petal\n5.1,1.4\n")
    (root / "iris" / "a.csv").write_text("a\n")
    (root / "iris" / "more" / "b.csv").write_text("b\n")
    server = Web(root)
    thread = threading.Thread(target=server.server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()
    thread.join()


def free_port() -> int:
    """A loopback port with nothing listening (bound, then closed)."""
    import socket  # noqa: PLC0415

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _job(inputs: dict, tmp_path: Path, **extra: object):  # type: ignore[no-untyped-def]
    command = "echo " + " ".join(f"${{{{inputs.{n}}}}}" for n in inputs)
    return job_from_dict({"command": command, "compute": "azureml:c1", "inputs": inputs, **extra}, base_dir=tmp_path)


# --- pure: the URL's form ------------------------------------------------------------------------
def test_urls_parse_to_their_host_container_and_cache_location() -> None:
    blob = urlinputs.parse_url("wasbs://data@acct.blob.core.windows.net/iris/iris.csv", "inputs.d.path")
    assert (blob.account, blob.container, blob.path, blob.port) == ("acct", "data", "iris/iris.csv", 443)
    lake = urlinputs.parse_url("abfss://fs@lake.dfs.core.windows.net/raw/", "inputs.d.path")
    assert (lake.account, lake.container, lake.blob_host) == ("lake", "fs", "lake.blob.core.windows.net")
    web = urlinputs.parse_url("http://127.0.0.1:8080/a/iris.csv", "inputs.d.path")
    assert (web.host, web.port, web.path) == ("127.0.0.1", 8080, "a/iris.csv")
    key, path = urlinputs.location("https://h/a/iris.csv", "uri_file")
    assert urlinputs.is_url_source(key) and path == "iris.csv"
    assert urlinputs.location("https://h/a/", "uri_folder") == (urlinputs.location("https://h/a/", "uri_file")[0], "")
    assert urlinputs.location("https://h/a", "uri_file")[0] != urlinputs.location("https://h/b", "uri_file")[0]
    assert [urlinputs.is_url(u) for u in ("HTTPS://h/x", "wasb://c@a/x", "abfs://c@a/x", "ftp://h/x", "./https")] == \
        [True, True, True, False, False]
    for address in ("169.254.169.254", "fd00:ec2::254", "fe80::1", "::ffff:169.254.169.254"):
        assert urlinputs.blocked(address), address
    assert not any(urlinputs.blocked(a) for a in ("127.0.0.1", "10.0.0.1", "::1", "example.com"))


def test_blob_and_lake_urls_open_anonymously_on_their_account_blob_endpoint() -> None:
    """Unit only (no storage account here): the filesystem and root a wasbs/abfss input is read from."""
    fs, root = urlinputs.open_url("wasbs://data@acct.blob.core.windows.net/iris/iris.csv", "uri_file")
    assert (root, fs.account_name, fs.account_url, fs.anon) == ("data/iris", "acct", "https://acct.blob.core.windows.net",
                                                                True)
    fs, root = urlinputs.open_url("abfss://lake@acct2.dfs.core.windows.net/raw/", "uri_folder")
    assert (root, fs.account_name, fs.account_url) == ("lake/raw", "acct2", "https://acct2.blob.core.windows.net")


@pytest.mark.parametrize(("url", "said"), [
    ("http://169.254.169.254/latest/meta-data/", "link-local address (a cloud metadata service)"),
    ("http://[fd00:ec2::254]/latest/", "link-local address"),
    ("https://h/iris.csv?sv=2024&sig=x", "a query or a fragment (a SAS token) is not read here"),
    ("https://user:pw@h/iris.csv", "a user name in the URL is not read here"),
    ("wasbs://acct.blob.core.windows.net/iris.csv", "names no container"),
    ("https:///iris.csv", "is not a URL with a host"),
])
def test_a_url_input_of_a_form_not_read_is_refused_at_load_naming_its_field(url: str, said: str,
                                                                          tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        _job({"d": {"type": "uri_file", "path": url}}, tmp_path)
    assert str(refused.value).startswith("inputs.d.path: ") and said in str(refused.value)
    assert "\n" not in str(refused.value)


def test_url_inputs_load_as_data_bound_into_the_cache_and_a_url_literal_stays_a_literal(tmp_path: Path) -> None:
    job = _job({"f": {"type": "uri_file", "path": "https://h/d/iris.csv"},
                "m": {"type": "mlflow_model", "path": "wasbs://models@acct.blob.core.windows.net/m1/", "mode": "download"},
                "raw": {"type": "uri_file", "path": "https://h/x.csv", "mode": "direct"},
                "lit": "https://h/iris.csv"}, tmp_path)
    assert job.inputs["f"] == DataInput("uri_file", "https://h/d/iris.csv", DataMode.RO_MOUNT)
    assert job.inputs["m"].type == "uri_folder" and job.inputs["lit"] == "https://h/iris.csv"
    found = {b.name: b for b in bindings(job, "r1")}
    assert urlinputs.is_url_source(found["f"].datastore) and found["f"].node_path.endswith("/INPUT_f/iris.csv")
    assert found["raw"].node_path == "https://h/x.csv" and "lit" not in found  # direct: the URL itself
    notices = "\n".join(job.notices)
    assert "inputs.f: https://h/d/iris.csv is read by this machine when the run starts (ro_mount)" in notices
    assert "inputs.lit: the job reads https://h/iris.csv itself, so its nodes need network" in notices
    assert "inputs.raw: the job reads https://h/x.csv itself" in notices
    with pytest.raises(ConfigError, match=r"^inputs.f.mode: rw_mount is not allowed here"):
        _job({"f": {"type": "uri_file", "path": "https://h/d/iris.csv", "mode": "rw_mount"}}, tmp_path)


# --- at submit: reachable, unreachable, offline --------------------------------------------------
def test_reachable_urls_pass_the_submit_check_and_unreachable_ones_are_one_line(web: Web, tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    good = _job({"f": {"type": "uri_file", "path": f"{web.url}/iris.csv"},
                 "d": {"type": "uri_folder", "path": f"{web.url}/iris", "mode": "download"}}, tmp_path)
    urlinputs.check_inputs(good.inputs, probe=True)
    hits = web.hits
    urlinputs.check_inputs(good.inputs, probe=False)  # a dry run reads nothing from the network
    assert web.hits == hits
    dead = f"http://127.0.0.1:{free_port()}/iris.csv"
    for url, why in ((dead, "Connection refused"), (f"{web.url}/absent.csv", "nothing there"),
                     ("http://no-such-host.invalid/iris.csv", "does not resolve")):
        with pytest.raises(ConfigError) as refused:
            urlinputs.check_inputs(_job({"iris": {"type": "uri_file", "path": url}}, tmp_path).inputs, probe=True)
        line = str(refused.value)
        assert line.startswith(f"inputs.iris.path: {url} cannot be read here (") and why in line, line
        name = url.rsplit("/", 1)[1]
        assert f"`amlemu data upload {name} {STAGE}/iris/` and set inputs.iris.path to {STAGE}/iris/{name}" in line
        assert "\n" not in line
    monkeypatch.setenv("AMLEMU_OFFLINE", "1")
    hits = web.hits
    for probe in (False, True):  # offline: refused by the dry run and the submit, without a request
        with pytest.raises(ConfigError, match=r"^inputs.d.path: .* cannot be read here \(AMLEMU_OFFLINE is set: "
                                              r"nothing is fetched\); stage it: download the folder, `amlemu data "
                                              rf"upload <folder> {STAGE}/d/` and set inputs.d.path to {STAGE}/d/$"):
            urlinputs.check_inputs({"d": good.inputs["d"]}, probe=probe)
    assert web.hits == hits


def test_a_fetch_never_follows_a_redirect_to_a_metadata_address(web: Web) -> None:
    web.redirect = "http://169.254.169.254/latest/meta-data/iam/"
    with pytest.raises(Exception) as refused:  # noqa: PT011 - fsspec wraps it; reason() finds it
        HttpTree(False).info(f"{web.url}/moved/iris.csv")
    assert "169.254.169.254 (a redirect's target) is a link-local address" in urlinputs.reason(refused.value)


def test_a_url_that_goes_away_after_the_submit_fails_the_run_in_one_line(web: Web, tmp_path: Path) -> None:
    """What the supervisor does when it prepares a node: the same line as the submit's refusal."""
    dead = f"http://127.0.0.1:{free_port()}/iris.csv"
    job = _job({"iris": {"type": "uri_file", "path": dead}}, tmp_path)
    data = RunData(Datastores(None, tmp_path, tmp_path / "cache"), job, "r1", CachePolicy(), lambda _: None)
    with pytest.raises(AmlEmuError) as failed:
        data.prepare_node("c1-node-0", tmp_path / "node", NodeCache(tmp_path / "nodecache"))
    assert str(failed.value).startswith(f"inputs.iris.path: {dead} cannot be read here (")
    assert f"set inputs.iris.path to {STAGE}/iris/iris.csv" in str(failed.value) and "\n" not in str(failed.value)


def test_job_validate_names_an_unreachable_url_input(home: Path, tmp_path: Path) -> None:
    from amlemu.validate import check_job  # noqa: PLC0415

    dead = f"http://127.0.0.1:{free_port()}/iris.csv"
    job = _job({"iris": {"type": "uri_file", "path": dead}}, tmp_path, compute=None)  # serverless
    findings = [f for f in check_job(job, Emulator(home, backend="process")) if f.field == "inputs.iris.path"]
    assert len(findings) == 1 and findings[0].problem.startswith(f"{dead} cannot be read here")
    assert "amlemu data upload" in findings[0].fix


def test_the_cli_refuses_an_offline_url_input_in_one_line_and_creates_nothing(home: Path, tmp_path: Path) -> None:
    (tmp_path / "job.yml").write_text("command: cat ${{inputs.iris}}\n"  # serverless: no compute to make
                                      "inputs:\n  iris: {type: uri_file, path: 'https://example.com/iris.csv'}\n")
    exe = str(Path(sys.executable).with_name("amlemu"))
    done = subprocess.run([exe, "--home", str(home), "job", "create", "-f", str(tmp_path / "job.yml")],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "AMLEMU_OFFLINE": "1"})
    assert done.returncode != 0 and "Traceback" not in done.stderr + done.stdout
    said = [line for line in (done.stderr + done.stdout).splitlines() if "inputs.iris.path" in line]
    assert len(said) == 1 and "AMLEMU_OFFLINE is set" in said[0] and "amlemu data upload" in said[0], done.stderr
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())


# --- end to end: a job reads a file and a folder served over http ---------------------------------
READ = """
import os, sys
print("file:", open(sys.argv[1]).read().replace(chr(10), "|"), flush=True)
print("folder:", sorted(os.path.relpath(os.path.join(d, f), sys.argv[2]) for d, _, fs in os.walk(sys.argv[2]) for f in fs))
print("b:", open(os.path.join(sys.argv[2], "more", "b.csv")).read().strip())
"""


@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_a_job_reads_a_url_file_mounted_and_a_url_folder_downloaded(emu: Emulator, cluster, make_job, web: Web) -> None:
    """Through `amlemu job create --stream`: the process node has no network of its own (its own
    namespace), so what it reads came through this machine's fetch into its cache."""
    cluster(max_nodes=1)
    job_file = make_job(READ, distribution="none", args="${{inputs.iris}} ${{inputs.folder}}", extra=f"""
inputs:
  iris: {{type: uri_file, path: "{web.url}/iris.csv"}}
  folder: {{type: uri_folder, path: "{web.url}/iris/", mode: download}}
  raw_url: "{web.url}/iris.csv"
""")
    exe = str(Path(sys.executable).with_name("amlemu"))
    done = subprocess.run([exe, "--home", str(emu.home.root), "job", "create", "-f", str(job_file), "--stream"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "file: sepal,petal|5.1,1.4|" in done.stdout and "folder: ['a.csv', 'more/b.csv']" in done.stdout
    assert "b: b" in done.stdout and "Traceback" not in done.stderr
    assert f"notice: inputs.iris: {web.url}/iris.csv is read by this machine when the run starts" in done.stderr
    assert f"notice: inputs.raw_url: the job reads {web.url}/iris.csv itself, so its nodes need network" in done.stderr
    run = emu.runs()[0]
    lifecycle = (run.dir / "system_logs" / "lifecycle.txt").read_text()
    assert f"inputs.iris: ro_mount of {web.url}/iris.csv" in lifecycle and "1 fetched" in lifecycle
    assert "notice: inputs.raw_url: the job reads" in lifecycle  # the run says it too
