"""Hostile requests against `amlemu serve` (in this process, over a real emulator home): each is a
4xx with Azure's error JSON naming the field, never a 500, never a traceback in the service's log;
bodies are refused before they are read; names with terminal escapes reach the log escaped."""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from amlemu.api import Emulator
from amlemu.service.protocol import bodies
from amlemu.service.protocol.auth import Auth
from amlemu.service.state.emulator import EmulatorState
from amlemu.service.mlflowmount import MlflowMount
from amlemu.service.protocol.routes import Context
from amlemu.service.server import LogHandler, file_logger, run_in_thread

WS = ("/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/amlemu-rg/providers"
      "/Microsoft.MachineLearningServices/workspaces/amlemu-ws")
H = "/history/v1.0" + WS
BLOB = "/amlemustore.blob.core.windows.net/workspaceblobstore"


@dataclass
class Live:
    url: str
    bearer: dict[str, str]
    ca: Path
    log: Path
    auth: Auth
    ctx: Context

    def send(self, method: str, path: str, **kw: Any) -> requests.Response:
        headers = {**self.bearer, **kw.pop("headers", {})}
        return requests.request(method, self.url + path, headers=headers, verify=self.ca, timeout=30, **kw)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("hostile")
    emu = Emulator(tmp / "emu", backend="process")
    log = tmp / "service.log"
    write = file_logger(log)  # the real service's logger: escapes included
    auth = Auth.fresh()
    ctx = Context(EmulatorState(emu, write), auth, log=write)
    mount = MlflowMount(emu.home.root)
    mount.bind(ctx)
    running = run_in_thread(ctx, tmp / "tls", extra_routes=[mount.route()])
    try:
        ca = tmp / "tls" / "ca-bundle.pem"
        token = requests.get(f"{running.url}/msi/token", params={"resource": running.url},
                             headers={"X-IDENTITY-HEADER": auth.identity_header}, verify=ca, timeout=10).json()
        yield Live(running.url, {"Authorization": f"Bearer {token['access_token']}"}, ca, log, auth, ctx)
    finally:
        running.stop()
        emu.cleanup()


def compute(scale: Any = None, inner: Any = None, props: Any = None) -> dict[str, Any]:
    inner = {"vmSize": "Standard_D2_v2", "scaleSettings": scale} if inner is None else inner
    return {"properties": {"computeType": "AmlCompute", "properties": inner} if props is None else props}


def raw(text: str) -> dict[str, Any]:
    return {"data": text.encode(), "headers": {"Content-Type": "application/json"}}


DEEP = "[" * 5000 + "]" * 5000
# (id, method, path, request keywords, status, the field the error names)
CASES = [
    ("job name with a NUL", "PUT", WS + "/jobs/a%00b", {"json": {"properties": {}}}, 400, "name"),
    ("job name of 5000 characters", "GET", WS + "/jobs/" + "a" * 5000, {}, 400, "name"),
    ("job name with a newline", "GET", WS + "/jobs/a%0Ab", {}, 400, "name"),
    ("a query value with a NUL", "GET", WS + "/jobs?x=%00", {}, 400, "x"),
    ("compute body a string", "PUT", WS + "/computes/c1", {"json": "a string"}, 400, "properties"),
    ("compute properties a list", "PUT", WS + "/computes/c1", {"json": {"properties": []}}, 400, "properties"),
    ("compute inner properties a string", "PUT", WS + "/computes/c1", {"json": compute(inner="x")}, 400,
     "properties.properties"),
    ("scaleSettings a list", "PUT", WS + "/computes/c1", {"json": compute(scale=[1])}, 400, "scaleSettings"),
    ("maxNodeCount a word", "PUT", WS + "/computes/c1", {"json": compute({"maxNodeCount": "abc"})}, 400,
     "scaleSettings.maxNodeCount"),
    ("maxNodeCount 1.5", "PUT", WS + "/computes/c1", {"json": compute({"maxNodeCount": 1.5})}, 400,
     "scaleSettings.maxNodeCount"),
    ("maxNodeCount true", "PUT", WS + "/computes/c1", {"json": compute({"maxNodeCount": True})}, 400,
     "scaleSettings.maxNodeCount"),
    ("maxNodeCount 1e400", "PUT", WS + "/computes/c1",
     raw('{"properties": {"computeType": "AmlCompute", "properties": {"scaleSettings": {"maxNodeCount": 1e400}}}}'),
     400, "properties.properties.scaleSettings.maxNodeCount"),
    ("maxNodeCount NaN", "PUT", WS + "/computes/c1", raw('{"properties": {"scaleSettings": {"maxNodeCount": NaN}}}'),
     400, "body"),
    ("idle time a list", "PUT", WS + "/computes/c1", {"json": compute({"nodeIdleTimeBeforeScaleDown": []})}, 400,
     "scaleSettings.nodeIdleTimeBeforeScaleDown"),
    ("vmPriority a number", "PUT", WS + "/computes/c1", {"json": compute(inner={"vmPriority": 5})}, 400,
     "vm_priority"),
    ("JSON nested 5000 deep", "PUT", WS + "/computes/c1", raw(DEEP), 400, "body"),
    ("JSON nested 100 deep", "PUT", WS + "/computes/c1", raw('{"a":' * 100 + "1" + "}" * 100), 400, "a.a.a"),
    ("JSON cut short", "PUT", WS + "/jobs/j1", raw('{"properties": {'), 400, "body"),
    ("JSON not UTF-8", "PUT", WS + "/jobs/j1", {"data": b'{"a": "\xff"}', "headers": {"Content-Type":
                                                                                       "application/json"}}, 400, "body"),
    ("job body a list", "PUT", WS + "/jobs/j1", {"json": [1, 2]}, 400, "properties"),
    ("job properties a string", "PUT", WS + "/jobs/j1", {"json": {"properties": "x"}}, 400, "properties"),
    ("job type a list", "PUT", WS + "/jobs/j1", {"json": {"properties": {"jobType": ["Command"]}}}, 400,
     "properties.jobType"),
    ("job command a mapping", "PUT", WS + "/jobs/j1", {"json": {"properties": {
        "jobType": "Command", "command": {"a": 1}, "computeId": "c", "environmentId": "e"}}}, 400, ""),
    ("job inputs a list", "PUT", WS + "/jobs/j1", {"json": {"properties": {
        "jobType": "Command", "command": "echo", "inputs": [1]}}}, 400, ""),
    ("environment properties a list", "PUT", WS + "/environments/e1/versions/1", {"json": {"properties": [1]}},
     400, "properties"),
    ("rundata body a list", "POST", H + "/rundata", {"json": [1]}, 400, "runId"),
    ("rundata runId a mapping", "POST", H + "/rundata", {"json": {"runId": {"a": 1}}}, 400, "runId"),
    ("resolved URIs values a string", "POST", "/data/v1.0" + WS + "/dataversion/batchGetResolvedUris",
     {"json": {"values": "abc"}}, 400, "values"),
    ("blob name with a NUL", "GET", BLOB + "/a%00b", {}, 400, "blob"),
    ("blob path of 300 segments", "GET", BLOB + "/a" * 300, {}, 400, "blob"),
    ("blob path climbing out", "PUT", BLOB + "/x/..%2f..%2fevil", {"data": b"x"}, 400, "blob"),
    ("block path climbing out", "PUT", BLOB + "/..%2fevil?comp=block&blockid=QQ==", {"data": b"x"}, 400, "blob"),
    ("block id of 5000 characters", "PUT", BLOB + "/big.bin?comp=block&blockid=" + "Q" * 5000, {"data": b"x"},
     400, "blockid"),
    ("log path climbing out", "GET", "/logs/run1/..%2f..%2fservice%2fsecrets.json", {}, 400, "path"),
    ("v1 experiment with a NUL", "POST", H + "/experiments/a%00b", {"json": {}}, 400, "experiment"),
    ("v1 metrics batch a string", "POST", "/metric/v2.0" + WS + "/runs/r1/batch", {"json": "x"}, 400, ""),
    ("operation id of 5000 characters", "GET", "/operations/" + "a" * 5000, {}, 400, "id"),
]


@pytest.mark.parametrize(("method", "path", "kw", "status", "target"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_hostile_requests_get_a_4xx_naming_the_field(live: Live, method: str, path: str, kw: dict[str, Any],
                                                     status: int, target: str) -> None:
    seen = len(live.log.read_text())
    got = live.send(method, path, **kw)
    assert got.status_code == status, got.text[:500]
    error = got.json()["error"]
    assert error["message"] and error["code"] != "InternalServerError"
    assert target in error.get("target", ""), error
    assert "Traceback" not in live.log.read_text()[seen:]


def _unfinished(live: Live, head: str, body: bytes = b"") -> str:
    """The service's answer to a request whose body is never finished: one that waited for the
    body would not answer before the socket's deadline."""
    host, port = live.url.removeprefix("https://").split(":")
    context = ssl.create_default_context(cafile=str(live.ca))
    with socket.create_connection((host, int(port)), timeout=20) as plain, \
            context.wrap_socket(plain, server_hostname=host) as tls:
        tls.sendall(f"{head}Host: {host}:{port}\r\nContent-Type: application/json\r\n".encode() + b"\r\n" + body)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < 20:
            piece = tls.recv(65536)
            if not piece:
                break
            answer += piece
    return answer.decode(errors="replace")


def test_a_body_over_the_limit_is_refused_before_it_is_sent(live: Live) -> None:
    """A client that declares 1 GiB and sends none of it gets its answer at once, with or without
    a token: the service read nothing (a reader would wait for the body until the deadline)."""
    big = f"Content-Length: {1024**3}\r\n"  # over every limit, the uploads' too
    token = "".join(f"{k}: {v}\r\n" for k, v in live.bearer.items())
    for head in (f"PUT {WS}/jobs/j1 HTTP/1.1\r\n{big}", f"PUT {WS}/jobs/j1 HTTP/1.1\r\n{big}{token}",
                 f"PUT {BLOB}/big.bin HTTP/1.1\r\n{big}{token}", f"POST /mlflow/api/2.0/mlflow/runs/create "
                 f"HTTP/1.1\r\n{big}{token}"):
        answer = _unfinished(live, head)
        assert answer.startswith("HTTP/1.1 413 ") and '"RequestBodyTooLarge"' in answer, answer[:300]
    # Under the limit but without a token: the 401 comes before the body is read, as well.
    assert _unfinished(live, f"PUT {WS}/jobs/j1 HTTP/1.1\r\nContent-Length: {1024**2}\r\n").startswith(
        "HTTP/1.1 401 ")
    assert _unfinished(live, f"POST /mlflow/api/2.0/mlflow/runs/create HTTP/1.1\r\nContent-Length: 99\r\n"
                       ).startswith("HTTP/1.1 401 ")


def test_a_chunked_body_is_read_only_up_to_the_limit(live: Live) -> None:
    """5 MiB of chunks and no last chunk: the service answers once it has read past its 4 MiB."""
    token = "".join(f"{k}: {v}\r\n" for k, v in live.bearer.items())
    chunk = b"100000\r\n" + b" " * 0x100000 + b"\r\n"
    answer = _unfinished(live, f"PUT {WS}/jobs/j1 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n{token}", chunk * 5)
    assert answer.startswith("HTTP/1.1 413 ") and '"RequestBodyTooLarge"' in answer, answer[:300]


def test_names_with_terminal_escapes_reach_the_log_escaped(live: Live) -> None:
    name = "%1B%5D0%3Bpwned%07%1B%5B2J%E2%80%AEevil"  # ESC ] 0 ; title BEL, ESC [ 2 J, U+202E
    live.send("GET", "/nowhere/" + name)
    text = live.log.read_text()
    assert "/nowhere/" in text
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert "\\x1b]0;pwned\\x07\\x1b[2J\\u202eevil" in text


def test_printable_escapes_what_a_terminal_acts_on() -> None:
    assert bodies.printable("a\x1b[2Jb\nc\u202ed\u2066e\tf") == "a\\x1b[2Jb\\x0ac\\u202ed\\u2066e\\x09f"
    assert bodies.printable("plain/path-ü") == "plain/path-ü"


def test_the_health_route_names_each_component(live: Live) -> None:
    got = live.send("GET", "/amlemu/health")
    assert got.status_code == 200, got.text
    assert got.json()["components"]["stateDatabase"] == "ok"
    assert got.json()["components"]["workingDirectory"] == "ok"
    assert got.json()["components"]["mlflow"] == "ok"
    assert live.send("GET", "/amlemu/health", headers={"Authorization": ""}).status_code == 401

    def broken() -> None:
        raise FileNotFoundError("[Errno 2] No such file or directory")
    live.ctx.health_checks["broken"] = broken
    try:
        got = live.send("GET", "/amlemu/health")
    finally:
        del live.ctx.health_checks["broken"]
    assert got.status_code == 503 and got.json()["status"] == "degraded"
    assert got.json()["components"]["broken"] == "failed: FileNotFoundError: [Errno 2] No such file or directory"
    assert got.json()["components"]["mlflow"] == "ok"


def test_parse_json_names_where_a_bad_number_is() -> None:
    with pytest.raises(Exception, match="out of range") as bad:
        bodies.parse_json(b'{"a": [1, {"b": -1e999}]}')
    assert bad.value.target == "a[1].b"  # type: ignore[attr-defined]
    assert bodies.parse_json(json.dumps({"a": [1.5, None]}).encode()) == {"a": [1.5, None]}
    started = time.monotonic()
    with pytest.raises(Exception, match="nested deeper"):
        bodies.parse_json(DEEP.encode())
    assert time.monotonic() - started < 30  # a deadline, not a timing: it must not hang


@pytest.fixture(scope="module")
def code_id(live: Live) -> str:
    """A code version uploaded as the SDK does, so that a job body gets past its code to its numbers."""
    pending = live.send("POST", WS + "/codes/src/versions/1/startPendingUpload", json={}).json()
    reference = pending["blobReferenceForConsumption"]
    sas = reference["credential"]["sasUri"].split("?", 1)[1]
    assert requests.put(f"{reference['blobUri']}/t.py?{sas}", data=b"print('hi')\n", verify=live.ca,
                        timeout=30).status_code == 201
    assert live.send("PUT", WS + "/codes/src/versions/1", json={"properties": {"codeUri": reference["blobUri"]}}
                     ).status_code == 201
    return WS + "/codes/src/versions/1"


JOB_CASES = [  # (id, the properties changed, the field the 400 names)
    ("instanceCount a word", {"resources": {"instanceCount": "abc"}}, "instance_count"),
    ("instanceCount 1.5", {"resources": {"instanceCount": 1.5}}, "instance_count"),
    ("instanceCount a list", {"resources": {"instanceCount": [2]}}, "instance_count"),
    ("resources a list", {"resources": [1]}, "resources"),
    ("processCountPerInstance a word", {"distribution": {"distributionType": "Mpi",
                                                         "processCountPerInstance": "x"}}, "process_count"),
    ("distribution a string", {"distribution": "Mpi"}, "distribution"),
    ("timeout a word", {"limits": {"timeout": "abc"}}, "limits.timeout"),
    ("timeout a list", {"limits": {"timeout": [1]}}, "limits.timeout"),
    ("limits a string", {"limits": "PT1H"}, "limits"),
    ("inputs a list", {"inputs": [1]}, "inputs"),
    ("outputs a string", {"outputs": "x"}, "outputs"),
    ("default output a string", {"outputs": {"default": "x"}}, "outputs.default"),
    ("environment variables a list", {"environmentVariables": ["A=1"]}, "environment_variables"),
    ("command a mapping", {"command": {"a": 1}}, "command"),
    ("display name a list", {"displayName": ["x"]}, "display_name"),
]


@pytest.mark.parametrize(("change", "target"), [c[1:] for c in JOB_CASES], ids=[c[0] for c in JOB_CASES])
def test_a_jobs_fields_of_the_wrong_type_are_400s_naming_them(live: Live, code_id: str, change: dict[str, Any],
                                                              target: str) -> None:
    seen = len(live.log.read_text())
    props = {"jobType": "Command", "command": "python t.py", "codeId": code_id, "computeId": WS + "/computes/none",
             "environmentId": "azureml:AzureML-sklearn-1.5@latest", **change}
    got = live.send("PUT", WS + "/jobs/typed", json={"properties": props})
    assert got.status_code == 400, got.text[:500]
    assert target in got.json()["error"].get("target", ""), got.json()
    assert "Traceback" not in live.log.read_text()[seen:]


def test_only_so_many_bodies_are_held_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound on the bodies in memory: a request beyond the slots waits, then gets 503
    ServerBusy; one without a body takes no slot."""
    monkeypatch.setattr(bodies, "SLOT_WAIT", 0.2)
    slots = bodies.Slots(1)
    with_body = {"content-length": "10"}

    async def scenario() -> tuple[int, bool]:
        async with slots.hold(with_body):
            async with slots.hold({}):  # a GET: no slot needed
                pass
            try:
                async with slots.hold({"transfer-encoding": "chunked"}):
                    return 0, False
            except bodies.ServiceError as exc:
                busy = exc.status
        async with slots.hold(with_body):  # released: free again
            return busy, True
    assert asyncio.run(scenario()) == (503, True)


def test_uvicorns_own_errors_reach_the_log_escaped(tmp_path: Path) -> None:
    log = tmp_path / "service.log"
    logger = logging.getLogger("amlemu-test-uvicorn")
    handler = LogHandler(file_logger(log))
    logger.addHandler(handler)
    try:
        try:
            raise ValueError("bad path /a\x1b]0;title\x07")
        except ValueError:
            logger.exception("Exception in ASGI application")
    finally:
        logger.removeHandler(handler)
    text = log.read_text()
    assert "Exception in ASGI application" in text and "Traceback" in text
    assert "\x1b" not in text and "\\x1b]0;title\\x07" in text
