"""The studio page: its JSON endpoints, pages and downloads on a home laid out by hand (fast: no job
runs), what a job wrote staying text, no path leading out of a run's folder, no private file served;
then the page in a real headless browser (Debian's chromium, driven by selenium, logged in by its
one-time link) following a job as it runs. The login itself: tests/test_studio_login.py."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import release, wait_until
from starlette.testclient import TestClient

from amlemu.cluster.store import Node, Store
from amlemu.home import Home
from amlemu.runs.homestore import template_path
from amlemu.runs.metrics import PLOT_NAME, empty_store
from amlemu.studio.app import standalone_app
from amlemu.studio.data import LOG_CHUNK, MAX_POINTS
from amlemu.studio.gate import home_key, login_url, mint_login
from amlemu.specs import ClusterSpec, Priority, RunStatus

JOB = {"command": "python train.py", "instance_count": 1, "display_name": "<b>shout</b>",
       "distribution": {"type": "mpi", "process_count_per_instance": 2},
       "environment_variables": {"API_KEY": "planted-api-key", "MODE": "fast-mode"}}
SCRIPT = "<script>window.pwned = 1</script>"
# r1's launch plan as the supervisor writes it (owner-only): the job's variables and the run's token.
PLAN = {"launcher": "mpirun", "launch": ["mpirun", "-x", "API_KEY=planted-api-key", "python", "train.py"],
        "env": {"API_KEY": "planted-api-key", "MODE": "fast-mode", "AZUREML_RUN_TOKEN": "eyJ.run-token.sig",
                "AZUREML_RUN_ID": "r1"}, "processes": [], "notices": []}
BASE = "http://127.0.0.1:5000"  # the studio answers only Host names of this machine


def logged_in(client: TestClient, key: bytes) -> TestClient:
    """`client` with the session a login link gives."""
    answer = client.get(f"/studio/?login={mint_login(key)}", follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/studio/", answer.text
    return client

# The page tests share the module's home (MLflow imported, a store, runs, faults: seconds of CPU to
# make): on one xdist worker it is made once, not once a worker.
ONE_HOME = pytest.mark.xdist_group("studio-home")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Home:
    """c1 with a busy and an idle node, a finished run r1 (two ranks' logs, outputs, a link out,
    metrics) and a running run r2; a fault on the busy node and one on the idle node's predecessor."""
    from mlflow.entities import Metric  # noqa: PLC0415 - slow import, once per module
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    home = Home.at(tmp_path_factory.mktemp("studio") / "home")
    store = Store(home.db)
    store.add_cluster(ClusterSpec("c1", "STANDARD_D2_V2", Priority.LOW_PRIORITY, max_nodes=2), "process")
    store.add_fault("c1", "c1-node-1", None, "preempt", "requested")  # the c1-node-1 before this one
    made = store.recent_faults()[-1]["ts"] + 1e-6  # the nodes of now came after it (and before the slow fault)
    with store.transaction() as db:
        store.set_node(db, Node("c1", 0, "c1-node-0", "busy", "r2", None, made, "10.0.0.2"))
        store.set_node(db, Node("c1", 1, "c1-node-1", "idle", None, made, made, "10.0.0.3"))
    for run_id in ("r1", "r2"):
        store.add_run(run_id, "exp", "c1", JOB)
        for status in (RunStatus.QUEUED, RunStatus.PREPARING, RunStatus.RUNNING):
            store.set_status(run_id, status, f"to {status.value}")
    store.set_status("r1", RunStatus.FINALIZING)
    store.set_status("r1", RunStatus.COMPLETED, "<i>done</i>", exit_code=0)
    store.add_fault("c1", "c1-node-0", "r2", "slow", "throttled to 0.5 CPU(s)")
    store.close()

    r1 = home.run_dir("r1")
    (r1 / "user_logs").mkdir(parents=True)
    (r1 / "user_logs" / "std_log_process_0.txt").write_text(f"epoch 1\n{SCRIPT}\n")
    (r1 / "user_logs" / "std_log_process_1.txt").write_text("x" * (LOG_CHUNK + 10) + "\nlast\n")
    (r1 / "outputs" / "sub").mkdir(parents=True)
    (r1 / "outputs" / "model.bin").write_bytes(b"\0weights")
    (r1 / "outputs" / "sub" / "page.html").write_text(SCRIPT)
    (r1 / "outputs" / "notes.txt").write_text("plain")
    (r1 / "outputs" / "passwd").symlink_to("/etc/passwd")
    (r1 / "outputs" / "db").symlink_to(home.db)
    (r1 / "outputs" / "up").symlink_to(home.root)
    os.mkfifo(r1 / "outputs" / "fifo")
    (r1 / "outputs" / "mine.key").write_text("owner-only")
    (r1 / "outputs" / "mine.key").chmod(0o600)
    (r1 / "system_logs").mkdir()
    (r1 / "system_logs" / "lifecycle.txt").write_text("started")
    (r1 / "system_logs" / "launch.json").write_text(json.dumps(PLAN))
    (r1 / "system_logs" / "launch.json").chmod(0o600)
    (r1 / "agent-config.marshal").write_text("{}")
    (r1 / "snapshot").mkdir()
    (r1 / "snapshot" / "train.py").write_text("print(1)")
    (r1 / PLOT_NAME).write_bytes(b"\x89PNG\r\n\x1a\n")
    empty_store(template_path(), r1 / "mlflow.db")  # a copy: MLflow's migrations of a new store take seconds
    client = MlflowClient(tracking_uri=f"sqlite:///{r1 / 'mlflow.db'}")
    run = client.create_run(client.create_experiment("exp"))
    client.log_batch(run.info.run_id, metrics=[Metric("loss", 1.0 / (step + 1), 0, step)
                                               for step in range(MAX_POINTS + 100)])
    client.log_metric(run.info.run_id, "odd", float("nan"), step=0)
    client.log_metric(run.info.run_id, "odd", 2.0, step=1)
    r2 = home.run_dir("r2")
    (r2 / "live-metrics").mkdir(parents=True)
    (r2 / "mlflow.db").write_text("not yet a database")  # as MLflow is creating it
    (r2 / "user_logs").mkdir()
    (r2 / "user_logs" / "std_log_process_0.txt").write_text("whole line\nhalf a li")
    return home


@pytest.fixture(scope="module")
def client(home: Home) -> Iterator[TestClient]:
    key = home_key(home.root)
    with TestClient(standalone_app(home, key), base_url=BASE) as test_client:
        yield logged_in(test_client, key)


@ONE_HOME
def test_the_overview_shows_computes_their_nodes_jobs_and_faults(client: TestClient) -> None:
    data = client.get("/studio/api/overview").json()
    [c1] = data["computes"]
    assert (c1["name"], c1["priority"], c1["max_nodes"], c1["backend"]) == ("c1", "lowpriority", 2, "process")
    assert [(n["name"], n["state"], n["run"], n["fault"]) for n in c1["nodes"]] == [
        ("c1-node-0", "busy", "r2", "slow"), ("c1-node-1", "idle", None, None)]  # not its predecessor's fault
    assert [(j["id"], j["status"], j["terminal"], j["processes"]) for j in data["jobs"]] == [
        ("r2", "Running", False, 2), ("r1", "Completed", True, 2)]  # newest first
    assert [(f["kind"], f["node"], f["run_id"]) for f in data["faults"]] == [
        ("slow", "c1-node-0", "r2"), ("preempt", "c1-node-1", None)]  # newest first
    assert data["jobs_total"] == 2


@ONE_HOME
def test_a_job_has_its_status_history_metrics_and_files(client: TestClient) -> None:
    job = client.get("/studio/api/jobs/r1").json()
    assert [e["status"] for e in job["events"]] == [
        "NotStarted", "Queued", "Preparing", "Running", "Finalizing", "Completed"]
    assert job["events"][-1]["detail"] == "<i>done</i>" and job["exit_code"] == 0
    loss = job["metrics"]["loss"]
    assert len(loss) == MAX_POINTS and loss[0] == [0, 1.0] and loss[-1][0] == MAX_POINTS + 99  # thinned, ends kept
    assert job["metrics"]["odd"] == [[0, None], [1, 2.0]]  # NaN is null: the JSON stays valid
    # Regular files only: the links and the fifo the job left are not listed; the snapshot is not served.
    assert [f["path"] for f in job["files"]] == [
        PLOT_NAME, "outputs/model.bin", "outputs/notes.txt", "outputs/sub/page.html", "user_logs/std_log_process_0.txt",
        "user_logs/std_log_process_1.txt", "system_logs/lifecycle.txt"]  # no launch plan, no owner-only file
    running = client.get("/studio/api/jobs/r2").json()
    assert running["faults"][0]["kind"] == "slow"
    assert running["metrics"] is None  # a store unreadable this once: the page keeps its charts


@ONE_HOME
def test_an_unknown_job_is_a_404_in_the_api_and_on_the_page(client: TestClient) -> None:
    answer = client.get("/studio/api/jobs/nope")
    assert answer.status_code == 404 and answer.json()["error"]["message"].startswith("job 'nope' not found")
    page = client.get("/studio/jobs/%3Cscript%3E")
    assert page.status_code == 404 and "&lt;script&gt;" in page.text and "<script>" not in page.text
    assert client.get("/studio/api/nothing").status_code == 404


@ONE_HOME
def test_a_log_is_read_in_whole_lines_from_its_tail_then_from_an_offset(client: TestClient) -> None:
    first = client.get("/studio/api/jobs/r1/logs/1").json()  # no offset: the last LOG_CHUNK bytes
    assert first["skipped"] == first["size"] - LOG_CHUNK and first["text"].endswith("x\nlast\n")
    assert first["offset"] == first["size"] and first["terminal"]
    assert client.get("/studio/api/jobs/r1/logs/1", params={"offset": first["offset"]}).json()["text"] == ""
    running = client.get("/studio/api/jobs/r2/logs/0", params={"offset": 0}).json()
    assert running["text"] == "whole line\n" and running["offset"] == 11 and not running["terminal"]
    assert client.get("/studio/api/jobs/r2/logs/1").json()["text"] == ""  # rank 1 wrote nothing yet
    assert client.get("/studio/api/jobs/r2/logs/2").status_code == 404  # 2 processes: ranks 0 and 1
    bad = client.get("/studio/api/jobs/r2/logs/0", params={"offset": "x"})
    assert bad.status_code == 400 and "offset" in bad.json()["error"]["message"]


@ONE_HOME
def test_files_download_from_the_run_folder_and_never_run_as_a_page(client: TestClient) -> None:
    model = client.get("/studio/files/r1/outputs/model.bin")
    assert model.status_code == 200 and model.content == b"\0weights"
    assert model.headers["content-disposition"].startswith("attachment")
    page = client.get("/studio/files/r1/outputs/sub/page.html")  # the job's HTML: a download, sandboxed
    assert page.headers["content-type"] == "application/octet-stream"
    assert page.headers["content-security-policy"].startswith("sandbox")
    assert page.headers["x-content-type-options"] == "nosniff"
    log = client.get("/studio/files/r1/user_logs/std_log_process_0.txt")
    assert log.headers["content-type"] == "text/plain; charset=utf-8" and SCRIPT in log.text
    assert client.get(f"/studio/files/r1/{PLOT_NAME}").headers["content-type"] == "image/png"


@pytest.mark.parametrize("path", [
    "r1/outputs/passwd", "r1/outputs/db", "r1/outputs/up/amlemu.db",  # links the job left
    "r1/outputs/fifo", "r1/outputs", "r1/outputs/missing",  # not a regular file
    "r1/outputs/%2e%2e/%2e%2e/%2e%2e/amlemu.db", "r1/outputs/..%2F..%2F..%2Famlemu.db",  # out by ..
    "r1/outputs//etc/passwd", "r1/%2Fetc/passwd", "r1/snapshot/train.py", "r1/mlflow.db",  # not a download
    "%2e%2e/amlemu.db", "r3/outputs/model.bin",  # not a job
    "r1/system_logs/launch.json", "r1/agent-config.marshal", "r1/outputs/mine.key",  # private: launch plan, agent config, owner-only
])
@ONE_HOME
def test_no_path_leads_out_of_a_runs_downloads(client: TestClient, path: str) -> None:
    answer = client.get(f"/studio/files/{path}")
    assert answer.status_code == 404, answer.text
    assert "has no such file" in answer.text or "list jobs" in answer.text  # refused by the route, not unrouted
    assert "root:" not in answer.text and "SQLite" not in answer.text


@ONE_HOME
def test_pages_escape_what_a_job_wrote_and_allow_no_inline_script(client: TestClient) -> None:
    overview = client.get("/studio/")
    assert overview.status_code == 200 and "&lt;b&gt;shout&lt;/b&gt;" in overview.text
    assert 'href="/studio/jobs/r1"' in overview.text and "c1-node-0" in overview.text
    job = client.get("/studio/jobs/r1")
    assert "&lt;script&gt;window.pwned = 1&lt;/script&gt;" in job.text and "&lt;i&gt;done&lt;/i&gt;" in job.text
    for page in (overview, job):
        scripts = re.findall(r"<script[^>]*>", page.text)
        assert scripts == ['<script src="/studio/static/studio.js">'], scripts
        policy = page.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "default-src 'none'" in policy
    # The tail's offset is where the script's first poll goes on from.
    assert re.search(r'id="log-1" data-rank="1" data-offset="(\d+)"', job.text).group(1) == \
        str(client.get("/studio/api/jobs/r1/logs/1").json()["offset"])
    assert client.get("/studio/static/studio.js").headers["content-type"] == "text/javascript; charset=utf-8"
    assert client.get("/studio/static/studio.css").headers["content-type"] == "text/css; charset=utf-8"
    assert client.get("/studio/static/studio.py").status_code == 404  # the two assets, not the package
    assert client.get("/", follow_redirects=False).headers["location"] == "/studio/"


@ONE_HOME
def test_the_job_page_shows_the_launch_plan_without_secret_values(client: TestClient) -> None:
    page = client.get("/studio/jobs/r1").text
    plan = re.search(r'<details id="plan">.*?</details>', page, re.S).group(0)
    assert "AZUREML_RUN_ID&quot;: &quot;r1" in plan and "mpirun" in plan  # the plan, escaped
    for secret in ("planted-api-key", "fast-mode", "run-token"):  # the job's variables, the run's token
        assert secret not in page
    assert "API_KEY=***" in plan  # masked inside the argv too
    assert "planted-api-key" not in client.get("/studio/api/jobs/r1").text
    assert 'id="plan" class="empty">not launched yet' in client.get("/studio/jobs/r2").text


# --- in a real browser: headless chromium, the page served by uvicorn, a job running -------------
PROCESS = pytest.mark.parametrize("backend", ["process"], indirect=True)
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"  # Debian's (scripts/setup.sh)

# Logs a metric as the trainer does (MLflow), prints a line and what an attacker would, waits for
# the host's release file, then logs one more step.
LIVE_JOB = """
import os, time, mlflow
for step in range(3):
    mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
print("hello from rank 0", flush=True)
print("<script>window.pwned = 1</script><img src=x onerror='window.pwned = 2'>", flush=True)
release = os.path.join(os.environ["AZUREML_CR_EXECUTION_WORKING_DIR_PATH"], "..", "..", "release")
while not os.path.exists(release):
    time.sleep(0.05)
mlflow.log_metric("loss", 0.1, step=3)
print("released", flush=True)
"""


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """The app under uvicorn in a thread of this process, on a free loopback port."""
    import uvicorn  # noqa: PLC0415

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 30, "uvicorn serves the studio")
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"


@contextmanager
def chromium(profile: Path) -> Iterator[Any]:
    from selenium import webdriver  # noqa: PLC0415
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    assert not missing, f"{missing} missing: scripts/setup.sh installs Debian's chromium and chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 f"--user-data-dir={profile}", "--window-size=1280,1000"):
        options.add_argument(flag)
    # The driver's path given: Selenium Manager (which would download one) is never asked.
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def _text(driver: Any, selector: str) -> str:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException  # noqa: PLC0415
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    try:
        return driver.find_element(By.CSS_SELECTOR, selector).text
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


@pytest.mark.slow
@PROCESS
def test_the_page_follows_a_running_job_to_completed_without_a_reload(emu, cluster, make_job, tmp_path: Path) -> None:
    cluster(max_nodes=1)
    run = emu.submit(make_job(LIVE_JOB, nodes=1))
    key = home_key(emu.home.root)
    with serving(standalone_app(emu.home, key)) as url, chromium(tmp_path / "chromium") as driver:
        driver.get(f"{url}/studio/")
        assert "needs a login" in _text(driver, "body")  # no session yet
        driver.get(login_url(key, url))  # the one-time link: a session, and the overview, left open in its tab
        assert driver.current_url == f"{url}/studio/"
        overview = driver.current_window_handle
        busy = re.compile(r"c1-node-0\s+busy")
        wait_until(lambda: run.id in _text(driver, "#jobs") and busy.search(_text(driver, "#computes")), 120,
                   "the overview shows the job and its node busy")
        driver.execute_script("window.sameDocument = true")  # a reload would lose it
        driver.switch_to.new_window("tab")
        started = time.monotonic()
        driver.get(f"{url}/studio/jobs/{run.id}")
        loaded = time.monotonic() - started
        driver.execute_script("window.sameDocument = true")
        wait_until(lambda: _text(driver, "#status") == "Running", 120, "the page shows the job Running")
        wait_until(lambda: "hello from rank 0" in _text(driver, "#log-0"), 60, "rank 0's line in its log tail")
        wait_until(lambda: "at step 2" in _text(driver, 'figure.chart[data-metric="loss"]'), 60,
                   "a chart of the loss, live")
        assert "<script>window.pwned = 1</script>" in _text(driver, "#log-0")  # shown as text ...
        assert driver.execute_script("return window.pwned") is None  # ... never run
        assert driver.execute_script("return document.querySelectorAll('#log-0 *').length") == 0  # no element
        assert "c1-node-0" in _text(driver, "#job-nodes")
        release(emu, run)
        wait_until(lambda: _text(driver, "#status") == "Completed", 120, "the page shows the job Completed")
        wait_until(lambda: "released" in _text(driver, "#log-0") and "at step 3" in _text(driver, "figure.chart"),
                   30, "the last log line and metric step")
        history = driver.execute_script(
            "return [...document.querySelectorAll('#events tbody td:nth-child(2)')].map(td => td.textContent)")
        assert history == ["NotStarted", "Queued", "Preparing", "Running", "Finalizing", "Completed"]
        points = driver.execute_script(
            "return document.querySelector('figure.chart polyline').getAttribute('points').split(' ').length")
        assert points == 4
        wait_until(lambda: "user_logs/std_log.txt" in _text(driver, "#files"), 30, "the run's files")  # one process
        assert driver.execute_script("return window.sameDocument") is True
        assert driver.execute_script("return window.pwned") is None
        driver.switch_to.window(overview)  # the overview followed the job too
        wait_until(lambda: "Completed" in _text(driver, "#jobs"), 30, "the overview shows the job Completed")
        assert driver.execute_script("return window.sameDocument") is True
        driver.delete_all_cookies()  # the session gone (as when it expires): the page says how to log in again
        wait_until(lambda: "amlemu ui --link" in _text(driver, "#live"), 30, "the overview says it is logged out")
        print(f"studio: the job page loaded in {loaded:.2f} s")
    assert run.status is RunStatus.COMPLETED


def test_amlemu_ui_serves_the_page_over_http_until_ctrl_c(tmp_path: Path) -> None:
    """`amlemu ui`: the studio alone over plain HTTP on loopback (a browser needs no certificate), /
    leading to it, behind the one-time login link it prints, until Ctrl-C frees the port."""
    copy = Home.at(tmp_path / "home")
    store = Store(copy.db)
    store.add_cluster(ClusterSpec("c1", "STANDARD_D2_V2", Priority.LOW_PRIORITY, max_nodes=2), "process")
    store.add_run("r1", "exp", "c1", JOB)
    for status in (RunStatus.QUEUED, RunStatus.PREPARING, RunStatus.RUNNING, RunStatus.FINALIZING):
        store.set_status("r1", status)
    store.set_status("r1", RunStatus.COMPLETED, exit_code=0)
    store.close()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "ui.out"
    with open(out, "w") as sink:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("amlemu")), "--home", str(copy.root), "ui",
                                 "--no-browser", "--port", str(port)], stdout=sink, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        link = re.compile(rf"{re.escape(url)}/studio/\?login=\S+")

        def printed() -> bool:
            assert proc.poll() is None, out.read_text()  # it failed: say why, not only that it did not print
            return bool(link.search(out.read_text()))
        wait_until(printed, 60, "amlemu ui printed its link")
        assert requests.get(f"{url}/", timeout=10).status_code == 401  # / leads to the page, which needs a login
        browser = requests.Session()
        page = browser.get(link.search(out.read_text()).group(0), timeout=10)  # the link: a session, the page
        assert page.status_code == 200 and page.url == f"{url}/studio/"
        assert "r1" in page.text and "c1" in page.text
        assert browser.get(f"{url}/studio/api/jobs/r1", timeout=10).json()["status"] == "Completed"
        assert requests.get(link.search(out.read_text()).group(0), timeout=10).status_code == 401  # used once
        rebound = browser.get(f"{url}/studio/", headers={"Host": f"rebound.example:{port}"}, timeout=10)
        assert rebound.status_code == 400  # a page elsewhere whose name resolves to 127.0.0.1 (DNS rebinding)
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(timeout=30) == 0, out.read_text()
        with pytest.raises(requests.ConnectionError):  # nothing listens any more
            requests.get(url, timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
