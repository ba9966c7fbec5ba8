"""The studio: a small live web page of one home, what a user looks at instead of Azure ML studio.

`studio_app(home)` is a self-contained Starlette app: server-rendered pages (the overview, a job,
with its launch plan, secret values masked, a sweep, with its trials: sweeppage, and a pipeline,
with its steps' graph: pipelinepage), JSON endpoints that a little script polls every second, and
the run's files to download. It only reads the home. Everything a job wrote is
escaped (studio_html), files come only from the run's own folder and never its private ones
(runfiles.open_in_run), and every answer forbids inline script: a `<script>` a job printed stays
text. `studio_mount` puts it at /studio behind its login (studiogate: no route answers without
the session a one-time link gives, which no job gets, or to a Host not naming this machine).

    amlemu ui        # this page alone over http://127.0.0.1:5000/studio/ (emulator/cli/ui.py)
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from amlemu.errors import NotFoundError
from amlemu.home import Home
from amlemu.studio import pages
from amlemu.studio.data import StudioData
from amlemu.studio.gate import LOOPBACK_NAMES, StudioGate
from amlemu.studio.pipelinepage import pipeline_page
from amlemu.studio.sweeppage import sweep_page

# The page's own script and style sheet, beside this module (package data), served from memory.
ASSETS = {"studio.js": "text/javascript; charset=utf-8", "studio.css": "text/css; charset=utf-8"}
# Our own script and style only: no inline script, nothing from another origin.
PAGE_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
               "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
# A file the job wrote is never run as a page of ours, whatever its name says.
FILE_POLICY = "sandbox; default-src 'none'"
INLINE_TYPES = {".txt": "text/plain; charset=utf-8", ".log": "text/plain; charset=utf-8", ".png": "image/png"}


class SecurityHeaders:
    """Pure ASGI middleware: every answer gets nosniff, no referrer, and the page policy unless it
    set its own (file downloads set the sandbox)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {name.lower() for name, _ in headers}
                defaults = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"),
                            (b"content-security-policy", PAGE_POLICY.encode()), (b"cache-control", b"no-store")]
                message = {**message, "headers": headers + [(k, v) for k, v in defaults if k not in names]}
            await send(message)
        await self.app(scope, receive, with_headers)


def _base(request: Request) -> str:
    """Where the app is mounted (the service's /studio), for the links it writes."""
    return request.scope.get("root_path", "").rstrip("/")


def _missing(request: Request, exc: Exception) -> Response:
    if request.url.path.startswith(f"{_base(request)}/api/"):
        return JSONResponse({"error": {"code": "NotFound", "message": str(exc)}}, status_code=404)
    return HTMLResponse(pages.not_found_page(_base(request), str(exc)), status_code=404)


def _chunks(fh: BinaryIO) -> Iterator[bytes]:
    with fh:
        while block := fh.read(256 * 1024):
            yield block


class _Handlers:
    """The studio's routes over one home's StudioData (the store's reads run in the thread pool)."""

    def __init__(self, data: StudioData) -> None:
        self.data = data
        self.assets = {name: (Path(__file__).with_name(name).read_bytes(), media) for name, media in ASSETS.items()}

    async def asset(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in self.assets:
            raise NotFoundError("file", name, "the studio serves studio.js and studio.css")
        content, media = self.assets[name]
        return Response(content, media_type=media)

    async def overview(self, request: Request) -> Response:
        return HTMLResponse(pages.overview_page(await run_in_threadpool(self.data.overview), _base(request)))

    def _job_page(self, run_id: str) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any] | None]:
        job = self.data.job(run_id)
        return job, [self.data.log_chunk(run_id, rank, -1) for rank in range(job["processes"])], self.data.plan(run_id)

    async def job(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        if await run_in_threadpool(self.data.is_sweep, run_id):  # a sweep's page: its trials and chart
            return HTMLResponse(sweep_page(await run_in_threadpool(self.data.sweep, run_id), _base(request)))
        if await run_in_threadpool(self.data.is_pipeline, run_id):  # a pipeline's page: its steps' graph
            return HTMLResponse(pipeline_page(await run_in_threadpool(self.data.pipeline, run_id), _base(request)))
        found, logs, plan = await run_in_threadpool(self._job_page, run_id)
        return HTMLResponse(pages.job_page(found, logs, _base(request), plan))

    async def api_overview(self, request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(self.data.overview))

    async def api_job(self, request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(self.data.job, request.path_params["run_id"]))

    async def api_sweep(self, request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(self.data.sweep, request.path_params["run_id"]))

    async def api_pipeline(self, request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(self.data.pipeline, request.path_params["run_id"]))

    async def api_log(self, request: Request) -> Response:
        try:
            offset = int(request.query_params.get("offset", "-1"))
        except ValueError:
            return JSONResponse({"error": {"code": "BadRequest", "message": "offset: must be a whole number of "
                                           "bytes; leave it out for the log's tail"}}, status_code=400)
        chunk = await run_in_threadpool(self.data.log_chunk, request.path_params["run_id"],
                                        request.path_params["rank"], offset)
        return JSONResponse(chunk)

    async def download(self, request: Request) -> Response:
        run_id, rel = request.path_params["run_id"], request.path_params["path"]
        fh = await run_in_threadpool(self.data.open_file, run_id, rel)
        if fh is None:
            raise NotFoundError("file", rel, f"job {run_id} has no such file in its outputs or logs")
        media = INLINE_TYPES.get(Path(rel).suffix.lower())  # else a download, whatever the name says
        disposition = f"{'inline' if media else 'attachment'}; filename*=utf-8''{quote(Path(rel).name)}"
        return StreamingResponse(_chunks(fh), media_type=media or "application/octet-stream",
                                 headers={"content-security-policy": FILE_POLICY, "content-disposition": disposition})


def studio_app(home: Home) -> Starlette:
    """The studio of `home`, to mount (`Mount("/studio", studio_app(home))`): its links follow the
    mount's path. Run on its own, its lifespan closes the store; mounted, Starlette runs no
    lifespan of a sub-app, so the store's connection lives as long as the process."""
    data = StudioData(home)
    handlers = _Handlers(data)

    @asynccontextmanager
    async def lifespan(_app: Starlette):  # type: ignore[no-untyped-def]
        yield
        data.close()

    routes = [
        Route("/", handlers.overview, name="overview"),
        Route("/jobs/{run_id}", handlers.job, name="job"),
        Route("/runs/{run_id}", handlers.job),  # azureml-core's "Web View" link to a run
        Route("/api/overview", handlers.api_overview),
        Route("/api/jobs/{run_id}", handlers.api_job),
        Route("/api/jobs/{run_id}/logs/{rank:int}", handlers.api_log),
        Route("/api/sweeps/{run_id}", handlers.api_sweep),
        Route("/api/pipelines/{run_id}", handlers.api_pipeline),
        Route("/files/{run_id}/{path:path}", handlers.download),
        Route("/static/{name}", handlers.asset),
    ]
    app = Starlette(routes=routes, exception_handlers={NotFoundError: _missing, 404: _missing},
                    lifespan=lifespan)
    app.add_middleware(SecurityHeaders)
    return app


def studio_mount(home: Home, key: bytes, hosts: frozenset[str] = LOOPBACK_NAMES) -> Mount:
    """The studio as `amlemu serve` mounts it at /studio (beside the API), behind its login
    (studiogate: a session from a one-time link, and only `hosts` as the Host)."""
    return Mount("/studio", SecurityHeaders(StudioGate(studio_app(home), key, hosts)))  # its refusals too


def standalone_app(home: Home, key: bytes, hosts: frozenset[str] = LOOPBACK_NAMES) -> Starlette:
    """The studio at /studio, as the service serves it, and / leading there (what `amlemu ui` serves)."""
    async def root(_request: Request) -> Response:
        return RedirectResponse("/studio/")
    return Starlette(routes=[Route("/", root), studio_mount(home, key, hosts)])
