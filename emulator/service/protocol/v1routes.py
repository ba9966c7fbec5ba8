"""The protocol of the SDK v1 (azureml-core), beside the v2 routes (routes.py): the ARM call it
makes before any workspace call (the subscriptions its token reaches), experiments, run history
(runs, their listing and patches), the snapshot (content) service and the execution service's
`startrun`.

Same rules as routes.py: a handler is a function of a Call returning a Reply; the state is the
emulator's (emuv1.py, `state.v1`): a state without it (the tests' double) answers 501.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from amlemu.service.protocol import v1online
from amlemu.service.protocol.v1online import _v1
from amlemu.service.protocol import v1widget
from amlemu.service.protocol.auth import TENANT
from amlemu.service.protocol.calls import Call, Reply
from amlemu.service.protocol.datablobs import account_name
from amlemu.service.state import ServiceError, bad_request

WS = ("/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.MachineLearningServices"
      "/workspaces/{ws}")
H = "/history/v1.0" + WS
A = "/artifact/v2.0" + WS + "/artifacts"
EMPTY_TREE: dict[str, Any] = {}  # a workspace whose latest snapshot holds nothing: the SDK sends every file



def subscriptions(call: Call) -> Reply:
    sub = call.st.workspace.subscription_id
    return Reply(body={"value": [{"id": f"/subscriptions/{sub}", "subscriptionId": sub, "tenantId": TENANT,
                                  "displayName": "amlemu", "state": "Enabled"}]})


def experiment(call: Call) -> Reply:
    name = call.params["experiment"]
    if call.method == "POST":
        return Reply(body=_v1(call).create_experiment(name))
    return Reply(body=_v1(call).get_experiment(name))


def _page(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"value": items, "continuationToken": None, "nextLink": None}


def experiment_query(call: Call) -> Reply:
    return Reply(body=_page(_v1(call).experiments()))


def _linked(call: Call, dto: dict[str, Any]) -> dict[str, Any]:
    """A run as the SDK reads it, with the URL its Run.cancel() posts to."""
    ws = call.st.workspace
    scope = f"/subscriptions/{ws.subscription_id}/resourceGroups/{ws.resource_group}/providers/" \
            f"Microsoft.MachineLearningServices/workspaces/{ws.workspace_name}"
    return {**dto, "cancelUri": f"{call.base}/execution/v1.0{scope}/experiments/{call.params['experiment']}"
                                f"/runId/{dto['runId']}/cancel"}


def run(call: Call) -> Reply:
    if call.method == "PATCH":  # Run.tag, add_properties (and the git details the submit adds)
        v1online.patch(call, call.params["name"])
    return Reply(body=_linked(call, _v1(call).run_dto(call.params["experiment"], call.params["name"])))


def run_query(call: Call) -> Reply:
    return Reply(body=_page([_linked(call, dto) for dto in _v1(call).runs(call.params["experiment"])]))


def metrics_ingested(call: Call) -> Reply:
    # Run.cancel() and flush() wait for the metrics the client sent: the service keeps them as
    # they come (v1online.post_metrics), so they are in already.
    _v1(call).run_dto(call.params["experiment"], call.params["name"])
    return Reply(body={})


def run_cancel(call: Call) -> Reply:
    _v1(call).run_dto(call.params["experiment"], call.params["name"])
    call.st.cancel_job(call.params["name"])
    return Reply(body={})


def snapshot_latest(call: Call) -> Reply:
    # A startrun's code travels in its zip; a snapshot (HyperDrive's) is made by hyperdriveroutes.py.
    return Reply(body={"id": None, "root": EMPTY_TREE})


def _multipart(call: Call) -> dict[str, bytes]:
    kind = call.headers.get("content-type", "")
    if not kind.startswith("multipart/form-data"):
        raise bad_request("body", "body: startrun takes multipart/form-data (runDefinitionFile, projectZipFile)")
    message = BytesParser(policy=HTTP).parsebytes(f"Content-Type: {kind}\r\n\r\n".encode() + call.raw)
    parts: dict[str, bytes] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            parts[name] = part.get_payload(decode=True) or b""
    return parts


def start_run(call: Call) -> Reply:
    run_id = call.query.get("runId", "")
    if not run_id:
        raise bad_request("runId", "runId: missing; submit with azureml-core's Experiment.submit")
    parts = _multipart(call)
    try:
        definition = json.loads(parts.get("runDefinitionFile", b"null"))
    except ValueError:
        raise bad_request("runDefinitionFile", "runDefinitionFile: not JSON") from None
    return Reply(body=_v1(call).start_run(call.params["experiment"], run_id, definition,
                                          parts.get("projectZipFile")))


# --- a run's files (artifacts): its folder as `amlemu job download` copies it ----------------------
def _run_files(call: Call, prefix: str = "") -> tuple[str, list[str]]:
    """(run id, paths in the run's container under `prefix`)."""
    container = call.params["container"]
    if call.params["origin"] != "ExperimentRun" or not container.startswith("dcid."):
        raise ServiceError(404, "ResourceNotFound", f"artifact container {call.params['origin']}/{container} "
                           "was not found")
    run_id = container.removeprefix("dcid.")
    _v1(call).run_dto(None, run_id)  # the run exists
    head = f"ExperimentRun/{container}/"
    listed = call.st.list_blobs("azureml", head + prefix)
    return run_id, [name.removeprefix(head) for name, _ in listed]


def _content_info(call: Call, run_id: str, path: str) -> dict[str, Any]:
    signed = call.ctx.auth.sign_until(f"logs/{run_id}")  # the signed log route serves the run's files
    return {"contentUri": f"{call.base}/logs/{run_id}/{path}?{signed}", "origin": call.params["origin"],
            "container": call.params["container"], "path": path}


def artifact_list(call: Call) -> Reply:
    run_id, paths = _run_files(call)
    return Reply(body={"value": [{"artifactId": f"{call.params['origin']}/{call.params['container']}/{p}",
                                  "origin": call.params["origin"], "container": call.params["container"],
                                  "path": p} for p in paths], "continuationToken": None})


def artifact_prefix(call: Call) -> Reply:
    run_id, paths = _run_files(call, call.params.get("path", ""))
    return Reply(body={"value": [_content_info(call, run_id, p) for p in paths], "continuationToken": None})


def artifact_content_info(call: Call) -> Reply:
    run_id, paths = _run_files(call, call.params["path"])
    if call.params["path"] not in paths:
        raise ServiceError(404, "ResourceNotFound", f"artifact {call.params['path']} was not found")
    return Reply(body=_content_info(call, run_id, call.params["path"]))


DEFAULT_DATASTORE = "workspaceblobstore"  # the workspace's default, as on Azure ML


def _datastore_dtos(call: Call) -> list[dict[str, Any]]:
    """The workspace's datastores as v1's DataStoreDto; no credential is handed out."""
    return [{"name": name, "dataStoreType": "AzureBlob", "hasBeenValidated": True, "tags": {},
             "isDefault": name == DEFAULT_DATASTORE,
             "azureStorageSection": {"accountName": account_name(call.base), "containerName": props["containerName"],
                                     "endpoint": "core.windows.net", "protocol": "https", "credentialType": "None",
                                     "subscriptionId": call.st.workspace.subscription_id,
                                     "resourceGroup": call.st.workspace.resource_group}}
            for name, props in call.st.list_datastores()]


def datastore_list(call: Call) -> Reply:
    return Reply(body={"value": _datastore_dtos(call), "continuationToken": None})


def datastore_get(call: Call) -> Reply:
    """One datastore (`Datastore.get`), or the default one (`ws.get_default_datastore()`)."""
    name = call.params.get("name", DEFAULT_DATASTORE)
    for dto in _datastore_dtos(call):
        if dto["name"] == name:
            return Reply(body=dto)
    raise ServiceError(404, "UserError", f"datastore {name} was not found; `amlemu datastore list` names them")


def no_snapshot_run(call: Call) -> Reply:
    raise bad_request("AML_FORCE_EXECUTE_WITH_ZIP", "a v1 run sent as a snapshot is not served; set "
                      "AML_FORCE_EXECUTE_WITH_ZIP=true (`amlemu env` prints it) to send the code with the run")


ROUTES: list[tuple[str, str, Callable[[Call], Reply], bool | str]] = [
    *v1online.ROUTES,
    *v1widget.ROUTES,
    ("GET", "/subscriptions", subscriptions, True),
    ("POST", H + "/experiments:query", experiment_query, True),
    ("GET|POST", H + "/experiments/{experiment}", experiment, True),
    ("GET|PATCH", H + "/experiments/{experiment}/runs/{name}", run, "run"),
    ("POST", H + "/experiments/{experiment}/runs:query", run_query, True),
    ("GET", H + "/experiments/{experiment}/runs/{name}/metricsingest/wait", metrics_ingested, "run"),
    ("GET", "/content/v1.0" + WS + "/snapshots/latest/metadata", snapshot_latest, True),
    ("POST", "/execution/v1.0" + WS + "/experiments/{experiment}/startrun", start_run, True),
    ("POST", "/execution/v1.0" + WS + "/experiments/{experiment}/snapshotrun", no_snapshot_run, True),
    ("POST", "/execution/v1.0" + WS + "/experiments/{experiment}/runId/{name}/cancel", run_cancel, "run"),
    ("GET", "/datastore/v1.0" + WS + "/datastores", datastore_list, True),
    ("GET", "/datastore/v1.0" + WS + "/datastores/{name}", datastore_get, True),
    ("GET", "/datastore/v1.0" + WS + "/default", datastore_get, True),
    ("GET", A + "/{origin}/{container}", artifact_list, "run"),
    ("GET", A + "/prefix/contentinfo/{origin}/{container}", artifact_prefix, "run"),
    ("GET", A + "/prefix/contentinfo/{origin}/{container}/{path:path}", artifact_prefix, "run"),
    ("GET", A + "/contentinfo/{origin}/{container}/{path:path}", artifact_content_info, "run"),
]
