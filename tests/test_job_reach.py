"""What a job can reach over the network (a job is untrusted code), tried from inside a real job on
both backends while the home's service runs: its own run's link to the service, which serves its
own run's routes and refuses it the studio and the identity routes whatever it sends; and nothing
else of this machine: not the service's own port, not Azurite (every datastore, with its
well-known development key), not another service on this machine's loopback (another home's)."""
from __future__ import annotations

import ipaddress
import json
import socket
from pathlib import Path

import psutil
import pytest
from conftest import served

from amlemu import servicefile
from amlemu.backends import get_backend, hostguard
from amlemu.api import Emulator
from amlemu.cluster import autoscale
from amlemu.home import default_cache
from amlemu.specs import RunStatus
from amlemu.storage.azurite import Azurite

pytestmark = pytest.mark.slow

# argv: name=port of each loopback service of this machine. Reports every attempt in
# outputs/reach.json: an HTTP status, or the error that ended the connection.
REACH = """
import json, os, socket, ssl, sys, urllib.error, urllib.parse, urllib.request

endpoint, token, run = (os.environ[k] for k in ("AZUREML_SERVICE_ENDPOINT", "AZUREML_RUN_TOKEN", "AZUREML_RUN_ID"))
tls = ssl.create_default_context(cafile=os.environ["REQUESTS_CA_BUNDLE"])
ws = ("/subscriptions/{AZUREML_ARM_SUBSCRIPTION}/resourceGroups/{AZUREML_ARM_RESOURCEGROUP}/providers/"
      "Microsoft.MachineLearningServices/workspaces/{AZUREML_ARM_WORKSPACE_NAME}").format(**os.environ)

def get(path, bearer=None):
    request = urllib.request.Request(endpoint + path, headers={"Authorization": f"Bearer {bearer}"} if bearer else {})
    try:
        with urllib.request.urlopen(request, context=tls, timeout=20) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"

def connect(host, port):
    try:
        with socket.create_connection((host, port), timeout=5):
            return "connected"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"

report = {"link": {}, "direct": {}}
for path in ("/studio/", "/studio/api/overview", f"/studio/api/jobs/{run}", f"/studio/jobs/{run}",
             f"/studio/files/{run}/system_logs/launch.json", "//studio/api/overview",
             "/msi/token?resource=https://management.azure.com/&api-version=2019-08-01"):
    report["link"][path] = [get(path), get(path, token)]
report["own_run"] = get(f"/history/v1.0{ws}/runs/{run}/details", token)
report["own_run_without_token"] = get(f"/history/v1.0{ws}/runs/{run}/details")
report["workspace_jobs"] = get(f"{ws}/jobs?api-version=2023-04-01", token)
hosts = ["127.0.0.1", "amlemu-service.blob.internal", *sys.argv[1].split(",")]
link_port = urllib.parse.urlsplit(endpoint).port
for name, port in (arg.split("=") for arg in sys.argv[2:]):
    for host in hosts:
        # The link's own port, by chance the same number as one of this machine's (ports are drawn
        # per namespace): there the link itself answers, so that try tells nothing.
        own = int(port) == link_port
        report["direct"][f"{name} at {host}"] = "the link's own port" if own else connect(host, int(port))
os.makedirs("outputs", exist_ok=True)
with open("outputs/reach.json", "w") as out:
    json.dump(report, out, indent=1)
"""


def host_addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback (its interfaces, docker bridges included)."""
    return sorted({a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                   if a.family == socket.AF_INET and not a.address.startswith("127.")})


def test_a_job_reaches_its_own_runs_link_and_nothing_else_of_this_machine(emu: Emulator, cluster, make_job,
                                                                        tmp_path: Path) -> None:
    cluster()
    azurite = Azurite(emu.home.root, default_cache()).ensure()
    project = tmp_path / "project"
    project.mkdir()
    # Other services of this machine: on loopback (another home's), on every interface (a developer's
    # database), tried at each of this machine's addresses.
    with socket.create_server(("127.0.0.1", 0)) as other, socket.create_server(("0.0.0.0", 0)) as everywhere, \
            served(emu.home.root, project, emu.default_backend, False):
        state = servicefile.read_state(emu.home.root)
        assert state is not None and state.link_port
        ports = {"service": state.port, "link-port": state.link_port, "azurite": azurite.port,
                 "other": other.getsockname()[1], "everywhere": everywhere.getsockname()[1]}
        args = [",".join(host_addresses()), *(f"{k}={v}" for k, v in ports.items())]
        run = emu.submit(make_job(REACH, args=" ".join(args), distribution="none"))
        run.wait(timeout=300)
        assert run.status == RunStatus.COMPLETED, run.logs(0)[-3000:]
        report = json.loads((run.outputs / "reach.json").read_text())
        # The run's ports closed with it; the cluster's guard stays with the cluster.
        assert hostguard.rules(hostguard.comment(emu.home.id, "c1", run.id)) == []
        if emu.default_backend == "docker" and hostguard.supported("lo") is None:
            assert hostguard.rules(hostguard.comment(emu.home.id, "c1")), "the docker cluster has no host guard"
    # The link serves the run's own routes with its token, and nothing without one.
    assert report["own_run"] == 200 and report["own_run_without_token"] == 401, report
    assert report["workspace_jobs"] == 403, report  # a run's token opens its own run only
    # The studio and the identity routes are refused to every request through a link.
    assert all(answers == [403, 403] for answers in report["link"].values()), report["link"]
    # Nothing of this machine answers the job directly, at loopback or at the link's address.
    reached = {where: how for where, how in report["direct"].items() if how == "connected"}
    assert reached == {}, report["direct"]


def test_a_request_on_the_link_port_is_refused_the_studio_and_identity_routes(tmp_path: Path) -> None:
    """The guard itself, with no job: the same request answers differently by the port it came in on."""
    from starlette.applications import Starlette  # noqa: PLC0415
    from starlette.responses import PlainTextResponse  # noqa: PLC0415
    from starlette.routing import Mount, Route  # noqa: PLC0415
    from starlette.testclient import TestClient  # noqa: PLC0415

    from amlemu.service.protocol.auth import Auth  # noqa: PLC0415
    from amlemu.service.protocol.calls import Context  # noqa: PLC0415
    from amlemu.service.protocol.linkguard import link_guard  # noqa: PLC0415

    async def ok(_request):  # type: ignore[no-untyped-def]
        return PlainTextResponse("ok")
    inner = Starlette(routes=[Mount("/studio", routes=[Route("/{p:path}", ok)]), Route("/msi/token", ok),
                              Route("/history/x", ok), Route("/studiox", ok)])
    lines: list[str] = []
    ctx = Context(state=None, auth=Auth.fresh(), log=lines.append, link_port=4242)  # type: ignore[arg-type]
    app = link_guard(inner, ctx)

    def get(path: str, port: int):  # type: ignore[no-untyped-def]
        async def call(scope, receive, send):  # type: ignore[no-untyped-def]
            await app({**scope, "server": ("127.0.0.1", port)}, receive, send)
        return TestClient(call).get(path)
    for path in ("/studio", "/studio/", "/studio/api/overview", "/msi/token"):
        refused = get(path, 4242)
        assert refused.status_code == 403 and get(path, 443).status_code == 200, path
        assert refused.json()["error"]["code"] == "AuthorizationFailed"  # ARM's error JSON, as every refusal
    assert get("/history/x", 4242).status_code == 200 and get("/studiox", 4242).status_code == 200
    assert any("403 (from a job)" in line for line in lines)


def test_mpirun_and_its_daemons_talk_on_the_clusters_network_only(emu: Emulator, cluster) -> None:
    """mpirun publishes only its address on the cluster's network, so a node's MPI daemon calls back
    there at once instead of trying (and being refused at) every other address of this machine."""
    spec = cluster()
    backend = get_backend(emu.default_backend, emu.home)
    request = autoscale.node_request(emu.home, spec, 0)
    mca = backend.callback_mca(request)
    if not backend.guards_host:  # process nodes: their own namespace, mpirun reached on its loopback
        assert mca == {}
        return
    network = ipaddress.ip_network(mca["OMPI_MCA_oob_tcp_if_include"])
    assert ipaddress.ip_address(backend.host_address(request)) in network
    assert not any(ipaddress.ip_address(a) in network for a in host_addresses() if a != backend.host_address(request))
