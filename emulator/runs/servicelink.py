"""A run's link to the home's Azure ML service (`amlemu serve`): when the service runs, every rank
gets the variables the v1 runtime sets (AZUREML_SERVICE_ENDPOINT, AZUREML_RUN_TOKEN and its expiry,
AZUREML_DISCOVERY_SERVICE_ENDPOINT, with the run's ids from runs/contract.py), so azureml-core's
Run.get_context() in the job is the online run and its log*/tag/upload_file reach the service.

Why a link of the run's own, opened by its supervisor: nodes cannot reach this machine's 127.0.0.1,
where the service listens, and the service must not listen wider for them. So for the run's
lifetime only, the supervisor listens where the nodes reach this machine (backend.link_listener:
docker, the cluster network's gateway; process nodes, their cluster namespace's loopback) on a
port of its own, terminates TLS there with a certificate the home's CA signs for that address and
SERVICE_HOST (the name each node resolves to it), and relays every connection to the service's
link port (servicefile's `link_port`): requests that arrive there are a job's, and the service
refuses them its studio and identity routes whatever they carry (a gateway address is reachable
from other containers of this machine too; every other route still asks for a token, and a run's
token opens its own run only). The job trusts the CA through a copy of the home's bundle in its own run
folder (REQUESTS_CA_BUNDLE, SSL_CERT_FILE). The link closes when the run ends, and the token it
hands the job is the run's own: the service refuses it for any other run or route, and once the
run has ended (emulator/service/calls.py). The token is written to the node's environment file
only, never to the launch plan, a log or the run's record.
"""
from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from amlemu import servicefile
from amlemu.backends import NodeBackend, NodeRequest
from amlemu.backends.base import SERVICE_HOST
from amlemu.runs.contract import node_job_dir

if TYPE_CHECKING:
    from amlemu.runs import linkrelay

TOKEN_SECONDS = 24 * 3600  # the SDK refreshes it before it ends (the service's token route)
CERT_DAYS = 7
BUNDLE = "amlemu-ca-bundle.pem"  # in the run's folder on each node


def _server_context(ca_folder: Path, hosts: list[str]) -> ssl.SSLContext | None:
    from amlemu import servicekeys  # noqa: PLC0415 - cryptography: a fifth of an offline run's start

    ca = servicekeys.load_ca(ca_folder)
    if ca is None:
        return None
    cert_pem, key_pem = servicekeys.issue_server_cert(*ca, hosts, CERT_DAYS)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    fd, name = tempfile.mkstemp(prefix=".link-", suffix=".pem", dir=ca_folder)  # owner-only, gone at once
    try:
        with os.fdopen(fd, "w") as out:
            out.write(cert_pem.decode() + key_pem)
        context.load_cert_chain(name)
    finally:
        os.unlink(name)
    return context


@dataclass
class RunLink:
    """What a run gets from its link: the variables every rank sees, the files its run folder
    holds on each node (the CA bundle), and the relay to stop as the run ends."""

    env: dict[str, str]
    files: dict[str, bytes]
    relay: linkrelay.ServiceLink

    def stop(self) -> None:
        self.relay.stop()


def attach(home_root: Path, run_id: str, backend: NodeBackend, request: NodeRequest,
           log: Callable[[str], None]) -> RunLink | None:
    """The run's link when the home's service runs (else None: the run is offline, as before)."""
    state = servicefile.read_state(home_root)
    if state is None:
        return None
    from amlemu import servicekeys  # noqa: PLC0415 - see _server_context

    folder = servicefile.service_dir(home_root)
    key = servicekeys.home_key(folder)
    address = backend.host_address(request)
    if key is None or address is None or not state.link_port:
        return None
    server = _server_context(folder, [SERVICE_HOST, address])
    bundle = folder / "ca-bundle.pem"
    if server is None or not bundle.is_file():
        return None
    from amlemu.runs.linkrelay import ServiceLink  # noqa: PLC0415 - asyncio: online runs only (~30 ms)

    relay: ServiceLink | None = None
    try:
        listener = backend.link_listener(request, run_id)
        if listener is None:
            return None
        relay = ServiceLink(listener, state.link_port, server,
                            ssl.create_default_context(cafile=str(folder / "ca.pem")))
        port = relay.start()
    except OSError as exc:  # the run goes on offline, as without a service
        if relay is not None:
            relay.stop()
        log(f"warning: no link to the service on {address}: {exc.strerror or exc}; the run is offline")
        return None
    token, expires = servicekeys.run_token(key, run_id, TOKEN_SECONDS)
    endpoint = f"https://{SERVICE_HOST}:{port}"
    ca_path = f"{node_job_dir(run_id)}/{BUNDLE}"
    env = {"AZUREML_SERVICE_ENDPOINT": endpoint, "AZUREML_DISCOVERY_SERVICE_ENDPOINT": f"{endpoint}/discovery",
           "AZUREML_RUN_TOKEN": token, "AZUREML_RUN_TOKEN_EXPIRY": str(expires),
           "REQUESTS_CA_BUNDLE": ca_path, "SSL_CERT_FILE": ca_path}
    log(f"online: the run reaches the service at {endpoint} ({address}:{port} on this machine, for this run "
        "only); its token is the run's own and expires with it")
    return RunLink(env, {BUNDLE: bundle.read_bytes()}, relay)
