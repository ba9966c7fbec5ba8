"""The code snapshot (emulator/jobs/snapshot.py): links out of the code folder are refused everywhere a
job is checked (submit, --dry-run, job validate) with one line naming the link and its target;
links inside arrive as regular files, as Azure ML's upload makes them; fifos never block the copy;
no set-uid bit survives."""
from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from amlemu.api import Emulator
from amlemu.errors import ConfigError
from amlemu.jobs.snapshot import check_code, plan_snapshot, take_snapshot
from amlemu.specs import ClusterSpec, RunStatus
from amlemu.validate import check_links

AMLEMU = [sys.executable, "-c", "from amlemu.cli import main; main()"]


@pytest.fixture
def code(tmp_path: Path) -> Path:
    """A code folder with a script, a sub-folder and a sibling folder outside it."""
    folder = tmp_path / "code"
    (folder / "lib").mkdir(parents=True)
    (folder / "train.py").write_text("print('train')\n")
    (folder / "lib" / "util.py").write_text("X = 1\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("host file\n")
    return folder


# name -> how to make the link(s) inside `code`; each must be refused, naming the link and its target
OUTSIDE = {
    "etc": lambda c: (c / "etc").symlink_to("/etc"),
    "ssl": lambda c: (c / "ssl").symlink_to("/etc/ssl"),  # a folder outside: never walked into
    "up": lambda c: (c / "lib" / "up").symlink_to("../../outside/secret.txt"),  # a `..` chain
    "dots": lambda c: (c / "dots").symlink_to("lib/../../outside"),
    "chain": lambda c: ((c / "hop2").symlink_to("/etc/hostname"), (c / "hop1").symlink_to("hop2")),
    "parent": lambda c: (c / "root").symlink_to(".."),
    "hidden": lambda c: ((c / ".venv" / "bin").mkdir(parents=True),  # ignored itself, but reached
                         (c / ".venv" / "bin" / "python").symlink_to("/usr/bin/env"),
                         (c / "py").symlink_to(".venv/bin/python")),
}


@pytest.mark.parametrize("case", list(OUTSIDE))
def test_a_link_out_of_the_code_folder_is_refused(code: Path, case: str, tmp_path: Path) -> None:
    OUTSIDE[case](code)
    with pytest.raises(ConfigError) as caught:
        check_code(code)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("code: '")
    assert "is a symbolic link to" in message and f"outside the code folder {code}" in message
    assert "copy what it needs into the code folder" in message and "delete the link" in message
    with pytest.raises(ConfigError):
        take_snapshot(code, tmp_path / "snap")
    assert not (tmp_path / "snap").exists()  # nothing half-made


def test_the_message_names_the_link_and_where_it_resolves(code: Path) -> None:
    (code / "lib" / "up").symlink_to("../../outside/secret.txt")
    (code / "hop1").symlink_to("lib/up")
    refused = [str(e) for e in plan_snapshot(code).outside]
    outside = code.parent / "outside" / "secret.txt"
    assert refused == [f"code: 'hop1' is a symbolic link to lib/up ({outside}), outside the code folder {code}; "
                       "copy what it needs into the code folder, delete the link, or leave it out with .amlignore: "
                       "the emulator never copies files from outside the code folder into a run (Azure ML would "
                       "upload the link's target)",
                       f"code: 'lib/up' is a symbolic link to ../../outside/secret.txt ({outside}), outside the "
                       f"code folder {code}; copy what it needs into the code folder, delete the link, or leave "
                       "it out with .amlignore: the emulator never copies files from outside the code folder into "
                       "a run (Azure ML would upload the link's target)"]


def test_links_inside_arrive_as_regular_files_as_azure_ml_uploads_them(code: Path, tmp_path: Path) -> None:
    (code / "alias.py").symlink_to("train.py")
    (code / "lib" / "back.py").symlink_to("../train.py")  # `..` that stays inside
    (code / "shared").symlink_to("lib")  # a folder: its files appear under the link's name
    (code / "two").symlink_to("alias.py")  # a link to a link
    take_snapshot(code, tmp_path / "snap")
    snap = tmp_path / "snap"
    links = [p for p in snap.rglob("*") if p.is_symlink()]
    assert links == []  # blob storage has no links: neither has the snapshot
    assert sorted(p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_file()) == [
        "alias.py", "lib/back.py", "lib/util.py", "shared/back.py", "shared/util.py", "train.py", "two"]
    assert (snap / "two").read_text() == (snap / "shared" / "back.py").read_text() == "print('train')\n"


def test_the_snapshot_holds_what_azure_ml_would_upload(code: Path, tmp_path: Path) -> None:
    """Inside links, the emulator's snapshot and azure-ai-ml's own upload list agree file for file."""
    from azure.ai.ml._utils._asset_utils import get_upload_files_from_folder  # noqa: PLC0415

    (code / "alias.py").symlink_to("train.py")
    (code / "shared").symlink_to("lib")
    (code / "lib" / "two.py").symlink_to("../alias.py")
    take_snapshot(code, tmp_path / "snap")
    uploaded = {dest: Path(src).read_bytes() for src, dest in get_upload_files_from_folder(code)}
    snap = tmp_path / "snap"
    assert {p.relative_to(snap).as_posix(): p.read_bytes() for p in snap.rglob("*") if p.is_file()} == uploaded


def test_a_link_to_a_folder_it_is_in_is_refused(code: Path) -> None:
    (code / "lib" / "again").symlink_to("..")
    with pytest.raises(ConfigError, match=r"^code: 'lib/again' is a symbolic link to \.\., a folder it is in"):
        check_code(code)


def test_fifos_sockets_and_dangling_links_are_skipped_without_blocking(code: Path, tmp_path: Path) -> None:
    os.mkfifo(code / "pipe")  # nobody writes: opening it to read would block forever
    (code / "to_pipe").symlink_to("pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(code / "sock"))
    (code / "gone").symlink_to("missing.txt")
    done = threading.Event()
    worker = threading.Thread(target=lambda: (take_snapshot(code, tmp_path / "snap"), done.set()), daemon=True)
    worker.start()
    worker.join(timeout=20)
    sock.close()
    assert done.is_set(), "the snapshot blocked on a special file"
    assert sorted(p.name for p in (tmp_path / "snap").iterdir()) == ["lib", "train.py"]
    assert sorted(plan_snapshot(code).skipped) == ["gone: a link to missing.txt, which does not exist",
                                                   "pipe: a fifo, not copied", "sock: a socket, not copied",
                                                   "to_pipe: a fifo, not copied"]


def test_copies_drop_set_uid_and_keep_only_the_executable_bit(code: Path, tmp_path: Path) -> None:
    os.chmod(code / "train.py", 0o6777)
    os.chmod(code / "lib" / "util.py", 0o666)
    take_snapshot(code, tmp_path / "snap")
    assert stat.S_IMODE((tmp_path / "snap" / "train.py").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "snap" / "lib" / "util.py").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "snap" / "lib").stat().st_mode) == 0o755


def test_validate_refuses_for_the_emulator_and_warns_for_azure_ml(code: Path) -> None:
    (code / "ssl").symlink_to("/etc/ssl")
    os.mkfifo(code / "pipe")
    here = [f.line() for f in check_links(code, refuse_outside=True)]
    assert here[0].startswith("error: code: 'ssl' is a symbolic link to /etc/ssl, outside the code folder")
    assert here[1] == ("warning: code: pipe: a fifo, not copied; remove it from the code folder "
                       "(Azure ML's upload would try to read it)")
    assert check_links(code, refuse_outside=False)[0].severity == "warning"  # Azure ML uploads the target


# --- the same through the CLI and the API -----------------------------------------------------------
@pytest.fixture
def workspace(tmp_path: Path):
    emu = Emulator(home=tmp_path / "home", backend="process")
    emu.create_compute(ClusterSpec("c1", "STANDARD_D2_V2", max_nodes=1, idle_seconds_before_scaledown=0))
    yield emu
    emu.cleanup()


def _cli(emu: Emulator, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AMLEMU, "--home", str(emu.home.root), *args], capture_output=True, text=True,
                          timeout=120)


def test_submit_dry_run_and_validate_give_the_same_one_line_error(workspace: Emulator, code: Path,
                                                                   tmp_path: Path) -> None:
    (code / "etc").symlink_to("/etc")
    job = tmp_path / "job.yml"
    job.write_text("code: code\ncommand: python train.py\ncompute: azureml:c1\nenvironment: azureml:x@latest\n")
    expected = f"code: 'etc' is a symbolic link to /etc, outside the code folder {code}; copy what it needs"
    with pytest.raises(ConfigError, match="^" + expected.replace(".", r"\.")):
        workspace.submit(job)
    for args in (["job", "create", "-f", str(job)], ["job", "create", "-f", str(job), "--dry-run"]):
        done = _cli(workspace, *args)
        assert done.returncode == 1 and done.stdout == "", done.stdout + done.stderr
        [line] = done.stderr.splitlines()  # one line (a notice would be a second; a traceback many)
        assert line.startswith(f"amlemu: error: {expected}")
    done = _cli(workspace, "job", "validate", "-f", str(job))
    assert done.returncode == 1
    assert f"error: {expected}" in done.stdout and "Traceback" not in done.stdout + done.stderr
    assert workspace.runs() == [] and not (workspace.home.root / "runs").exists()  # nothing created


@pytest.mark.slow
def test_a_job_runs_with_its_inner_links_and_a_fifo_in_its_folder(workspace: Emulator, code: Path,
                                                                   tmp_path: Path) -> None:
    (code / "shared").symlink_to("lib")
    os.mkfifo(code / "pipe")
    (code / "train.py").write_text("import os\nprint(open('shared/util.py').read().strip(), os.path.islink('shared'),"
                                   " os.path.exists('pipe'), flush=True)\n")
    job = tmp_path / "job.yml"
    job.write_text("code: code\ncommand: python train.py\ncompute: azureml:c1\n")
    done = _cli(workspace, "job", "create", "-f", str(job), "--stream")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "X = 1 False False" in done.stdout
    assert "notice: code: pipe: a fifo, not copied" in done.stderr
    [run] = workspace.runs()
    assert run.status is RunStatus.COMPLETED
    plan = json.loads(_cli(workspace, "job", "create", "-f", str(job), "--dry-run").stdout)
    assert {"field": "code", "problem": "pipe: a fifo, not copied", "severity": "warning",
            "fix": "remove it from the code folder (Azure ML's upload would try to read it)"} in plan["findings"]


# --- what is left out: Azure ML's ignore rules ---------------------------------------------------------
IGNORE = """# a comment, then git's patterns
*.log
!keep.log
/top.txt
build/
!build/keep.txt
data/**/*.bin
notes
docs/*.md
"""
TRICKY = {  # path -> is it uploaded (by azure-ai-ml 1.35.2, which the test also asks)
    "train.py": True, "a.log": False, "keep.log": True, "sub/b.log": False, "sub/keep.log": True,
    "top.txt": False, "sub/top.txt": True,  # anchored: only at the top
    "build/x.o": False, "build/deep/y.o": False, "sub/build/z.o": False, "other/build": True,  # folder-only
    "build/keep.txt": True,  # included again under an excluded folder: Azure ML tests files, not folders
    "data/a.bin": False, "data/x/y/z.bin": False, "data/x/keep.txt": True,  # ** spans folders
    "notes": False, "sub/notes/n.txt": False, "docs/r.md": False, "docs/sub/r.md": True,
    "__pycache__/m.pyc": False, "sub/__pycache__/n.pyc": False,  # always left out
    ".git/config": True,  # no fixed list: what the ignore file does not name goes up
    "sub/.amlignore": True, "sub/s.py": True,  # an ignore file below the code folder is not read
}


def _tricky(code: Path, ignore_file: str) -> None:
    for rel in TRICKY:
        (code / rel).parent.mkdir(parents=True, exist_ok=True)
        (code / rel).write_text(rel)
    (code / "sub" / ".amlignore").write_text("*.py\n")
    (code / ignore_file).write_text(IGNORE)
    (code / "bins").symlink_to("data/x")  # its files are tested as data/x/...: bins/y/z.bin is left out
    (code / "docs2").symlink_to("docs")  # docs/*.md tested under docs/: docs2/r.md is left out
    (code / "link.log").symlink_to("train.py")  # a link to a file is tested by its own name
    (code / "secret.log").symlink_to("../outside/secret.txt")  # out of the folder, but left out: not refused
    (code / "sub" / "b.log").unlink()
    (code / "sub" / "b.log").symlink_to("/etc/hostname")  # the same


def _azure_ml_uploads(tmp_path: Path, code: Path) -> dict[str, bytes]:
    """What azure-ai-ml uploads for a command job with this code folder: its component's code, through
    the ignore file it builds (ComponentIgnoreFile), listed by the function its upload uses."""
    from azure.ai.ml import load_job  # noqa: PLC0415
    from azure.ai.ml._utils._asset_utils import get_upload_files_from_folder  # noqa: PLC0415

    (tmp_path / "job.yml").write_text(f"code: {code.name}\ncommand: python train.py\nenvironment: azureml:e@1\n")
    with load_job(tmp_path / "job.yml").component._build_code() as built:
        listed = get_upload_files_from_folder(built.path, ignore_file=built._ignore_file)
    return {dest: Path(src).read_bytes() for src, dest in listed}


@pytest.mark.parametrize("ignore_file", [".amlignore", ".gitignore", "both"])
def test_the_snapshot_leaves_out_what_azure_ml_leaves_out(code: Path, tmp_path: Path, ignore_file: str) -> None:
    _tricky(code, ".amlignore" if ignore_file == "both" else ignore_file)
    if ignore_file == "both":
        (code / ".gitignore").write_text("*\n")  # .amlignore wins: this one is not read
    uploaded = _azure_ml_uploads(tmp_path, code)
    take_snapshot(code, tmp_path / "snap")
    snap = tmp_path / "snap"
    assert {p.relative_to(snap).as_posix(): p.read_bytes() for p in snap.rglob("*") if p.is_file()} == uploaded
    expected = {rel for rel, up in TRICKY.items() if up} | {"lib/util.py", "bins/keep.txt", "docs2/sub/r.md"}
    expected |= {".amlignore", ".gitignore"} if ignore_file == "both" else {ignore_file}
    assert set(uploaded) == expected
    assert not any((snap / d).exists() for d in ("sub/notes", "build/deep", "__pycache__"))  # no empty folders


def test_a_linked_folder_outside_is_refused_even_when_ignored_as_azure_ml_uploads_it(code: Path, tmp_path: Path) -> None:
    (code / "data").symlink_to("../outside")
    (code / ".amlignore").write_text("data\ndata/\n")
    assert "data/secret.txt" in _azure_ml_uploads(tmp_path, code)  # walked into, whatever .amlignore says
    with pytest.raises(ConfigError, match=r"^code: 'data' is a symbolic link to \.\./outside .*, outside the code "
                       r"folder .*; copy what it needs into the code folder or delete the link: .* even one "
                       r"\.amlignore names\)$"):
        check_code(code)


def test_an_ignore_file_git_would_refuse_is_one_line_naming_it(code: Path) -> None:
    (code / ".amlignore").write_text("ok.txt\nbad\\\n")  # a trailing backslash escapes nothing
    with pytest.raises(ConfigError) as caught:
        check_code(code)
    assert str(caught.value).startswith(f"code: {code}/.amlignore: line 2, 'bad\\\\', is not a pattern")
    (code / ".amlignore").unlink()
    os.mkfifo(code / ".amlignore")  # never waited on
    with pytest.raises(ConfigError, match=r"\.amlignore is not a regular file"):
        check_code(code)
