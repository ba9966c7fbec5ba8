"""MLflow's own tracking server, served by the service under /mlflow over the home's MLflow store
(emulator/runs/homestore.py): an online job's MLFLOW_TRACKING_URI, so `mlflow.search_runs`, MLflow's
UI and the studio page see its metrics while it runs.

Why MLflow's own server app (mlflow.server's Flask app), called in the service's thread pool, and
not a REST double or a second server process: its REST protocol is MLflow's, whatever the client
version asks, with nothing to keep in step; one process and one port serve both APIs, behind the
same TLS, the same run links (emulator/runs/servicelink.py) and the same tokens. MLflow's server
imports in seconds, so it is imported on the first MLflow request, not when the service starts.
The request body is read before the app sees it, once the token is known good and at most
bodies.MLFLOW_LIMIT (MLflow's tracking calls are small JSON): the run-token policy below needs
it, and so no deprecated WSGI bridge is needed. The app's state is one MlflowServer per mount,
with `reset()`: its stores are made from arguments, nothing is written to os.environ (MLflow's own
server variables are left at their defaults), and MLflow sees Host localhost (see _call_wsgi).

Who may do what (a job is untrusted code): a workspace token (the user's, from `amlemu env`'s
identity) may call every route but MLflow's server-job and demo routes (SERVER_JOB_ROUTES). A run's token (the job's AZUREML_RUN_TOKEN, sent as
MLFLOW_TRACKING_TOKEN), while its run is active, may read the tracking routes (experiments, runs,
metrics: the workspace's own data) and write to its own MLflow run only: every write route names
its run in `run_id`/`run_uuid`, which must be the token's. Creating or deleting experiments and
runs, the model registry, artifacts served by the server and every other route answer ARM's 403.
"""
from __future__ import annotations

import io
import json
import sqlite3
import threading
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount

from amlemu.runs.homestore import MOUNT, artifact_root, ensure_store
from amlemu.service.protocol import bodies
from amlemu.service.protocol.calls import Context, Reply, arm_error
from amlemu.service.state import ServiceError
from amlemu.servicekeys import RUN_CLAIM

API_PREFIXES = ("/api/2.0/mlflow/", "/ajax-api/2.0/mlflow/", "/api/2.0/preview/mlflow/")
# A run's own writes: each names its run in the body (or the query).
RUN_WRITES = frozenset({"runs/update", "runs/log-metric", "runs/log-parameter", "runs/set-tag", "runs/delete-tag",
                        "runs/log-batch", "runs/log-inputs", "runs/log-outputs", "runs/log-model"})
# Reads (GET, and the searches MLflow sends as POST): the workspace's tracking data.
READ_AREAS = ("experiments/", "runs/", "metrics/")
SEARCHES = frozenset({"runs/search", "experiments/search", "metrics/get-history-bulk-interval"})
# Routes that start MLflow's server jobs (scorers, evaluations, issue detection, prompt optimization)
# or make its demo data: they need `mlflow server`'s own process (its job runner, its tracking URI
# and workspace in the process's environment), which this mount is not. None of a tracking client's.
SERVER_JOB_ROUTES = ("/mlflow/jobs/", "/mlflow/prompt-optimization/", "/mlflow/scorer/invoke", "/mlflow/issues/invoke",
                     "/mlflow/genai/evaluate/invoke", "/mlflow/demo/")


def server_job_route(path: str) -> bool:
    """Whether a workspace token's call is one of SERVER_JOB_ROUTES (answered 400 NotSupported)."""
    return any(route in path for route in SERVER_JOB_ROUTES)


class MlflowServer:
    """MLflow's server app (mlflow.server's Flask app) over one home's store, made on the first
    request. Nothing is written to os.environ: the stores are made from arguments, and MLflow's
    server variables keep their defaults (no served artifacts; its job routes are refused above).
    MLflow keeps its stores in module globals, so one process serves one home at a time: `app()`
    puts this home's stores back when another server (the tests' in-process services) swapped them."""

    def __init__(self, home_root: Path) -> None:
        self.home_root = home_root
        self._lock = threading.Lock()
        self._app: Any = None
        self._stores: tuple[Any, Any] | None = None  # (tracking, model registry), once made

    @property
    def loaded(self) -> bool:
        return self._app is not None

    def app(self) -> Any:
        """MLflow's Flask app, serving this home's store."""
        with self._lock:
            if self._app is None:
                from mlflow.server import app  # noqa: PLC0415 - seconds: on the first request only
                self._app = app
            if self._stores is None:
                uri = f"sqlite:///{ensure_store(self.home_root)}"
                # MLflow's own store classes, made as initialize_backend_stores() would make them but
                # without its set_tracking_uri()/set_registry_uri(), which write MLFLOW_TRACKING_URI and
                # MLFLOW_REGISTRY_URI into the process's environment.
                from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as Registry  # noqa: PLC0415
                from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore as Tracking  # noqa: PLC0415
                self._stores = (Tracking(uri, artifact_root(self.home_root).as_uri()), Registry(uri))
            self._swap(self._stores)
            return self._app

    def reset(self) -> None:
        """Forget this home's stores (MLflow's too, where they are this home's) and close their
        connections: the next request makes them again from the home, as after its store was
        removed and made again (MLflow caches one engine per URI: a pooled connection would still
        hold the removed file)."""
        with self._lock:
            if self._stores is not None:
                self._swap(None)
                for store in self._stores:
                    store.engine.dispose()
            self._stores = None

    def _swap(self, stores: tuple[Any, Any] | None) -> None:
        """The one place MLflow's private module globals are touched: mlflow.server.handlers keeps the
        stores its routes use there and has no public setter that leaves os.environ alone."""
        from mlflow.server import handlers  # noqa: PLC0415 - imported with the app
        mine = self._stores or (None, None)
        installed = (handlers._tracking_store, handlers._model_registry_store)  # noqa: SLF001
        if stores is None:
            if installed[0] is mine[0]:
                handlers._tracking_store = handlers._model_registry_store = None  # noqa: SLF001
        elif installed[0] is not stores[0] or installed[1] is not stores[1]:
            handlers._tracking_store, handlers._model_registry_store = stores  # noqa: SLF001


def _call_wsgi(app: Any, method: str, path: str, query: str, headers: dict[str, str],
               body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
    """One request to MLflow's app. Its security middleware (on when uvicorn is imported before it,
    decided from the environment at import) refuses Host names other than loopback's and private
    addresses, and state changes from non-local Origins: it guards a tokenless server against DNS
    rebinding and cross-site forms. Here every request's bearer token was checked before (a browser
    never sends one by itself), so MLflow sees Host localhost and no Origin, whatever the service's
    or the link's host names are, and leaves no process-wide switch to turn it off."""
    environ = {"REQUEST_METHOD": method, "SCRIPT_NAME": "", "PATH_INFO": path, "QUERY_STRING": query,
               "SERVER_NAME": "localhost", "HTTP_HOST": "localhost", "SERVER_PORT": "443", "SERVER_PROTOCOL": "HTTP/1.1",
               "wsgi.version": (1, 0), "wsgi.url_scheme": "https", "wsgi.input": io.BytesIO(body),
               "wsgi.errors": io.StringIO(), "wsgi.multithread": True, "wsgi.multiprocess": False,
               "wsgi.run_once": False, "CONTENT_LENGTH": str(len(body))}
    for name, value in headers.items():
        if name == "content-type":
            environ["CONTENT_TYPE"] = value
        elif name not in ("content-length", "authorization", "host", "origin"):  # the token stops here
            environ["HTTP_" + name.upper().replace("-", "_")] = value
    started: dict[str, Any] = {}

    def start_response(status: str, response_headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        started.update(status=int(status.split()[0]), headers=response_headers)
    chunks = app(environ, start_response)
    try:
        data = b"".join(chunks)
    finally:
        if hasattr(chunks, "close"):
            chunks.close()
    return started["status"], started["headers"], data


def run_token_refusal(method: str, path: str, query: str, body: bytes, run: str) -> str | None:
    """Why a run's token may not make this MLflow call (None: it may)."""
    route = next((path[len(p):] for p in API_PREFIXES if path.startswith(p)), None)
    if route is None:
        return "it is not one of MLflow's tracking routes"
    if method == "GET" and route.startswith(READ_AREAS) or method == "POST" and route in SEARCHES:
        return None
    if method != "POST" or route not in RUN_WRITES:
        return "a run's token reads the workspace's runs and writes to its own run only"
    try:
        fields = json.loads(body or b"{}")
    except ValueError:
        return "its body is not JSON"
    named = {fields.get(k) for k in ("run_id", "run_uuid") if isinstance(fields, dict) and fields.get(k)}
    named |= {v for k in ("run_id", "run_uuid") for v in parse_qs(query).get(k, [])}
    if named != {run}:
        return f"it writes to run {', '.join(sorted(map(str, named))) or '(none named)'}, not its own"
    return None


class MlflowMount:
    """The ASGI app at MOUNT; `bind` gives it the service's Context (made after the routes)."""

    def __init__(self, home_root: Path) -> None:
        self.home_root = home_root
        self.ctx: Context | None = None
        self.slots = bodies.Slots(bodies.MLFLOW_SLOTS)
        self.server = MlflowServer(home_root)

    def bind(self, ctx: Context) -> None:
        self.ctx = ctx
        ctx.health_checks["mlflow"] = self.check

    def check(self) -> None:
        """For the health route: the store opens, and once MLflow's app is loaded, it answers a
        search (what failed with a removed working directory while the rest of the service worked)."""
        with closing(sqlite3.connect(f"file:{ensure_store(self.home_root)}?mode=ro", uri=True, timeout=5)) as db:
            db.execute("SELECT COUNT(*) FROM experiments").fetchone()
        if self.server.loaded:
            status, _, data = _call_wsgi(self.server.app(), "POST", "/api/2.0/mlflow/experiments/search", "",
                                         {"content-type": "application/json"}, b'{"max_results": 1}')
            if status != 200:
                raise RuntimeError(f"MLflow's server answered {status}: {data[:200].decode(errors='replace')}")

    def route(self) -> Mount:
        return Mount(MOUNT, app=self.asgi)

    def _run_of(self, request: Request) -> Reply | str | None:
        """The caller's run (None: a workspace token), or the 401 that refuses it: checked before
        the body is read."""
        assert self.ctx is not None
        claims = self.ctx.auth.claims(request.headers.get("authorization"))
        if claims is None:
            return Reply(401, ServiceError(401, "InvalidAuthenticationToken", "no bearer token issued by this service, "
                                           "or it has expired (MLFLOW_TRACKING_TOKEN)").body(),
                         {"WWW-Authenticate": 'Bearer error="invalid_token"'})
        run = claims.get(RUN_CLAIM)
        if run is None:
            return None
        if not self.ctx.state.run_active(run):
            return Reply(401, ServiceError(401, "ExpiredAuthenticationToken", f"the token of run {run} expired "
                                           "with the run").body(), {"WWW-Authenticate": 'Bearer error="invalid_token"'})
        return str(run)

    def _refusal(self, request: Request, path: str, body: bytes, run: str | None) -> Reply | None:
        if run is None:
            if server_job_route(path):
                return arm_error(400, "NotSupported", f"{MOUNT}{path} is one of MLflow's server-job or demo routes: "
                                 "they need `mlflow server`'s own process and job runner, which this service is not")
            return None
        why = run_token_refusal(request.method, path, request.url.query, body, run)
        if why is None:
            return None
        return arm_error(403, "AuthorizationFailed", f"the token of run {run} does not have authorization to "
                         f"perform {request.method} on {MOUNT}{path}: {why}")

    async def _admit(self, request: Request, path: str) -> Reply | bytes:
        """The request's body, read (bounded) once its token may make the call; else the refusal."""
        assert self.ctx is not None
        try:
            bodies.check_length({k.lower(): v for k, v in request.headers.items()}, bodies.MLFLOW_LIMIT)
            run = await run_in_threadpool(self._run_of, request)
            if isinstance(run, Reply):
                return run
            body = await bodies.read(request, bodies.MLFLOW_LIMIT)
        except ServiceError as exc:
            return Reply(exc.status, exc.body())
        return self._refusal(request, path, body, run) or body

    async def asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.ctx is None:
            await Response(b"", 404)(scope, receive, send)
            return
        request = Request(scope, receive)
        path = scope["path"][len(MOUNT):] if scope["path"].startswith(MOUNT) else scope["path"]
        try:
            async with self.slots.hold({k.lower(): v for k, v in request.headers.items()}):
                response = await self._respond(request, path)
        except ServiceError as exc:
            response = Response(json.dumps(exc.body()).encode(), exc.status,
                                {"Content-Type": "application/json; charset=utf-8"})
        self.ctx.log(f"{request.method} {MOUNT}{path} {response.status_code}")  # never the query or a header
        await response(scope, receive, send)

    async def _respond(self, request: Request, path: str) -> Response:
        assert self.ctx is not None
        admitted = await self._admit(request, path)
        if isinstance(admitted, Reply):
            response = Response(json.dumps(admitted.body).encode(), admitted.status,
                                {**admitted.headers, "Content-Type": "application/json; charset=utf-8"})
        else:
            try:
                app = await run_in_threadpool(self.server.app)
                status, headers, data = await run_in_threadpool(
                    _call_wsgi, app, request.method, path, request.url.query,
                    {k.lower(): v for k, v in request.headers.items()}, admitted)
            except Exception as exc:  # noqa: BLE001 - the client gets a 500, the log its cause
                self.ctx.log(f"MLflow server failed: {type(exc).__name__}: {exc}")
                status, headers, data = 500, [("Content-Type", "application/json")], json.dumps(
                    ServiceError(500, "InternalServerError", "the MLflow server failed; see the service's log").body()
                ).encode()
            response = Response(data, status, dict(headers))
        return response
