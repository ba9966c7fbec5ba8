"""Sweep jobs on the service's routes (issue 28): a job PUT of `jobType: Sweep` goes to the sweep's
submit, a job resource of a sweep shows it as a Sweep job with its results (state/sweepstate.py),
and run history's children of a run are a sweep's trials, as azure-ai-ml's
`jobs.list(parent_job_name=<sweep>)` reads them (GET .../runs/{runId}/children: a PaginatedRunList
of Run). A state with no emulator home behind it (the tests' double) has no sweeps: its job PUT
refuses them as it refuses any job type it does not run, its children route answers 501."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from amlemu.service.protocol.calls import Call, Reply, arm_error
from amlemu.service.state import sweeprest

WS = ("/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.MachineLearningServices"
      "/workspaces/{ws}")


def put_job(call: Call, name: str) -> dict[str, Any]:
    """A job PUT: a sweep's to its submit, any other to the state's."""
    sweeps = call.st.sweeps
    if sweeps is not None and sweeprest.is_sweep_body(call.body):
        return sweeps.put(name, call.body)
    return call.st.put_job(name, call.body)


def shown(call: Call, name: str, props: dict[str, Any]) -> dict[str, Any]:
    """A job's REST props as the resource shows them: a sweep's as a Sweep job, with its results."""
    sweeps = call.st.sweeps
    return props if sweeps is None else sweeps.properties(name, props)


def run_children(call: Call) -> Reply:
    sweeps = call.st.sweeps
    if sweeps is None:
        return arm_error(501, "NotImplemented", "this service keeps no child runs (sweep trials)")
    return Reply(body={"value": sweeps.children(call.params["name"]), "nextLink": None})


ROUTES: list[tuple[str, str, Callable[[Call], Reply], bool | str]] = [
    ("GET", "/history/v1.0" + WS + "/runs/{name}/children", run_children, True),
    ("GET", "/history/v1.0" + WS + "/experiments/{experiment}/runs/{name}/children", run_children, True),
]
