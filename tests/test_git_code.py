"""`code: git+http(s)://host/org/repo[.git][@ref][#subdirectory=path]`: the repository is cloned at
submit (shallow, no hooks, no submodules, never a prompt) into the run's snapshot, then removed.
The repositories here are bare ones made in tmp and served on loopback: by git's smart HTTP
(`git http-backend` behind wsgiref: what GitHub and Azure DevOps speak, shallow clones included)
and by a plain file server (dumb HTTP, which cannot clone shallowly: the history is cloned)."""
from __future__ import annotations

import functools
import http.server
import os
import subprocess
import tempfile
import threading
import wsgiref.simple_server
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from amlemu.api import Emulator
from amlemu.errors import ConfigError
from amlemu.jobs import gitcode
from amlemu.jobs.jobspec_io import job_from_record, job_to_record
from amlemu.jobs.jobyaml import job_from_dict, load_job
from amlemu.specs import RunStatus

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "init.defaultBranch=main"]


def make_repo(root: Path) -> tuple[Path, str]:
    """A bare repository with two commits on main (the second adds src/train.py) and a branch v1."""
    work = root / "work"
    work.mkdir(parents=True)
    run = functools.partial(subprocess.run, check=True, capture_output=True, cwd=work)
    run([*GIT, "init", "-q"])
    (work / "README.md").write_text("first\n")
    run([*GIT, "add", "."])
    run([*GIT, "commit", "-qm", "first"])
    first = run(["git", "rev-parse", "HEAD"], text=True).stdout.strip()
    run([*GIT, "branch", "v1"])
    (work / "src").mkdir()
    (work / "src" / "train.py").write_text("import sys\nprint('from git:', ' '.join(sys.argv[1:]))\n")
    run([*GIT, "add", "."])
    run([*GIT, "commit", "-qm", "second"])
    bare = root / "srv" / "repo.git"
    subprocess.run([*GIT, "clone", "-q", "--bare", str(work), str(bare)], check=True, capture_output=True)
    subprocess.run(["git", "update-server-info"], cwd=bare, check=True)  # what a dumb-HTTP client reads
    return bare, first


def smart_http(project_root: Path) -> Callable:
    """git http-backend (CGI) as a WSGI app: git's smart HTTP protocol."""
    def app(environ: dict, start_response: Callable) -> list[bytes]:
        env = {k: v for k, v in environ.items() if isinstance(v, str)}
        env.update(GIT_PROJECT_ROOT=str(project_root), GIT_HTTP_EXPORT_ALL="1", PATH=os.environ["PATH"])
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, check=True).stdout
        head, _, payload = out.partition(b"\r\n\r\n")
        headers = [tuple(line.split(": ", 1)) for line in head.decode().split("\r\n") if ": " in line]
        status = next((v for k, v in headers if k.lower() == "status"), "200 OK")
        start_response(status, [(k, v) for k, v in headers if k.lower() != "status"])
        return [payload]
    return app


class QuietWsgi(wsgiref.simple_server.WSGIRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


class QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[dict[str, str]]:
    """{"smart": URL, "dumb": URL, "first": the first commit} of one repository."""
    bare, first = make_repo(tmp_path / "git")
    smart = wsgiref.simple_server.make_server("127.0.0.1", 0, smart_http(bare.parent), handler_class=QuietWsgi)
    dumb = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietFiles, directory=str(bare.parent)))
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (smart, dumb)]
    for thread in threads:
        thread.start()
    yield {"smart": f"http://127.0.0.1:{smart.server_address[1]}/repo.git",
           "dumb": f"http://127.0.0.1:{dumb.server_address[1]}/repo.git", "first": first}
    for server in (smart, dumb):
        server.shutdown()
        server.server_close()


# --- pure ----------------------------------------------------------------------------------------
def test_a_git_code_url_parses_to_its_repository_ref_and_folder() -> None:
    code = gitcode.parse_git_code("git+https://github.com/org/repo.git@v1.2#subdirectory=cli/jobs")
    assert (code.repo, code.ref, code.subdir) == ("https://github.com/org/repo.git", "v1.2", "cli/jobs")
    assert gitcode.parse_git_code("git+https://h/org/repo#src").subdir == "src"
    assert gitcode.parse_git_code("git+http://127.0.0.1:8080/repo.git").ref is None
    for url, said in (("git+ssh://git@h/org/repo.git", "only git+https://"), ("git+file:///etc", "only git+https://"),
                      ("git+https://user:tok@h/r.git", "a credential in the URL"),
                      ("git+https://h/r.git#subdirectory=../..", "leaves the repository"),
                      ("git+https://h/r.git@-upload-pack=x", "is not a branch, tag or commit"),
                      ("git+http://169.254.169.254/r.git", "link-local address")):
        with pytest.raises(ConfigError) as refused:
            gitcode.parse_git_code(url)
        assert str(refused.value).startswith(f"code: {url}") and said in str(refused.value), str(refused.value)


def test_the_clone_is_shallow_runs_no_hook_fetches_no_submodule_and_takes_only_http() -> None:
    code = gitcode.parse_git_code("git+https://h/org/repo.git@main")
    argv = gitcode.clone_argv(code, "/tmp/x")
    assert argv[:1] == ["git"] and argv[-3:] == ["--", "https://h/org/repo.git", "/tmp/x"]
    settings = [argv[i + 1] for i, a in enumerate(argv) if a == "-c"]
    assert {"core.hooksPath=/dev/null", "protocol.allow=never", "protocol.https.allow=always"} <= set(settings)
    assert argv[argv.index("clone"):argv.index("--")] == ["clone", "--quiet", "--no-recurse-submodules", "--depth", "1",
                                                          "--branch", "main"]
    assert "--depth" not in gitcode.clone_argv(code, "/tmp/x", shallow=False)
    commit = gitcode.parse_git_code("git+https://h/r.git@" + "a" * 40)
    assert "--branch" not in gitcode.clone_argv(commit, "/d") and "--no-checkout" in gitcode.clone_argv(commit, "/d")
    assert gitcode.checkout_argv(commit, "/d")[-3:] == ["--detach", "a" * 40, "--"]
    assert gitcode.checkout_argv(code, "/d") is None
    env = gitcode.git_env({"PATH": "/bin"})
    assert env["GIT_TERMINAL_PROMPT"] == "0" and env["PATH"] == "/bin"


def test_a_job_with_git_code_loads_keeps_its_url_and_says_it_is_cloned(tmp_path: Path) -> None:
    url = "git+https://github.com/org/repo.git@main#subdirectory=src"
    job = job_from_dict({"command": "python train.py", "code": url, "compute": "azureml:c1"}, base_dir=tmp_path)
    assert job.code is None and job.code_git == url
    assert job_from_record(job_to_record(job)) == job
    assert any(n.startswith(f"code: {url} is cloned at submit") for n in job.notices)


# --- cloned ----------------------------------------------------------------------------------------
def test_clones_over_smart_and_dumb_http_at_a_branch_or_a_commit(served: dict[str, str], tmp_path: Path) -> None:
    for kind in ("smart", "dumb"):
        folder = gitcode.clone(gitcode.parse_git_code(f"git+{served[kind]}#subdirectory=src"), tmp_path / kind)
        assert (folder / "train.py").is_file() and not (tmp_path / kind / ".git").exists()
    old = gitcode.clone(gitcode.parse_git_code(f"git+{served['smart']}@v1"), tmp_path / "v1")
    assert sorted(p.name for p in old.iterdir()) == ["README.md"]
    pinned = gitcode.clone(gitcode.parse_git_code(f"git+{served['dumb']}@{served['first']}"), tmp_path / "pinned")
    assert sorted(p.name for p in pinned.iterdir()) == ["README.md"]
    with pytest.raises(ConfigError, match=r"^code: git\+http://.*@nobranch cannot be cloned here \(.*nobranch"):
        gitcode.clone(gitcode.parse_git_code(f"git+{served['smart']}@nobranch"), tmp_path / "none")


def test_an_unreachable_or_offline_repository_is_refused_at_submit_in_one_line(emu_process: Emulator, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import socket  # noqa: PLC0415

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there once closed
    (tmp_path / "job.yml").write_text(f"command: python train.py\ncode: git+http://127.0.0.1:{port}/repo.git\n")
    with pytest.raises(ConfigError) as refused:
        emu_process.submit(tmp_path / "job.yml")
    line = str(refused.value)
    assert line.startswith(f"code: git+http://127.0.0.1:{port}/repo.git cannot be cloned here (") and "\n" not in line
    assert "set code: to that folder" in line and emu_process.store.runs() == []
    monkeypatch.setenv("AMLEMU_OFFLINE", "1")
    for attempt in (emu_process.plan_job, emu_process.submit):  # the dry run too: nothing is tried
        with pytest.raises(ConfigError, match=r"^code: .* cannot be cloned here \(AMLEMU_OFFLINE is set"):
            attempt(load_job(tmp_path / "job.yml"))


@pytest.fixture
def emu_process(home: Path) -> Emulator:
    return Emulator(home, backend="process")


@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_a_job_runs_a_script_from_a_git_repository(emu: Emulator, cluster, served: dict[str, str],
                                                   tmp_path: Path) -> None:
    cluster(max_nodes=1)
    (tmp_path / "job.yml").write_text(f"command: python train.py --lr 0.1\ncode: git+{served['smart']}@main#src\n"
                                      "compute: azureml:c1\n")
    before = set(Path(tempfile.gettempdir()).glob("amlemu-git-*"))
    run = emu.submit(tmp_path / "job.yml")
    assert set(Path(tempfile.gettempdir()).glob("amlemu-git-*")) == before  # the clone is gone
    assert sorted(p.name for p in (run.dir / "snapshot").iterdir()) == ["train.py"]
    assert run.wait(timeout=120) is RunStatus.COMPLETED, run.record.error
    assert "from git: --lr 0.1" in run.logs()
    (tmp_path / "bad.yml").write_text(f"command: python nope.py\ncode: git+{served['smart']}#src\ncompute: azureml:c1\n")
    with pytest.raises(ConfigError, match=r"^command: script nope.py not found in git\+http"):
        emu.submit(tmp_path / "bad.yml")
