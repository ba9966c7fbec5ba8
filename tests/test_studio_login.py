"""The studio's credential and what the service never hands out (issue 25): a browser gets a session
from a one-time login link only the home's owner can mint; no studio route answers without it or to
a Host that does not name this machine (DNS rebinding); the signed log URLs expire and never serve a
run's private files (its launch plans, an owner-only file); `--allow-remote`'s certificate covers
this machine's names, so a remote client verifies it. In-process but for one `amlemu serve` in a
terminal; no job."""
from __future__ import annotations

import os
import pty
import re
import select
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner
from cryptography import x509
from starlette.testclient import TestClient

from amlemu import servicefile
from amlemu.api import Emulator
from amlemu.cli import cli
from amlemu.home import Home
from amlemu.service.state import runblobs
from amlemu.service.server import tls
from amlemu.service.protocol.auth import Auth
from amlemu.service.state.emulator import EmulatorState
from amlemu.service.protocol.routes import Context, build_app
from amlemu.service.server import public_names
from amlemu.studio.app import standalone_app
from amlemu.studio.gate import LOOPBACK_NAMES, LOGIN_PARAM, Sessions, home_key, login_url, mint_login

BASE = "http://127.0.0.1:5000"


@pytest.fixture
def studio(tmp_path: Path) -> tuple[TestClient, bytes]:
    home = Home.at(tmp_path / "home")
    key = home_key(home.root)
    return TestClient(standalone_app(home, key), base_url=BASE), key


def test_a_login_link_gives_a_session_once(studio: tuple[TestClient, bytes]) -> None:
    client, key = studio
    assert client.get("/studio/").status_code == 401  # no session yet
    link = login_url(key, BASE, "/studio/jobs/r1")
    answer = client.get(link + "&tab=logs", follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/studio/jobs/r1?tab=logs"  # token gone
    cookie = answer.headers["set-cookie"]
    for attribute in ("HttpOnly", "Path=/studio", "SameSite=lax", "Max-Age="):
        assert attribute in cookie, cookie
    assert "Secure" not in cookie  # plain http (`amlemu ui`): a Secure cookie would never come back
    assert client.get("/studio/").status_code == 200 and client.get("/studio/api/overview").status_code == 200
    # The same link again, in a browser without the session: refused (one-time).
    again = TestClient(client.app, base_url=BASE).get(link, follow_redirects=False)
    assert again.status_code == 401 and "used already" in again.text
    # Over https the cookie is Secure, and has a name of its own (http may not replace a Secure cookie).
    secure = TestClient(client.app, base_url="https://localhost:8443").get(
        f"/studio/?{LOGIN_PARAM}={mint_login(key)}", follow_redirects=False)
    assert "Secure" in secure.headers["set-cookie"]
    assert secure.headers["set-cookie"].split("=")[0] == cookie.split("=")[0] + "-tls"


OTHER_HOME = "another home's"  # its token is minted in the test: a random nonce in an id differs per xdist worker


@pytest.mark.parametrize("token", [
    "", "nonsense", "1.2.3", "9" * 300,  # not a token
    OTHER_HOME,
    "9999999999.nonce.0000",  # forged
    "9999999999.nonce.\u00e9", "\u00b2\u00b2.nonce.0000",  # not ASCII: refused, never a 500
], ids=["empty", "nonsense", "dots", "long", "other-home", "forged", "non-ascii-mac", "non-ascii-expiry"])
def test_a_token_not_minted_by_this_home_gives_no_session(studio: tuple[TestClient, bytes], token: str) -> None:
    client, _ = studio
    token = mint_login(b"another home's key" * 2) if token == OTHER_HOME else token
    answer = client.get("/studio/", params={LOGIN_PARAM: token}, follow_redirects=False)
    assert answer.status_code == 401 and "set-cookie" not in answer.headers
    assert answer.text.count("\n") == 1 and "amlemu ui --link" in answer.text  # one line: how to get a link


def test_an_expired_link_or_session_is_refused(studio: tuple[TestClient, bytes]) -> None:
    client, key = studio
    assert client.get("/studio/", params={LOGIN_PARAM: mint_login(key, seconds=-1)}).status_code == 401
    sessions = Sessions(key)
    stale = f"{int(time.time()) - 1}.{sessions.new_session().split('.')[1]}"  # another expiry, the old MAC
    client.cookies.set(sessions.cookie(False), stale, path="/studio")
    assert client.get("/studio/").status_code == 401
    assert not sessions.valid(stale) and sessions.valid(sessions.new_session())
    assert not Sessions(b"x" * 32).valid(sessions.new_session())  # another home's session
    for odd in ("\u00b2\u00b2.mac", f"{int(time.time()) + 60}.\u00e9", "9" * 5000 + ".mac"):
        assert not sessions.valid(odd)


def test_every_studio_route_needs_the_session(studio: tuple[TestClient, bytes]) -> None:
    client, _ = studio
    for path in ("/studio/", "/studio/jobs/r1", "/studio/runs/r1", "/studio/files/r1/outputs/x",
                 "/studio/static/studio.js", "/studio/nothing", "/"):  # / leads to /studio/
        answer = client.get(path)
        assert answer.status_code == 401, path
        assert answer.headers["x-content-type-options"] == "nosniff"
    api = client.get("/studio/api/jobs/r1")
    assert api.status_code == 401 and api.json()["error"]["code"] == "Unauthorized"
    assert "amlemu ui --link" in api.json()["error"]["message"]


@pytest.mark.parametrize("host,status", [
    ("127.0.0.1:5000", 401), ("localhost", 401), ("[::1]:5000", 401), ("LOCALHOST:80", 401),  # then the login
    ("127.0.0.1:8080", 401),  # any port: an ssh tunnel's, a proxy's
    ("rebound.example:5000", 400), ("127.0.0.1.rebound.example", 400), ("[::1].example", 400), ("", 400),
])
def test_the_studio_answers_only_host_names_of_this_machine(studio: tuple[TestClient, bytes], host: str,
                                                            status: int) -> None:
    client, _ = studio
    answer = client.get("/studio/", headers={"Host": host})
    assert answer.status_code == status, answer.text


def test_with_allow_remote_the_machines_own_names_are_answered_too(tmp_path: Path) -> None:
    home = Home.at(tmp_path / "home")
    key = home_key(home.root)
    remote = TestClient(standalone_app(home, key, LOOPBACK_NAMES | {"build-host.example"}), base_url=BASE)
    assert remote.get("/studio/", headers={"Host": "build-host.example:8443"}).status_code == 401
    assert remote.get("/studio/", headers={"Host": "rebound.example"}).status_code == 400


def test_amlemu_ui_link_needs_the_running_service(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    result = CliRunner().invoke(cli, ["--home", str(tmp_path / "home"), "ui", "--link"])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert result.output.startswith("amlemu: error: --link: the service of this home is not running")


def test_amlemu_serve_prints_a_working_login_link_to_a_terminal(tmp_path: Path) -> None:
    """In a terminal `amlemu serve` prints the studio's login link (piped, only where to get one:
    tests/test_service.py); the link opens the page once."""
    home = tmp_path / "home"
    home.mkdir()
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "amlemu", "--home", str(home), "serve", "--port", "0"],
                            stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
    os.close(follower)
    printed, deadline = b"", time.monotonic() + 60
    try:
        while not (found := re.search(rb"https://127\.0\.0\.1:\d+/studio/\?login=[\w.-]+", printed)):
            assert proc.poll() is None and time.monotonic() < deadline, printed.decode(errors="replace")
            if select.select([leader], [], [], 0.5)[0]:
                printed += os.read(leader, 4096)
        link, ca = found.group(0).decode(), home / "service" / "ca-bundle.pem"
        assert servicefile.read_state(home).url in link
        browser = requests.Session()
        assert browser.get(link, verify=ca, timeout=10).status_code == 200
        assert requests.get(link, verify=ca, timeout=10).status_code == 401  # once
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        os.close(leader)


# --- the signed log URLs -------------------------------------------------------------------------
@pytest.fixture
def service(tmp_path: Path) -> tuple[TestClient, Auth, Emulator]:
    emu = Emulator(tmp_path / "home", backend="process")
    run_dir = emu.home.run_dir("r1")
    for rel, text in {"user_logs/std_log.txt": "a log", "outputs/model.txt": "weights", "artifacts/notes.txt": "up",
                      "system_logs/launch.json": '{"env": {"API_KEY": "planted"}}', "agent-config.marshal": "{}",
                      "outputs/mine.key": "owner-only"}.items():
        (run_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / rel).write_text(text)
    for private in ("system_logs/launch.json", "agent-config.marshal", "outputs/mine.key"):
        (run_dir / private).chmod(0o600)
    auth = Auth.fresh()
    return TestClient(build_app(Context(EmulatorState(emu, lambda line: None), auth, log=lambda line: None))), auth, emu


def test_a_log_url_is_signed_with_its_expiry(service: tuple[TestClient, Auth, Emulator]) -> None:
    client, auth, _ = service
    fresh = auth.sign_until("logs/r1")
    assert client.get(f"/logs/r1/user_logs/std_log.txt?{fresh}").text == "a log"
    assert client.get(f"/logs/r1/notes.txt?{fresh}").text == "up"  # an upload, by the name it is listed under
    past = int(time.time()) - 1
    for query in (f"sig={auth.sign('logs/r1')}",  # the old signature, with no expiry: refused
                  f"se={past}&sig={auth.sign(f'logs/r1?se={past}')}",  # expired
                  fresh.replace("se=", "se=9"),  # its expiry pushed out: the signature no longer matches
                  f"se={'9' * 5000}&sig=x",  # no huge number parsed
                  "se=%C2%B2&sig=x", f"se={past + 3600}&sig=%C3%A9",  # not ASCII: refused, never a 500
                  auth.sign_until("logs/r2")):  # another run's
        answer = client.get(f"/logs/r1/user_logs/std_log.txt?{query}")
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "AuthenticationFailed", query


@pytest.mark.parametrize("path", ["system_logs/launch.json", "agent-config.marshal", "outputs/mine.key",
                                  "../r1/agent-config.marshal", "snapshot/train.py"])
def test_a_log_url_never_serves_a_private_file(service: tuple[TestClient, Auth, Emulator], path: str) -> None:
    client, auth, _ = service
    answer = client.get(f"/logs/r1/{path}?{auth.sign_until('logs/r1')}")
    assert answer.status_code == 404 and "planted" not in answer.text


def test_the_runs_artifact_listing_leaves_its_private_files_out(service: tuple[TestClient, Auth, Emulator]) -> None:
    _, _, emu = service
    listed = [name for name, _ in runblobs.list_blobs(emu, runblobs.ARTIFACT_CONTAINER, "ExperimentRun/dcid.r1/")]
    assert sorted(listed) == ["ExperimentRun/dcid.r1/notes.txt", "ExperimentRun/dcid.r1/outputs/model.txt",
                              "ExperimentRun/dcid.r1/user_logs/std_log.txt"]


# --- --allow-remote's certificate ----------------------------------------------------------------
def test_allow_remote_certifies_this_machines_names_and_a_client_verifies_them(tmp_path: Path) -> None:
    """The certificate `amlemu serve --allow-remote` makes covers this machine's host names and
    addresses; a TLS handshake to 127.0.0.1 naming each of them verifies with the CA bundle alone."""
    names = tls.machine_names()
    assert names, "this machine has a host name or a non-loopback address"
    assert public_names(remote=False) == ["127.0.0.1", "localhost"]
    files = tls.ensure(tmp_path / "tls", public_names(remote=True))
    san = x509.load_pem_x509_certificate(files.cert.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    covered = {*san.get_values_for_type(x509.DNSName), *(str(ip) for ip in san.get_values_for_type(x509.IPAddress))}
    assert set(names) | {"127.0.0.1", "localhost"} <= covered
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(files.cert, files.key)
    client = ssl.create_default_context(cafile=str(files.bundle))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def accept(count: int) -> None:
            for _ in range(count):
                conn, _ = listener.accept()
                try:
                    with server.wrap_socket(conn, server_side=True):
                        pass
                except (ssl.SSLError, OSError):
                    pass  # the client refused our certificate: what the last case wants
        accepting = threading.Thread(target=accept, args=(len(names) + 1,), daemon=True)
        accepting.start()
        for name in names:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                    client.wrap_socket(raw, server_hostname=name) as verified:
                assert verified.version()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                pytest.raises(ssl.SSLCertVerificationError):
            client.wrap_socket(raw, server_hostname="not-this-machine.example")
        accepting.join(timeout=10)
