"""The studio's sweep page (issue 28): the data endpoint, the overview listing a sweep with its trials
under it, and the page escaping what the sweep's user wrote, on a home laid out by hand (the sweep's
record and its trials' records in the store, sweep.json as the driver writes it: fast, nothing runs);
then the page in headless chromium following sweep.json as it changes, without a reload."""
from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_until
from starlette.testclient import TestClient
from test_studio import BASE, _text, chromium, logged_in, serving

from amlemu.cluster.store import Store
from amlemu.home import Home
from amlemu.specs import ClusterSpec, Priority, RunStatus
from amlemu.studio.app import standalone_app
from amlemu.studio.gate import home_key, login_url
from amlemu.studio.sweepdata import flat_values, param_names
from amlemu.sweeps import results
from amlemu.sweeps.results import Trial
from amlemu.sweeps.sweepspec import SweepSpec, sweep_from_dict, sweep_to_record

SCRIPT = "<script>window.pwned = 1</script>"
SWEEP = {  # a user's sweep: a choice value that is HTML, a conditional choice, a loguniform rate
    "type": "sweep", "name": "sw", "experiment_name": "exp", "compute": "azureml:c1",
    "trial": {"code": "src", "command": "python train.py --lr ${{search_space.lr}} --opt ${{search_space.opt}}",
              "environment": "azureml:AzureML-sklearn-1.5@latest"},
    "search_space": {"lr": {"type": "loguniform", "min_value": -9, "max_value": -1},
                     "opt": {"type": "choice", "values": ["sgd", SCRIPT]},
                     "model": {"type": "choice", "values": [{"kind": "cnn", "layers": {"type": "randint", "upper": 4}},
                                                            {"kind": "mlp"}]}},
    "sampling_algorithm": "random", "objective": {"goal": "minimize", "primary_metric": "loss"},
    "limits": {"max_total_trials": 6, "max_concurrent_trials": 2},
    "early_termination": {"type": "bandit", "slack_factor": 0.1}}
TRIALS = [  # name, values, status, primary-metric reports, other metric names, the policy's reason
    ("sw_0", {"lr": 0.01, "opt": "sgd", "model": {"kind": "cnn", "layers": 2}}, RunStatus.COMPLETED, [0.9, 0.5], [], None),
    ("sw_1", {"lr": 0.0002, "opt": SCRIPT, "model": {"kind": "mlp"}}, RunStatus.CANCELED, [2.0], [],
     "early termination: bandit: 2 is worse than 0.55 (best 0.5, slack_factor 0.1)"),
    ("sw_2", {"lr": 0.1, "opt": "sgd", "model": {"kind": "mlp"}}, RunStatus.COMPLETED, [], ["acc"], None),
    ("sw_3", {"lr": 0.05, "opt": "sgd", "model": {"kind": "cnn", "layers": 0}}, RunStatus.COMPLETED,
     [float("nan")], [], None),
]


def make_sweep(root: Path, trials: list[tuple], sweep_status: RunStatus) -> tuple[Home, SweepSpec]:
    """A home with c1, a command job r1, the sweep `sw` in `sweep_status`, its trials' records and its
    sweep.json (results.summarize, as the driver writes it)."""
    (root / "src").mkdir(parents=True)
    (root / "src" / "train.py").write_text("print('train')\n")
    spec = sweep_from_dict(SWEEP, base_dir=root)
    home = Home.at(root / "home")
    store = Store(home.db)
    store.add_cluster(ClusterSpec("c1", "STANDARD_D2_V2", Priority.LOW_PRIORITY, max_nodes=2), "process")
    store.add_run("r1", "exp", "c1", {"command": "python plain.py", "instance_count": 1})
    store.add_run("sw", "exp", "c1", sweep_to_record(spec, "sw", None))
    walk_to(store, "sw", RunStatus.RUNNING)
    store.close()
    set_trials(home, spec, trials)
    if sweep_status.is_terminal:
        finish(home, sweep_status)
    return home, spec


def set_trials(home: Home, spec: SweepSpec, trials: list[tuple]) -> None:
    """The trials' records (new ones added, each one's status set) and sweep.json, as the driver
    leaves them after a look."""
    store = Store(home.db)
    try:
        for name, _values, status, *_ in trials:
            if name not in {r.id for r in store.runs(parent="sw")}:
                store.add_run(name, "exp", "c1", {"command": "python train.py", "display_name": name}, parent="sw")
            walk_to(store, name, status)
    finally:
        store.close()
    made = [Trial(name, values, status, list(points), sorted({*logged, *(["loss"] if points else [])}), reason)
            for name, values, status, points, logged, reason in trials]
    results.write(home.run_dir("sw"), results.summarize(spec, made))


START = (RunStatus.QUEUED, RunStatus.PREPARING, RunStatus.RUNNING)
PATHS = {RunStatus.RUNNING: START, RunStatus.COMPLETED: (*START, RunStatus.FINALIZING, RunStatus.COMPLETED),
         RunStatus.CANCELED: (*START, RunStatus.CANCEL_REQUESTED, RunStatus.CANCELED)}


def walk_to(store: Store, run_id: str, status: RunStatus) -> None:
    """`run_id` on to `status` the way a run gets there."""
    path = PATHS[status]
    current = store.run(run_id).status
    for step in path[path.index(current) + 1 if current in path else 0:]:
        store.set_status(run_id, step, f"to {step.value}")


def finish(home: Home, status: RunStatus) -> None:
    store = Store(home.db)
    try:
        walk_to(store, "sw", status)
    finally:
        store.close()


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    home, _ = make_sweep(tmp_path_factory.mktemp("studio-sweep"), TRIALS, RunStatus.COMPLETED)
    key = home_key(home.root)
    with TestClient(standalone_app(home, key), base_url=BASE) as test_client:
        yield logged_in(test_client, key)


def test_a_conditional_choice_is_a_column_per_key_in_the_search_spaces_order() -> None:
    flat = flat_values({"opt": "sgd", "model": {"kind": "cnn", "layers": 2}, "lr": float("nan")})
    assert flat == {"opt": "sgd", "model.kind": "cnn", "model.layers": 2, "lr": None}
    assert param_names({"lr": {}, "model": {}, "opt": {}}, [{"values": flat}, {"values": {"extra": 1}}]) == \
        ["lr", "model.kind", "model.layers", "opt", "extra"]


def test_the_sweep_endpoint_has_its_trials_the_best_one_the_policys_reason_and_the_notes(client: TestClient) -> None:
    data = client.get("/studio/api/sweeps/sw").json()
    assert (data["type"], data["status"], data["terminal"]) == ("sweep", "Completed", True)
    assert (data["primary_metric"], data["goal"], data["sampling"], data["early_termination"]) == \
        ("loss", "minimize", "random", "bandit")
    assert (data["max_total_trials"], data["max_concurrent_trials"]) == (6, 2)
    assert data["params"] == ["lr", "opt", "model.kind", "model.layers"]
    assert data["best_child_run_id"] == "sw_0" and data["score"] == 0.5
    rows = [(t["name"], t["status"], t["metric"], t["reports"], t["best"]) for t in data["trials"]]
    assert rows == [("sw_0", "Completed", 0.5, 2, True), ("sw_1", "Canceled", 2.0, 1, False),
                    ("sw_2", "Completed", None, 0, False), ("sw_3", "Completed", None, 1, False)]  # NaN: null
    assert data["trials"][1]["values"] == {"lr": 0.0002, "opt": SCRIPT, "model.kind": "mlp"}
    assert data["trials"][1]["reason"].startswith("early termination: bandit")
    assert data["trials"][0]["values"]["model.layers"] == 2
    [note] = data["notes"]  # sw_2 never logged loss: named, with what it did log
    assert "sw_2" in note and "'loss'" in note and "acc" in note
    assert data["headline"].startswith("4 trial(s)") and "best sw_0" in data["headline"]
    assert "azureml-logs/hyperdrive.txt" not in {f["path"] for f in data["files"]}  # none written by hand
    plain = client.get("/studio/api/sweeps/r1")
    assert plain.status_code == 404 and "r1 is a command job" in plain.json()["error"]["message"]
    assert client.get("/studio/api/sweeps/nope").status_code == 404
    with TestClient(client.app, base_url=BASE) as stranger:  # the studio's gate: no session, no data
        assert stranger.get("/studio/api/sweeps/sw").status_code == 401


def test_the_overview_lists_a_sweep_as_a_sweep_with_its_trials_under_it(client: TestClient) -> None:
    data = client.get("/studio/api/overview").json()
    assert [(j["id"], j["type"]) for j in data["jobs"]] == [("sw", "sweep"), ("r1", "command")]  # no trial among them
    assert data["jobs_total"] == 2
    sweep = data["jobs"][0]
    assert [t["id"] for t in sweep["trials"]] == ["sw_0", "sw_1", "sw_2", "sw_3"] and sweep["trials_total"] == 4
    assert all(t["parent"] == "sw" for t in sweep["trials"]) and data["jobs"][1]["trials"] == []
    page = client.get("/studio/").text
    assert re.search(r'<tr><td><a href="/studio/jobs/sw">sw</a></td><td>sweep</td>', page)
    assert re.search(r'<tr class="trial"><td><span class="nest">.*?</span><a href="/studio/jobs/sw_1">sw_1</a></td>'
                     r'<td>trial</td>', page)
    trial = client.get("/studio/jobs/sw_1").text  # a trial's own page links back to its sweep
    assert '<dt>trial of sweep</dt><dd id="parent"><a href="/studio/jobs/sw">sw</a></dd>' in trial


def test_the_sweep_page_escapes_a_choice_value_and_marks_the_best_trial(client: TestClient) -> None:
    page = client.get("/studio/jobs/sw")
    assert page.status_code == 200 and 'data-page="sweep"' in page.text
    assert "&lt;script&gt;window.pwned = 1&lt;/script&gt;" in page.text and SCRIPT not in page.text
    assert re.findall(r"<script[^>]*>", page.text) == ['<script src="/studio/static/studio.js">']
    assert "script-src 'self'" in page.headers["content-security-policy"]
    heads = re.search(r'<table id="trials"><thead><tr>(.*?)</tr>', page.text).group(1)
    assert re.findall(r"<th>(.*?)</th>", heads) == ["trial", "status", "lr", "opt", "model.kind", "model.layers",
                                                    "loss", "reports", "reason"]
    best = re.search(r'<tr class="best" data-trial="sw_0">(.*?)</tr>', page.text).group(1)
    assert 'class="best-mark">best' in best and "<td>0.5</td>" in best
    assert "<td>early termination: bandit: 2 is worse than 0.55" in page.text
    assert re.search(r'<ul id="notes" class="notes"><li>trial sw_2 completed without logging', page.text)


# --- in a real browser ---------------------------------------------------------------------------
@pytest.mark.slow
def test_the_sweep_page_draws_the_table_and_chart_and_follows_sweep_json(tmp_path: Path) -> None:
    home, spec = make_sweep(tmp_path, TRIALS[:2], RunStatus.RUNNING)
    key = home_key(home.root)
    chart_lines = "return [...document.querySelectorAll('#sweep-chart polyline')].map(p => p.dataset.trial)"
    rows = "return [...document.querySelectorAll('#trials tbody tr')].map(r => r.dataset.trial)"
    with serving(standalone_app(home, key)) as url, chromium(tmp_path / "chromium") as driver:
        driver.get(login_url(key, url, "/studio/jobs/sw"))
        wait_until(lambda: driver.execute_script(chart_lines) == ["sw_1", "sw_0"], 20,
                   "the chart's lines, the best one drawn last")  # on top
        driver.execute_script("window.sameDocument = true")  # a reload would lose it
        assert driver.execute_script(rows) == ["sw_0", "sw_1"]
        assert SCRIPT in _text(driver, '#trials tr[data-trial="sw_1"]')  # the choice value, as text ...
        assert SCRIPT in _text(driver, "#sweep-chart")  # ... on its axis too
        assert driver.execute_script("return window.pwned") is None  # ... never run
        axes = driver.execute_script("return [...document.querySelectorAll('#sweep-chart text.axis-name')]"
                                     ".map(t => t.textContent)")
        assert axes == ["lr", "opt", "model.kind", "model.layers", "loss (minimize)"]
        assert "best" in _text(driver, '#trials tr[data-trial="sw_0"]') and _text(driver, "#live") == "live"
        set_trials(home, spec, TRIALS)  # the driver's next look: two more trials
        wait_until(lambda: driver.execute_script(rows) == ["sw_0", "sw_1", "sw_2", "sw_3"], 20, "the new trials' rows")
        wait_until(lambda: "completed without logging the primary metric 'loss'" in _text(driver, "#notes"), 10,
                   "the note on sw_2")
        assert sorted(driver.execute_script(chart_lines)) == ["sw_0", "sw_1", "sw_2", "sw_3"]
        unscored = driver.execute_script("return [...document.querySelectorAll('#sweep-chart polyline.unscored')]"
                                         ".map(p => p.dataset.trial)")
        assert unscored == ["sw_2", "sw_3"]  # no loss, or a NaN one: grey, up to the last hyperparameter
        finish(home, RunStatus.COMPLETED)
        wait_until(lambda: _text(driver, "#status") == "Completed" and _text(driver, "#live") == "final", 20,
                   "the sweep Completed, the page final")
        assert driver.execute_script("return window.sameDocument") is True
        assert driver.execute_script("return window.pwned") is None
        driver.get(f"{url}/studio/")  # the overview: the sweep, its trials under it
        wait_until(lambda: "sw_3" in _text(driver, "#jobs"), 20, "the overview's trials")
        assert driver.execute_script("return [...document.querySelectorAll('#jobs tbody tr')].map(r => r.className)") \
            == ["", "trial", "trial", "trial", "trial", ""]
