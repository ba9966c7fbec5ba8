"""The blob endpoint of the service's datastores, and the routes behind `ml_client.jobs.download`:
the run's output assets (run history's `rundata`) and their URIs (the data plane's
batchGetResolvedUris). azure-ai-ml reads a job's outputs from that endpoint, and writes a job's
local inputs (`Input(path="./data")`) to it before the job is sent.

azure-ai-ml builds that endpoint as `https://<account>.blob.<storage suffix>`: the datastores the
service shows are named with the account `<host:port>/amlemustore`, which makes it
`https://127.0.0.1:<port>/amlemustore.blob.core.windows.net`, an IP-style URL azure-storage-blob
keeps the account in the path of (as it does for Azurite). The blobs are read from the state
(`run_outputs`, `list_blobs`, `read_blob`, `write_blob`): a state without them answers 501.
Blob metadata (azure-ai-ml's "upload completed" marker) is kept in memory: a restarted service
has forgotten it and the SDK uploads again, which is what it does for a marker it cannot find.
"""
from __future__ import annotations

import re
from email.utils import formatdate
from typing import Any
from urllib.parse import urlsplit
from xml.sax.saxutils import escape

from amlemu.service.protocol.calls import Call, Reply
from amlemu.service.state import ACCOUNT, ServiceError, bad_request

ASSET_PREFIX = "azureml://amlemu/outputs/"
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


def account_name(base: str) -> str:
    """The account name that makes azure-ai-ml's blob URL point back at the service."""
    return f"{urlsplit(base).netloc}/{ACCOUNT}"


def _needs(call: Call, method: str) -> Any:
    """A download method of the state (a state that does not serve them raises its 501 when called)."""
    return getattr(call.st, method)


def _field(call: Call, key: str) -> Any:
    """A top-level field of a JSON object body (None when absent); a 400 when the body is no object."""
    if call.body is None:
        return None
    if not isinstance(call.body, dict):
        raise bad_request(key, f"{key}: the body is not a JSON object with {key} in it")
    return call.body.get(key)


def run_data(call: Call) -> Reply:
    name = _field(call, "runId") or ""
    if not isinstance(name, str) or not name:
        raise bad_request("runId", "runId: missing or not a string; name the job whose data is wanted")
    outputs = _needs(call, "run_outputs")(name)
    return Reply(body={"runMetadata": {"runId": name, "status": call.st.get_job(name).get("status"), "outputs": {
        out: {"assetId": f"{ASSET_PREFIX}{name}/{out}", "type": "uri_folder"} for out in outputs}}})


def resolved_uris(call: Call) -> Reply:
    ids = _field(call, "values") or []
    if not isinstance(ids, list):
        raise bad_request("values", "values: not a list of asset ids")
    found: dict[str, Any] = {}
    for asset in ids:
        job, _, out = str(asset).removeprefix(ASSET_PREFIX).partition("/")
        uri = _needs(call, "run_outputs")(job).get(out) if str(asset).startswith(ASSET_PREFIX) else None
        if uri:
            found[asset] = {"uri": uri, "type": "uri_folder"}
    return Reply(body={"values": found})


def _check_account(call: Call) -> None:
    account = call.params["account"]
    if not account.startswith(f"{ACCOUNT}.blob."):
        raise ServiceError(404, "NoRoute", f"amlemu serves no {call.method} {call.path}")


def list_blobs(call: Call) -> Reply:
    _check_account(call)
    if call.query.get("comp") != "list":
        raise ServiceError(400, "UnsupportedQueryParameter", "only comp=list is served on a container", "comp")
    container, prefix = call.params["container"], call.query.get("prefix", "")
    stamp = formatdate(usegmt=True)
    blobs = "".join(f"<Blob><Name>{escape(name)}</Name><Properties><Last-Modified>{stamp}</Last-Modified>"
                    f"<Etag>0x1</Etag><Content-Length>{size}</Content-Length><BlobType>BlockBlob</BlobType>"
                    "<Content-Type>application/octet-stream</Content-Type></Properties><Metadata /></Blob>"
                    for name, size in _needs(call, "list_blobs")(container, prefix))
    xml = ('<?xml version="1.0" encoding="utf-8"?>'
           f'<EnumerationResults ServiceEndpoint="{escape(call.base)}/" ContainerName="{escape(container)}">'
           f"<Prefix>{escape(prefix)}</Prefix><Blobs>{blobs}</Blobs><NextMarker /></EnumerationResults>")
    return Reply(200, xml, {"Content-Type": "application/xml", "x-ms-version": "2021-08-06"})


METADATA: dict[tuple[str, str], dict[str, str]] = {}


def read_blob(call: Call) -> Reply:
    _check_account(call)
    key = (call.params["container"], call.params["blob"])
    headers = {"x-ms-blob-type": "BlockBlob", "ETag": '"0x1"', "Last-Modified": formatdate(usegmt=True),
               "Content-Type": "application/octet-stream", "x-ms-version": "2021-08-06", "Accept-Ranges": "bytes",
               "x-ms-request-id": "amlemu"}
    meta = {k[10:]: v for k, v in call.headers.items() if k.startswith("x-ms-meta-")}
    if call.method == "PUT" and call.query.get("comp") == "metadata":
        _needs(call, "read_blob")(*key)  # the blob must exist
        METADATA[key] = meta
        return Reply(200, b"", headers)
    if call.method == "PUT":
        data = call.ctx.blocks.upload(*key, call.query, call.raw)
        if data is not None:  # not a piece of a larger file (emulator/service/blocks.py)
            _needs(call, "write_blob")(*key, data)
            METADATA[key] = meta
        return Reply(201, b"", {**headers, "x-ms-request-server-encrypted": "true"})
    data: bytes = _needs(call, "read_blob")(*key)
    headers.update({f"x-ms-meta-{k}": v for k, v in METADATA.get(key, {}).items()})
    wanted = _RANGE.match(call.headers.get("x-ms-range") or call.headers.get("range") or "")
    if wanted is None:
        return Reply(200, data, headers)
    if not data:  # Azure refuses a range of an empty blob; the SDK asks again without one
        return Reply(416, b"", {**headers, "Content-Range": "bytes */0", "x-ms-error-code": "InvalidRange"})
    start = int(wanted[1])
    end = min(int(wanted[2]) if wanted[2] else len(data) - 1, len(data) - 1)
    return Reply(206, data[start:end + 1], {**headers, "Content-Range": f"bytes {start}-{end}/{len(data)}"})
