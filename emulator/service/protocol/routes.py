"""The protocol: Azure ML's REST routes, as the unmodified azure-ai-ml and azure-identity call them,
over a `State` (emulator/service/state.py), on Starlette.

Each route is (methods, path, handler, auth); a handler is a plain function of a `Call` that
returns a `Reply`, run in Starlette's thread pool (the states block: SQLite, Docker). The
wrapper (emulator/service/endpoint.py) checks the names, the workspace named in the path and
the caller's credential before it reads the body (bounded), turns ServiceError into Azure's error
JSON and logs one line per request: method, path, status, never a query or a header.

Shapes follow what the SDK's deserializers need (ARM resources, run history `RunDetails`, Blob
REST): a field it never reads is left out.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from email.utils import formatdate
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Route

from amlemu.jobs import resource
from amlemu.service.protocol import assetroutes
from amlemu.service.protocol import bodies
from amlemu.service.protocol import componentroutes
from amlemu.service.protocol import datablobs
from amlemu.service.protocol import endpoint
from amlemu.service.protocol import health
from amlemu.service.protocol import hyperdriveroutes
from amlemu.service.protocol import linkguard
from amlemu.service.protocol import pipelineroutes
from amlemu.service.protocol import sweeproutes
from amlemu.service.protocol import v1online
from amlemu.service.protocol import v1routes
from amlemu.service.protocol.calls import Call, Context, Reply, arm_error
from amlemu.service.state import ACCOUNT, ARM_TYPE, not_found, system_data

CLOUD_NAME = "AmlEmuCloud"  # anything but the built-in names, or the SDK ignores the metadata URL
WS = ("/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.MachineLearningServices"
      "/workspaces/{ws}")
# azure-core's ARM poller treats Retry-After "0" as absent and then waits its default 30 s, so the
# operation-status replies ask for a blink; the first reply's header is parsed as an int by the
# SDK's generated code, and the poller's first status check does not wait, so that one says "0".
RETRY_AFTER, FIRST_RETRY_AFTER = "0.01", "0"


def _resource(call: Call, kind: str, name: str, props: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"id": f"{call.st.workspace.id}/{kind}/{name}", "name": name, "type": f"{ARM_TYPE}/{kind}",
            **extra, "properties": props, "systemData": system_data()}


def _operation_headers(call: Call, op_id: str, header: str = "Location") -> dict[str, str]:
    return {header: f"{call.base}/operations/{op_id}", "Retry-After": FIRST_RETRY_AFTER}


# --- cloud metadata, identity, workspace, discovery ---------------------------------------------
def metadata(call: Call) -> Reply:
    root = call.base + "/"
    return Reply(body=[{"name": CLOUD_NAME, "portal": f"{call.base}/studio", "resourceManager": root,
                        "authentication": {"loginEndpoint": root, "audiences": [root], "tenant": "common",
                                           "identityProvider": "AAD"},
                        "suffixes": {"storage": "core.windows.net"}}])


def token(call: Call) -> Reply:
    if not call.ctx.auth.check_identity(call.headers.get("x-identity-header")):
        return arm_error(401, "Unauthorized", "missing or wrong X-IDENTITY-HEADER")
    issued, expires = call.ctx.auth.issue(call.query.get("resource", ""))
    return Reply(body={"access_token": issued, "expires_on": str(expires),
                       "resource": call.query.get("resource", ""), "token_type": "Bearer"})


def token_v1(call: Call) -> Reply:
    """App Service's 2017 managed-identity protocol (MSI_ENDPOINT + MSI_SECRET), which azureml-core's
    MsiAuthentication speaks: the same tokens, the secret in a `secret` header."""
    if not call.ctx.auth.check_identity(call.headers.get("secret")):
        return arm_error(401, "Unauthorized", "missing or wrong secret header (MSI_SECRET)")
    return token(Call(call.ctx, call.method, call.path, call.params, call.query,
                      {**call.headers, "x-identity-header": call.headers["secret"]}, call.raw, call.body))


def workspace(call: Call) -> Reply:
    ws = call.st.workspace
    return Reply(body={
        "id": ws.id, "name": ws.workspace_name, "location": ws.location, "kind": "Default", "type": ARM_TYPE,
        "identity": {"type": "SystemAssigned"}, "sku": {"name": "Basic", "tier": "Basic"},
        "properties": {"friendlyName": ws.workspace_name, "discoveryUrl": f"{call.base}/discovery",
                       "provisioningState": "Succeeded",
                       "workspaceId": str(uuid.uuid5(uuid.NAMESPACE_URL, ws.id)),
                       "storageAccount": f"/subscriptions/{ws.subscription_id}/resourceGroups/{ws.resource_group}"
                                         f"/providers/Microsoft.Storage/storageAccounts/{ACCOUNT}",
                       "publicNetworkAccess": "Enabled", "hbiWorkspace": False},
        "systemData": system_data()})


def discovery(call: Call) -> Reply:
    keys = ("api", "catalog", "experimentation", "gallery", "history", "hyperdrive", "labeling",
            "modelmanagement", "pipelines", "studiometadata")
    # azureml-core links a run as <studio>/runs/<id> (its "Web View"): the studio page serves that.
    return Reply(body={**{k: call.base for k in keys}, "studio": f"{call.base}/studio"})


# --- code snapshots and the blob container they are uploaded to ----------------------------------
def code_versions(call: Call) -> Reply:
    return Reply(body={"value": call.st.registry.versions("codes", call.params["name"], call.query.get("hash"))})


def code_pending_upload(call: Call) -> Reply:
    container = f"code-{uuid.uuid4().hex[:12]}"  # a fresh temporary container, as the service hands out
    blob_uri = f"{call.base}/{ACCOUNT}/{container}"
    sas = f"{blob_uri}?sv=2021-08-06&sr=c&sp=rcwl&sig={call.ctx.auth.sign(container)}"
    return Reply(body={"pendingUploadId": uuid.uuid4().hex, "pendingUploadType": "TemporaryBlobReference",
                       "blobReferenceForConsumption": {"blobUri": blob_uri, "storageAccountArmId": None,
                                                       "credential": {"credentialType": "SAS", "sasUri": sas}}})


def versioned(kind: str) -> Callable[[Call], Reply]:
    def handler(call: Call) -> Reply:
        name, version = call.params["name"], call.params["version"]
        if call.method == "PUT":
            return Reply(201, call.st.registry.put(kind, name, version, call.props))
        return Reply(body=call.st.registry.get(kind, name, version))
    return handler


def environment_versions(call: Call) -> Reply:
    return Reply(body={"value": call.st.registry.versions("environments", call.params["name"])})


def blob(call: Call) -> Reply:
    container, name = call.params["container"], call.params["blob"]
    ms = {"x-ms-request-id": str(uuid.uuid4()), "x-ms-version": "2021-08-06", "ETag": '"0x1"',
          "Last-Modified": formatdate(usegmt=True)}
    if not call.ctx.auth.check_signature(container, call.query.get("sig")):
        return Reply(403, b"AuthenticationFailed", {**ms, "x-ms-error-code": "AuthenticationFailed"})
    if call.method == "PUT":  # an upload, or (comp=metadata) the SDK's "already uploaded" marker on it
        meta = {k[10:]: v for k, v in call.headers.items() if k.startswith("x-ms-meta-")}
        if call.query.get("comp") == "metadata":
            call.st.blobs.put(container, name, call.raw, meta)
            return Reply(200, b"", ms)
        data = call.ctx.blocks.upload(container, name, call.query, call.raw)
        if data is not None:
            call.st.blobs.put(container, name, data, None)
            if meta:
                call.st.blobs.put(container, name, b"", meta)
        return Reply(201, b"", ms)
    found = call.st.blobs.get(container, name)
    if found is None:
        return Reply(404, b"" if call.method == "HEAD" else b"BlobNotFound", {**ms, "x-ms-error-code": "BlobNotFound"})
    data, meta = found
    return Reply(200, data, {**ms, **{f"x-ms-meta-{k}": v for k, v in meta.items()}, "x-ms-blob-type": "BlockBlob",
                             "Content-Type": "application/octet-stream"})


# --- jobs and their run history ------------------------------------------------------------------
def job_resource(call: Call, name: str, props: dict[str, Any]) -> dict[str, Any]:
    # The one serializer `amlemu job show` prints through too (emulator/jobs/resource.py); a sweep's as a
    # Sweep, a pipeline's as a Pipeline.
    return resource.rest_resource(name, pipelineroutes.shown(call, name, props), workspace_id=call.st.workspace.id,
                                  created_at=call.st.job_created(name), service_url=call.base)


def job(call: Call) -> Reply:
    name = call.params["name"]
    if call.method == "PUT":
        return Reply(201, job_resource(call, name, pipelineroutes.put_job(call, name)))
    return Reply(body=job_resource(call, name, call.st.get_job(name)))


def job_list(call: Call) -> Reply:
    return Reply(body={"value": [job_resource(call, n, p) for n, p in call.st.list_jobs()]})


def job_cancel(call: Call) -> Reply:
    return Reply(202, b"", _operation_headers(call, call.st.cancel_job(call.params["name"])))


def _iso(ts: float | None) -> str | None:
    return None if ts is None else time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(ts))


def run_details(call: Call) -> Reply:
    name = call.params["name"]
    run = call.st.run_details(name)
    signed = call.ctx.auth.sign_until(f"logs/{name}")
    details: dict[str, Any] = {"runId": name, "status": run.status, "warnings": [], "target": run.target,
                               "startTimeUtc": _iso(run.start_time), "endTimeUtc": _iso(run.end_time),
                               "logFiles": {p: f"{call.base}/logs/{name}/{p}?{signed}" for p in run.log_files}}
    if run.error:
        details["error"] = {"error": {"code": "UserError", "message": run.error}}
    return Reply(body=details)


def log_file(call: Call) -> Reply:
    name = call.params["name"]
    if not call.ctx.auth.check_until(f"logs/{name}", call.query):  # signed with its expiry (se=), not past it
        return arm_error(403, "AuthenticationFailed", "the log URL's signature is missing, wrong or expired: "
                         "the run's details give fresh URLs")
    return Reply(200, call.st.read_log(name, call.params["path"]), {"Content-Type": "text/plain; charset=utf-8"})


# --- computes, datastores, long-running operations -----------------------------------------------
def compute_resource(call: Call, name: str, props: dict[str, Any]) -> dict[str, Any]:
    # azureml-core indexes these without a default (AmlCompute._initialize); azure-ai-ml ignores them.
    props = {"description": None, "resourceId": None, "provisioningErrors": None, **props}
    if isinstance(props.get("properties"), dict):
        props["properties"] = {"subnet": None, **props["properties"]}
    return _resource(call, "computes", name, props, location=call.st.workspace.location, tags={})


def compute(call: Call) -> Reply:
    name = call.params["name"]
    if call.method == "PUT":
        props, op = call.st.put_compute(name, call.body)
        return Reply(201, compute_resource(call, name, props), _operation_headers(call, op, "Azure-AsyncOperation"))
    if call.method == "DELETE":
        return Reply(202, b"", _operation_headers(call, call.st.delete_compute(name)))
    return Reply(body=compute_resource(call, name, call.st.get_compute(name)))


def compute_list(call: Call) -> Reply:
    return Reply(body={"value": [compute_resource(call, n, p) for n, p in call.st.list_computes()]})


def compute_nodes(call: Call) -> Reply:
    return Reply(body={"nodes": call.st.list_nodes(call.params["name"]), "nextLink": None})


def operation(call: Call) -> Reply:
    op_id = call.params["id"]
    status, error = call.st.operation(op_id)
    body: dict[str, Any] = {"id": op_id, "name": op_id, "status": status}
    if error:
        body["error"] = {"code": "UserError", "message": error}
    return Reply(body=body, headers={"Retry-After": RETRY_AFTER})


def datastore_resource(call: Call, name: str, props: dict[str, Any]) -> dict[str, Any]:
    if props.get("accountName") is None:  # served by this service: its blob endpoint (datablobs.py)
        props = {**props, "accountName": datablobs.account_name(call.base)}
    return _resource(call, "datastores", name, props)


def datastore_list(call: Call) -> Reply:
    only_default = call.query.get("isDefault", "").lower() == "true"
    return Reply(body={"value": [datastore_resource(call, n, p) for n, p in call.st.list_datastores()
                                 if not only_default or p.get("isDefault")]})


def datastore(call: Call) -> Reply:
    for name, props in call.st.list_datastores():
        if name == call.params["name"]:
            return Reply(body=datastore_resource(call, name, props))
    raise not_found(f"datastore {call.params['name']}")


def datastore_secrets(call: Call) -> Reply:
    return Reply(body=call.st.datastore_secrets(call.params["name"]))


def no_route(call: Call) -> Reply:
    return arm_error(404, "NoRoute", f"amlemu serves no {call.method} {call.path}")


H = "/history/v1.0" + WS
ROUTES: list[tuple[str, str, Callable[[Call], Reply], bool | str]] = [
    ("GET", "/metadata/endpoints", metadata, False),
    ("GET", "/msi/token", token, False),  # checks the identity header itself
    ("GET", "/msi/v1/", token_v1, False),  # checks the secret header itself
    ("GET", "/discovery", discovery, False),
    ("GET", health.ROUTE, health.health, True),
    ("GET", "/operations/{id}", operation, True),
    ("GET", WS, workspace, True),
    *v1routes.ROUTES,
    *hyperdriveroutes.ROUTES,  # SDK v1 HyperDriveConfig: its code snapshot, its runs
    ("GET", WS + "/codes/{name}/versions", code_versions, True),
    ("POST", WS + "/codes/{name}/versions/{version}/startPendingUpload", code_pending_upload, True),
    ("GET|PUT", WS + "/codes/{name}/versions/{version}", versioned("codes"), True),
    ("GET", WS + "/environments/{name}/versions", environment_versions, True),
    ("GET|PUT", WS + "/environments/{name}/versions/{version}", versioned("environments"), True),
    *assetroutes.routes(WS),  # data and model assets: ml_client.data.*, ml_client.models.*
    *componentroutes.routes(WS),  # ml_client.components.*, a pipeline's anonymous components
    ("GET", WS + "/jobs", job_list, True),
    ("GET|PUT", WS + "/jobs/{name}", job, True),
    ("POST", WS + "/jobs/{name}/cancel", job_cancel, True),
    ("GET", H + "/runs/{name}/details", run_details, "run"),
    ("GET", H + "/experiments/{experiment}/runs/{name}/details", run_details, "run"),
    *sweeproutes.ROUTES,  # a sweep's trials: jobs.list(parent_job_name=...)
    ("POST", H + "/rundata", datablobs.run_data, True),
    ("POST", "/data/v1.0" + WS + "/dataversion/batchGetResolvedUris", datablobs.resolved_uris, True),
    ("GET", "/logs/{name}/{path:path}", log_file, False),  # signed URLs
    # azureml-core reads computes through the workspace's API host, under /rp/workspaces.
    *[(method, prefix + WS + path, handler, True) for prefix in ("", "/rp/workspaces")
      for method, path, handler in (("GET", "/computes", compute_list), ("GET|PUT|DELETE", "/computes/{name}", compute),
                                    ("POST", "/computes/{name}/listNodes", compute_nodes))],
    ("GET", WS + "/datastores", datastore_list, True),
    ("GET", WS + "/datastores/{name}", datastore, True),
    ("POST", WS + "/datastores/{name}/listSecrets", datastore_secrets, True),
    ("GET|HEAD|PUT", f"/{ACCOUNT}/{{container}}/{{blob:path}}", blob, "sas"),
    # The blob endpoint azure-ai-ml derives from a datastore's account name (jobs.download, local inputs).
    ("GET", "/{account}/{container}", datablobs.list_blobs, True),
    ("GET|HEAD|PUT", "/{account}/{container}/{blob:path}", datablobs.read_blob, True),
    ("GET|HEAD|PUT|POST|DELETE|PATCH", "/{path:path}", no_route, False),
]
# The routes whose bodies are files (blob puts, v1's project zip): bodies.UPLOAD_LIMIT, not JSON_LIMIT.
UPLOADS = frozenset({blob, datablobs.read_blob, v1online.upload, v1routes.start_run})


def build_app(ctx: Context, extra_routes: list[Route] | None = None) -> Any:
    """The service's ASGI app; `extra_routes` (the studio page, under /studio) come first: the blob
    routes' `/{account}/{container}/...` would take their paths otherwise."""
    json_slots, upload_slots = bodies.Slots(bodies.JSON_SLOTS), bodies.Slots(bodies.UPLOAD_SLOTS)
    routes = [Route(path, endpoint.endpoint(ctx, fn, auth, *((bodies.UPLOAD_LIMIT, upload_slots) if fn in UPLOADS
                                                             else (bodies.JSON_LIMIT, json_slots))),
                    methods=methods.split("|")) for methods, path, fn, auth in ROUTES]
    return endpoint.single_slashes(linkguard.link_guard(Starlette(routes=[*(extra_routes or []), *routes]), ctx))
