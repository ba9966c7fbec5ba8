"""The studio's pipeline page (issue 29): the graph's data (pipelinedata: layers, data edges, a failed,
a not-run and a reused step) as pure functions; the endpoint, the page and the overview on a home
laid out by hand (the pipeline's record, its steps' records, pipeline.json as its driver writes it:
fast, nothing runs); then, in headless chromium, a real 3-step pipeline on process nodes whose boxes
turn green step by step without a reload, a box's link opening its step's child job."""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import STARTUP, wait_until
from starlette.testclient import TestClient
from test_pipeline_job import step, write_pipeline
from test_studio import BASE, _text, chromium, logged_in, serving
from test_studio_sweep import walk_to

from amlemu.cluster.records import RunRecord
from amlemu.cluster.store import Store
from amlemu.home import Home
from amlemu.pipelines import graph
from amlemu.pipelines.pipelinespec import pipeline_from_dict
from amlemu.pipelines.submit import write_steps
from amlemu.specs import ClusterSpec, Priority, RunStatus
from amlemu.storage.datastores import DatastoreSpec
from amlemu.studio.app import standalone_app
from amlemu.studio.gate import home_key, login_url
from amlemu.studio.pipelinedata import edges, layers, pipeline_view

SCRIPT = "<script>window.pwned = 1</script>"
ENV = "azureml:AzureML-sklearn-1.5@latest"


def inline(command: str, **inputs: str) -> dict:
    return {"command": command, "environment": ENV, "inputs": inputs, "outputs": {"out": {"type": "uri_folder"}}}


def bound(step_name: str, output: str = "out") -> str:
    return f"${{{{parent.jobs.{step_name}.outputs.{output}}}}}"


# a diamond (prep -> left, right -> join), an independent step, and a step reading two outputs of one step
YAML = {"type": "pipeline", "settings": {"default_compute": "azureml:c1", "continue_on_step_failure": True},
        "inputs": {"greeting": "hi"},
        "jobs": {"prep": inline("echo prep", text="${{parent.inputs.greeting}}"),
                 "alone": inline("echo alone"),
                 "right": inline("echo right", data=bound("prep")),
                 "left": inline("echo left", data=bound("prep"), alone=bound("alone")),
                 "join": inline("echo join", a=bound("left"), b=bound("right"), c=bound("left"))}}


def record(job: dict, status: RunStatus, run_id: str = "p", parent: str | None = None) -> RunRecord:
    return RunRecord(run_id, 1, "exp", "c1", status, job, 0.0, parent=parent)


def test_the_edges_are_the_bindings_graph_dependencies_follows_labelled_output_to_input(tmp_path: Path) -> None:
    found = edges(YAML)
    assert [(e["from"], e["output"], e["to"], e["input"]) for e in found] == [
        ("prep", "out", "right", "data"), ("prep", "out", "left", "data"), ("alone", "out", "left", "alone"),
        ("left", "out", "join", "a"), ("right", "out", "join", "b"), ("left", "out", "join", "c")]
    spec = pipeline_from_dict(YAML, base_dir=tmp_path)
    drawn = {name: {e["from"] for e in found if e["to"] == name} for name in spec.steps}
    assert drawn == {name: set(ups) for name, ups in graph.dependencies(spec).items()}
    hostile = {"jobs": {"a": {"inputs": {"x": "${{parent.jobs.nope.outputs.o}}", "y": "${{parent.outputs.z}}",
                                         "z": "${{parent.jobs.a.outputs.o}}"}}, "b": "not a mapping"}}
    assert edges(hostile) == [] and edges("not a pipeline") == [] and edges({"jobs": ["a"]}) == []


def test_layers_go_left_to_right_by_depth_in_the_order_that_crosses_fewest_edges() -> None:
    assert layers(list(YAML["jobs"]), edges(YAML)) == [["prep", "alone"], ["right", "left"], ["join"]]
    crossed = [{"from": "x", "to": "q"}, {"from": "y", "to": "p"}]  # p reads y (row 1), q reads x (row 0)
    assert layers(["x", "y", "p", "q"], crossed) == [["x", "y"], ["q", "p"]]
    assert layers(["a", "b", "c"], [{"from": "a", "to": "c"}, {"from": "b", "to": "c"}, {"from": "a", "to": "b"}]) == \
        [["a"], ["b"], ["c"]]  # c one column right of the deepest step it reads
    cycle = [{"from": "a", "to": "b"}, {"from": "b", "to": "a"}]
    assert layers(["z", "a", "b"], cycle) == [["z"], ["a", "b"]]  # refused at submit; never hides a step
    assert layers([], []) == []


def test_a_failed_a_not_run_a_reused_and_a_just_started_step() -> None:
    shown = {"continue_on_step_failure": True, "steps": [
        {"step": "prep", "child_job": "p_prep", "status": "Running", "detail": ""},  # the record is fresher
        {"step": "alone", "child_job": "p_alone", "status": "Completed", "detail": "", "reused_from": "old_alone"},
        {"step": "right", "child_job": "p_right", "status": "Failed", "detail": ""},
        {"step": "left", "child_job": None, "status": "NotStarted", "detail": ""},  # submitted after the last write
        {"step": "join", "child_job": None, "status": "NotStarted", "detail": "not run: step right Failed"}]}
    children = [record({}, RunStatus.COMPLETED, "p_prep", "p"), record({}, RunStatus.COMPLETED, "p_alone", "p"),
                record({}, RunStatus.FAILED, "p_right", "p"), record({}, RunStatus.QUEUED, "p_left", "p")]
    view = pipeline_view(record({"kind": "pipeline", "pipeline": {"yaml": YAML}}, RunStatus.RUNNING), shown, children)
    rows = [(s["step"], s["child_job"], s["status"], s["reused_from"], s["not_run"]) for s in view["steps"]]
    assert rows == [("prep", "p_prep", "Completed", None, False), ("alone", "p_alone", "Completed", "old_alone", False),
                    ("right", "p_right", "Failed", None, False), ("left", "p_left", "Queued", None, False),
                    ("join", None, "NotStarted", None, True)]
    assert view["steps"][-1]["detail"] == "not run: step right Failed"
    assert view["counts"] == {"Completed": 2, "Failed": 1, "Queued": 1, "NotStarted": 1}
    assert view["layers"] == [["prep", "alone"], ["right", "left"], ["join"]] and len(view["edges"]) == 6
    assert view["continue_on_step_failure"] is True
    # before the driver's first write, and once the pipeline ended with a step never started
    early = pipeline_view(record({"kind": "pipeline", "pipeline": {"yaml": YAML}}, RunStatus.QUEUED), None, [])
    assert {s["status"] for s in early["steps"]} == {"NotStarted"} and not any(s["not_run"] for s in early["steps"])
    ended = pipeline_view(record({"kind": "pipeline", "pipeline": {"yaml": YAML}}, RunStatus.CANCELED), None, [])
    assert all(s["not_run"] for s in ended["steps"])
    broken = pipeline_view(record({"kind": "pipeline", "pipeline": "?"}, RunStatus.FAILED), {"steps": [{"x": 1}]}, [])
    assert (broken["steps"], broken["edges"], broken["layers"]) == ([], [], [])


# --- the endpoint and pages on a home laid out by hand ------------------------------------------
@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """c1, a command job r1 and the pipeline p (steps as in the unit test, one step named in HTML)."""
    home = Home.at(tmp_path_factory.mktemp("studio-pipeline") / "home")
    store = Store(home.db)
    store.add_cluster(ClusterSpec("c1", "STANDARD_D2_V2", Priority.LOW_PRIORITY, max_nodes=2), "process")
    store.add_run("r1", "exp", "c1", {"command": "python plain.py", "instance_count": 1})
    tune = {"type": "sweep", "trial": "./train.yml", "inputs": {"data": bound("prep")}}  # a sweep step
    yaml = {**YAML, "jobs": {**YAML["jobs"], "right": inline(SCRIPT, data=bound("prep")), "tune": tune}}
    store.add_run("p", "exp", "c1", {"command": "", "instance_count": 1, "kind": "pipeline", "display_name": "pipe",
                                     "pipeline": {"yaml": yaml, "base_dir": "/nowhere"}})
    walk_to(store, "p", RunStatus.RUNNING)
    for name, status in (("prep", RunStatus.COMPLETED), ("right", RunStatus.RUNNING), ("tune", RunStatus.RUNNING)):
        kind = {"kind": "sweep"} if name == "tune" else {}
        store.add_run(f"p_{name}", "exp", "c1", {"command": "echo", "display_name": name, **kind}, parent="p")
        walk_to(store, f"p_{name}", status)
    store.close()
    write_steps(home.run_dir("p"), {"continue_on_step_failure": True, "steps": [
        {"step": "prep", "child_job": "p_prep", "status": "Completed", "detail": ""},
        {"step": "right", "child_job": "p_right", "status": "Running", "detail": SCRIPT}]})
    key = home_key(home.root)
    with TestClient(standalone_app(home, key), base_url=BASE) as test_client:
        yield logged_in(test_client, key)


def test_the_pipeline_endpoint_and_page_show_its_steps_and_escape_what_the_user_wrote(client: TestClient) -> None:
    data = client.get("/studio/api/pipelines/p").json()
    assert (data["type"], data["status"], data["terminal"]) == ("pipeline", "Running", False)
    assert [(s["step"], s["type"], s["status"]) for s in data["steps"]] == [
        ("prep", "command", "Completed"), ("alone", "command", "NotStarted"), ("right", "command", "Running"),
        ("left", "command", "NotStarted"), ("join", "command", "NotStarted"), ("tune", "sweep", "Running")]
    assert data["layers"] == [["prep", "alone"], ["right", "tune", "left"], ["join"]]  # tune reads row 0 only
    assert client.get("/studio/api/pipelines/r1").status_code == 404
    assert "r1 is a command job" in client.get("/studio/api/pipelines/r1").json()["error"]["message"]
    page = client.get("/studio/jobs/p")
    assert page.status_code == 200 and 'data-page="pipeline"' in page.text and 'id="pipeline-graph"' in page.text
    assert SCRIPT not in page.text and "&lt;script&gt;window.pwned = 1&lt;/script&gt;" in page.text
    assert re.findall(r"<script[^>]*>", page.text) == ['<script src="/studio/static/studio.js">']
    assert re.search(r'<tr data-step="prep"><td>prep</td><td><a href="/studio/jobs/p_prep">p_prep</a></td>', page.text)
    back = '<dt>step of pipeline</dt><dd id="parent"><a href="/studio/jobs/p">p</a></dd>'
    assert back in client.get("/studio/jobs/p_right").text  # a step's child job links back to its pipeline
    assert back in client.get("/studio/jobs/p_tune").text  # a sweep step's page too
    overview = client.get("/studio/api/overview").json()
    assert [(j["id"], j["type"], [t["id"] for t in j["trials"]]) for j in overview["jobs"]] == [
        ("p", "pipeline", ["p_prep", "p_right", "p_tune"]), ("r1", "command", [])]
    assert re.search(r'<a href="/studio/jobs/p_prep">p_prep</a></td><td>step</td>', client.get("/studio/").text)


# --- in a real browser ---------------------------------------------------------------------------
CHAIN = ("first:\n" + step("prepare ${{outputs.data}} hi 0", "  outputs: {data: {type: uri_folder}}\n")
         + "middle:\n" + step("train ${{inputs.data}} ${{outputs.model}}",
                              "  inputs: {data: '${{parent.jobs.first.outputs.data}}'}\n"
                              "  outputs: {model: {type: uri_folder}}\n")
         + "last:\n" + step("eval ${{inputs.model}}", "  inputs: {model: '${{parent.jobs.middle.outputs.model}}'}\n"))
BOXES = "return [...document.querySelectorAll('#pipeline-graph g.step')].map(g => [g.dataset.step, g.dataset.status])"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_the_pipeline_page_turns_its_boxes_green_step_by_step(emu, cluster, tmp_path: Path) -> None:
    cluster(idle_seconds_before_scaledown=60)  # a node kept for the next step
    emu.datastores.create(DatastoreSpec("steps", "local", folder=str(tmp_path / "steps")))  # no Azurite to start
    path = write_pipeline(tmp_path / "pipe", ", default_datastore: azureml:steps", CHAIN)
    src = path.parent / "src" / "step.py"  # the middle and last steps take ~2 s each: the page, polling
    for what in ("train", "eval"):         # once a second, sees each run and each green alone
        src.write_text(src.read_text().replace(f'elif what == "{what}":', f'elif what == "{what}":\n    time.sleep(2)'))
    key = home_key(emu.home.root)
    seen: list[dict[str, str]] = []

    def boxes() -> dict[str, str]:
        shown = dict(driver.execute_script(BOXES) or [])
        if shown and (not seen or seen[-1] != shown):
            seen.append(shown)
        return shown

    with serving(standalone_app(emu.home, key)) as url, chromium(tmp_path / "chromium") as driver:
        run = emu.submit(path)
        driver.get(login_url(key, url, f"/studio/jobs/{run.id}"))
        wait_until(lambda: list(boxes()) == ["first", "middle", "last"], 30, "the three boxes drawn")
        driver.execute_script("window.sameDocument = true")  # a reload would lose it
        arrows = driver.execute_script("return [...document.querySelectorAll('#pipeline-graph text.edge-label')]"
                                       ".map(t => [t.dataset.from, t.dataset.to, t.textContent])")
        assert arrows == [["first", "middle", "data \u2192 data"], ["middle", "last", "model \u2192 model"]]
        wait_until(lambda: boxes().get("middle") == "Running", STARTUP, "the middle step's box Running")
        assert boxes()["first"] == "Completed" and boxes()["last"] == "NotStarted"
        wait_until(lambda: set(boxes().values()) == {"Completed"}, STARTUP, "every box Completed")
        wait_until(lambda: _text(driver, "#status") == "Completed" and _text(driver, "#live") == "final", 30,
                   "the pipeline Completed, the page final")
        assert driver.execute_script("return window.sameDocument") is True
        greens = [tuple(s for s, status in shown.items() if status == "Completed") for shown in seen]
        assert all(g == ("first", "middle", "last")[:len(g)] for g in greens), seen  # in the graph's order
        assert ("first",) in greens and ("first", "middle") in greens, seen  # one at a time
        colour = driver.execute_script("return getComputedStyle(document.querySelector("
                                       "'#pipeline-graph g[data-step=\"middle\"] rect.box')).fill")
        assert colour == "rgb(200, 230, 201)"  # the stylesheet's green
        link = driver.find_element("css selector", '#pipeline-graph g[data-step="middle"] a.child-link')
        link.click()
        wait_until(lambda: _text(driver, "h1").startswith(f"Job {run.id}_middle"), 30, "the middle step's own page")
        assert "step of pipeline" in _text(driver, "dl.facts") and _text(driver, "#status") == "Completed"
    assert run.wait(timeout=STARTUP) is RunStatus.COMPLETED
    assert json.loads((run.dir / "pipeline.json").read_text())["steps"][1]["child_job"] == f"{run.id}_middle"
