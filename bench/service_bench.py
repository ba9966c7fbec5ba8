"""Which web framework `amlemu serve` runs on: Starlette + uvicorn vs aiohttp, measured.

    .venv/bin/python bench/service_bench.py [--requests 50] [--clients 20]

Each candidate serves the same route over HTTPS with the same certificate, in its own process:
a GET of a job resource (an ~1 KB JSON body) that checks a bearer token, as `jobs.get` is
answered. For each: the server's resident memory (RSS) idle after start-up, then `--clients`
concurrent clients (threads, each with its own keep-alive `requests` session) making
`--requests` GETs each; p50 and p99 of the request latency seen by the clients. A third row is
amlemu's own service (the full route table over the test double's state) for the same GET.

Measured here (2 shared cores, 2026-12-01), see README "Point your Azure ML code at amlemu".
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import requests

REPO = Path(__file__).resolve().parents[1]
PATH = "/subscriptions/s/resourceGroups/g/providers/Microsoft.MachineLearningServices/workspaces/w/jobs/bench_job"
BODY = {"id": PATH, "name": "bench_job", "type": "Microsoft.MachineLearningServices/workspaces/jobs",
        "properties": {"jobType": "Command", "command": "python train.py --epochs 2", "status": "Running",
                       "computeId": PATH.replace("/jobs/bench_job", "/computes/cpu"), "experimentName": "bench",
                       "environmentVariables": {f"VAR_{i}": "x" * 20 for i in range(20)}}}
TOKEN = "Bearer bench-token"


def serve_starlette(cert: str, key: str, port: int) -> None:
    import uvicorn  # noqa: PLC0415
    from starlette.applications import Starlette  # noqa: PLC0415
    from starlette.requests import Request  # noqa: PLC0415
    from starlette.responses import JSONResponse  # noqa: PLC0415
    from starlette.routing import Route  # noqa: PLC0415

    async def job(request: Request) -> JSONResponse:
        if request.headers.get("authorization") != TOKEN:
            return JSONResponse({"error": {"code": "InvalidAuthenticationToken"}}, 401)
        return JSONResponse(BODY)
    app = Starlette(routes=[Route(PATH, job)])
    uvicorn.run(app, host="127.0.0.1", port=port, ssl_certfile=cert, ssl_keyfile=key, log_level="warning",
                access_log=False, lifespan="off")


def serve_aiohttp(cert: str, key: str, port: int) -> None:
    import ssl  # noqa: PLC0415

    from aiohttp import web  # noqa: PLC0415

    async def job(request: web.Request) -> web.Response:
        if request.headers.get("authorization") != TOKEN:
            return web.json_response({"error": {"code": "InvalidAuthenticationToken"}}, status=401)
        return web.json_response(BODY)
    app = web.Application()
    app.router.add_get(PATH, job)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    web.run_app(app, host="127.0.0.1", port=port, ssl_context=context, print=None, access_log=None)


def serve_amlemu(folder: str, port_file: str) -> None:
    """amlemu's own service over the test double's state, on a free port (written to port_file)."""
    sys.path.insert(0, str(REPO))
    from pytest_amlemu.amlservice import FakeAzureML  # noqa: PLC0415

    with FakeAzureML(Path(folder), workspace_name="w", resource_group="g", subscription_id="s") as svc:
        Path(port_file).write_text(json.dumps({"url": svc.url, "header": svc.identity_header,
                                               "ca": str(svc.ca_path)}))
        while True:
            time.sleep(3600)


def measure(url: str, verify: str, headers: dict[str, str], clients: int, count: int) -> list[float]:
    latencies: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(clients)

    def client() -> None:
        session = requests.Session()
        session.get(url, headers=headers, verify=verify, timeout=30)  # connect + handshake outside the figures
        start.wait()
        mine = []
        for _ in range(count):
            t0 = time.perf_counter()
            reply = session.get(url, headers=headers, verify=verify, timeout=30)
            mine.append(time.perf_counter() - t0)
            assert reply.status_code == 200, reply.text
        with lock:
            latencies.extend(mine)
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies


def wait_up(url: str, verify: str, proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            requests.get(url, verify=verify, timeout=2)
            return
        except requests.RequestException:
            time.sleep(0.1)
    raise SystemExit(f"no answer from {url}")


def run_candidate(name: str, work: Path, tls_files: object, clients: int, count: int) -> dict[str, float]:
    from amlemu.service.server import bind  # noqa: PLC0415 - a free port, then released for the server

    if name == "amlemu service":
        port_file = work / "port.json"
        port_file.unlink(missing_ok=True)
        argv = [sys.executable, __file__, "--serve", "amlemu", str(work / "amlemu"), str(port_file)]
    else:
        sock = bind("127.0.0.1", 0)
        port = sock.getsockname()[1]
        sock.close()
        argv = [sys.executable, __file__, "--serve", name, tls_files.cert, tls_files.key, str(port)]  # type: ignore[attr-defined]
    proc = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        if name == "amlemu service":
            deadline = time.monotonic() + 60
            while not port_file.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            info = json.loads(port_file.read_text())
            verify = info["ca"]
            token = requests.get(f"{info['url']}/msi/token", params={"resource": info["url"]},
                                 headers={"X-IDENTITY-HEADER": info["header"]}, verify=verify, timeout=10).json()
            headers = {"Authorization": f"Bearer {token['access_token']}"}
            # The double's state answers a job it knows: PUT one first.
            url = info["url"] + PATH.replace("/subscriptions/s", "/subscriptions/s")
            requests.put(url, json={"properties": BODY["properties"]}, headers=headers, verify=verify, timeout=10)
        else:
            url, verify, headers = f"https://127.0.0.1:{port}{PATH}", str(tls_files.ca), {"Authorization": TOKEN}  # type: ignore[attr-defined]
            wait_up(url, verify, proc)
        time.sleep(1.0)
        rss = psutil.Process(proc.pid).memory_info().rss
        latencies = sorted(measure(url, verify, headers, clients, count))
        return {"rss_mib": rss / 2**20, "p50_ms": statistics.median(latencies) * 1000,
                "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000, "requests": len(latencies)}
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        kind, *args = sys.argv[2:]
        if kind == "amlemu":
            serve_amlemu(*args)
        else:
            {"starlette": serve_starlette, "aiohttp": serve_aiohttp}[kind](args[0], args[1], int(args[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--requests", type=int, default=50, help="per client")
    args = parser.parse_args()
    from amlemu.service.server import tls  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        files = tls.ensure(work / "tls", ["127.0.0.1", "localhost"])
        for name in ("starlette", "aiohttp", "amlemu service"):
            figures = run_candidate(name, work, files, args.clients, args.requests)
            print(f"{name:16s} idle RSS {figures['rss_mib']:6.1f} MiB   p50 {figures['p50_ms']:6.1f} ms   "
                  f"p99 {figures['p99_ms']:6.1f} ms   ({figures['requests']:.0f} GETs, {args.clients} clients)",
                  flush=True)


if __name__ == "__main__":
    main()
