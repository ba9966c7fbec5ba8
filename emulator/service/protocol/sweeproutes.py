"""Run history's children of a run: a sweep's trials, as azure-ai-ml's
`jobs.list(parent_job_name=<sweep>)` reads them (GET .../runs/{runId}/children, a PaginatedRunList
of Run). A state without sweeps (the tests' double) answers 501 naming what is not served."""
from __future__ import annotations

from collections.abc import Callable

from amlemu.service.protocol.calls import Call, Reply, arm_error

WS = ("/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.MachineLearningServices"
      "/workspaces/{ws}")


def run_children(call: Call) -> Reply:
    sweeps = getattr(call.st, "sweeps", None)
    if sweeps is None:
        return arm_error(501, "NotImplemented", "this service keeps no child runs (sweep trials)")
    return Reply(body={"value": sweeps.children(call.params["name"]), "nextLink": None})


ROUTES: list[tuple[str, str, Callable[[Call], Reply], bool | str]] = [
    ("GET", "/history/v1.0" + WS + "/runs/{name}/children", run_children, True),
    ("GET", "/history/v1.0" + WS + "/experiments/{experiment}/runs/{name}/children", run_children, True),
]
