"""The SDK v1 run inside a job, online: what azureml-core's Run.get_context(), run.log / log_list /
log_row / log_table / log_image, tag and upload_file call from a rank with AZUREML_RUN_TOKEN, and
what Run.get_metrics() in the submitting process reads back.

Every route here is scoped "run" (calls.authorize): the run's own token opens the run it names
and nothing else, and only while that run is active; a workspace token opens any run. What a job
sends lands in its own run's record only (the v1 state's history, state/v1history.py): metrics as data, files
under checked names, through an upload URL signed for that one run.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from amlemu.service.protocol.calls import Call, Reply
from amlemu.service.state import ServiceError, bad_request

WS = ("/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.MachineLearningServices"
      "/workspaces/{ws}")
H = "/history/v1.0" + WS
M = "/metric/v2.0" + WS
A = "/artifact/v2.0" + WS + "/artifacts"
UPLOADS = "amlemu-run-uploads"  # the "container" of upload URLs (the first path segment: a blob host's URL)
TOKEN_SECONDS = 24 * 3600  # refreshed by the SDK while the run lasts; refused once it has ended anyway
MAX_METRICS_BODY = 64 * 1024 * 1024


def _v1(call: Call) -> Any:
    found = call.st.v1
    if found is None:
        raise ServiceError(501, "NotImplemented", "SDK v1 runs are not served by this service", target="v1")
    return found


def history(call: Call) -> Any:
    """The v1 state's run history (state/v1history.py): every call names a run that must exist."""
    return _v1(call).history


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(ts))


def run_by_id(call: Call) -> Reply:
    v1 = _v1(call)
    if call.method == "PATCH":
        patch(call, call.params["name"])
    return Reply(body=v1.run_by_experiment_id(call.params["expid"], call.params["name"]))


def patch(call: Call, run_id: str) -> None:
    """A run PATCH (Run.tag, set_tags, add_properties): its tags and properties are kept."""
    body = call.body if isinstance(call.body, dict) else {}
    history(call).update_properties(run_id, body.get("tags"), body.get("properties"))


def token(call: Call) -> Reply:
    """The SDK's refresh of AZUREML_RUN_TOKEN (shortly before it expires): a new token of the same run."""
    run_id = call.params["name"]
    _v1(call).run_dto(None, run_id)  # the run exists
    issued, expires = call.ctx.auth.issue_for_run(run_id, TOKEN_SECONDS)
    return Reply(body={"token": issued, "expiryTimeUtc": _iso(expires)})


def post_metrics(call: Call) -> Reply:
    """Run.log* through the metric service (BatchMetricV2Dto): every value as sent."""
    values = call.body.get("values") if isinstance(call.body, dict) else None
    if not isinstance(values, list) or len(call.raw) > MAX_METRICS_BODY:
        raise bad_request("values", "values: a metric batch is a JSON object with a list of metrics; send it "
                          "with azureml-core's Run.log")
    history(call).append_metrics(call.params["name"], [v for v in values if isinstance(v, dict)])
    return Reply(body={"errors": []})


def _metrics_by_name(call: Call) -> dict[str, dict[str, Any]]:
    """The run's metrics as the metric service returns them (MetricV2Dto): one per name, the
    values of every batch in the order they came."""
    run_id = call.params["name"]
    merged: dict[str, dict[str, Any]] = {}
    for metric in history(call).read_metrics(run_id):
        name = str(metric.get("name", ""))
        found = merged.setdefault(name, {"dataContainerId": f"dcid.{run_id}", "name": name, "columns": {},
                                         "value": [], "continuationToken": None,
                                         "properties": metric.get("properties") or {}})
        found["columns"].update(metric.get("columns") or {})
        found["value"] += [v for v in metric.get("value") or [] if isinstance(v, dict)]
    return merged


def list_metrics(call: Call) -> Reply:
    """The names of the run's metrics (Run.get_metrics in the submitter asks for each in turn)."""
    found = [{"metricKey": {"namespace": None, "name": n}, "columns": m["columns"]}
             for n, m in _metrics_by_name(call).items()]
    return Reply(body={"value": found, "continuationToken": None})


def full_metric(call: Call) -> Reply:
    name = call.body.get("metricName") if isinstance(call.body, dict) else None
    found = _metrics_by_name(call).get(str(name))
    if found is None:
        raise ServiceError(404, "ResourceNotFound", f"metric {name} was not found")
    return Reply(body=found)


def _upload_uri(call: Call, run_id: str, path: str) -> str:
    sig = call.ctx.auth.sign(f"upload/{run_id}")
    return f"{call.base}/{UPLOADS}/{run_id}/{path}?sv=2021-08-06&sr=b&sp=cw&sig={sig}"


def create_artifacts(call: Call) -> Reply:
    """Run.upload_file's first step: the artifacts it will write and, for each, the URL to write to."""
    run_id = call.params["container"].removeprefix("dcid.")
    _v1(call).run_dto(None, run_id)  # the run exists
    paths = call.body.get("paths") if isinstance(call.body, dict) else None
    if call.params["origin"] != "ExperimentRun" or not isinstance(paths, list):
        raise bad_request("paths", "paths: name the run's files to create (ExperimentRun artifacts)")
    artifacts, content = {}, {}
    for item in paths:
        path = str(item.get("path", "")) if isinstance(item, dict) else ""
        history(call).check_artifact(run_id, path)
        ids = {"origin": "ExperimentRun", "container": call.params["container"], "path": path}
        artifacts[path] = {"artifactId": f"ExperimentRun/{ids['container']}/{path}", **ids,
                           "etag": uuid.uuid4().hex, "createdTime": _iso(time.time())}
        content[path] = {"contentUri": _upload_uri(call, run_id, path), **ids}
    return Reply(body={"artifacts": artifacts, "artifactContentInformation": content, "errors": {}})


def upload(call: Call) -> Reply:
    """The upload URL create_artifacts handed out: Blob REST (a single put, or blocks and their
    list) into the run's record, for the one run its signature names."""
    run_id, path = call.params["name"], call.params["path"]
    ms = {"x-ms-request-id": str(uuid.uuid4()), "x-ms-version": "2021-08-06", "ETag": '"0x1"'}
    if not call.ctx.auth.check_signature(f"upload/{run_id}", call.query.get("sig")):
        return Reply(403, b"AuthenticationFailed", {**ms, "x-ms-error-code": "AuthenticationFailed"})
    if call.method != "PUT":  # the SDK checks the size it uploaded (a HEAD): the file as kept
        target = history(call).artifact(run_id, path)
        if target is None:
            return Reply(404, b"", {**ms, "x-ms-error-code": "BlobNotFound"})
        return Reply(200, target.read_bytes(), {**ms, "x-ms-blob-type": "BlockBlob",
                                                 "Content-Type": "application/octet-stream"})
    if not call.st.run_active(run_id):
        return Reply(403, b"AuthenticationFailed", {**ms, "x-ms-error-code": "AuthenticationFailed"})
    history(call).check_artifact(run_id, path)  # before a piece of it is staged
    data = call.ctx.blocks.upload(f"{UPLOADS}-{run_id}", path, call.query, call.raw, owner=run_id, active=call.st.run_active)
    if data is not None:
        history(call).write_artifact(run_id, path, data)
    return Reply(201, b"", ms)


ROUTES: list[tuple[str, str, Callable[[Call], Reply], bool | str]] = [
    ("GET|PATCH", H + "/experimentids/{expid}/runs/{name}", run_by_id, "run"),
    ("GET", H + "/experimentids/{expid}/runs/{name}/token", token, "run"),
    ("GET", H + "/experiments/{experiment}/runs/{name}/token", token, "run"),
    ("POST", M + "/runs/{name}/batch", post_metrics, "run"),
    ("POST", M + "/runs/{name}/list", list_metrics, "run"),
    ("POST", M + "/runs/{name}/full", full_metric, "run"),
    ("POST", A + "/batch/metadata/{origin}/{container}", create_artifacts, "run"),
    ("GET|HEAD|PUT", "/" + UPLOADS + "/{name}/{path:path}", upload, "upload"),  # signed for one run
]
