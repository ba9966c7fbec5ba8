"""Every command of `amlemu`, in every output format it has: a table over the whole command tree.

CASES maps each leaf command's path to the arguments it runs with and how it is run:
- READ: changes nothing; each -o format against the prepared home.
- WRITE: changes the home; each format for real on a fresh copy of the prepared home, and its
  --dry-run in each format against the prepared home itself.
- LIVE: needs live nodes (Docker) or starts a job; each format for real (and its dry run) on the
  live home.
- ONCE: takes its node away; its dry run in each format, then for real once (-o json), live home.
- PLAIN: prints no data (no -o): run once, exit 0 (and its output read, where it is a document).
- ELSEWHERE: runs until Ctrl-C; the named tests run it.

Each run must exit 0; json/jsonc must parse as JSON, yaml/yamlc as YAML, tsv must be rows of
tab-separated fields of one width, none must print nothing. A command added to the tree without a
case fails test_every_command_has_a_case. The prepared home is cheap: process nodes only (one
idle node), a finished run made from records, a local datastore.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner
from conftest import REPO, commands, copy_home

from amlemu.actions import execute
from amlemu.api import Emulator
from amlemu.cli import cli
from amlemu.jobs.jobspec_io import job_to_record
from amlemu.jobs.envyaml import load_environment
from amlemu.jobs.jobyaml import load_job
from amlemu.machines import registry
from amlemu.pipelines.component import load_component
from amlemu.pipelines.registry import Components
from amlemu.specs import ClusterSpec, RunStatus
from amlemu.storage.assets import asset_from_dict
from amlemu.storage.datastores import DatastoreSpec
from amlemu.targets.azureml import WorkspaceRef

READ, WRITE, LIVE, ONCE, PLAIN, ELSEWHERE = "read", "write", "live", "once", "plain", "elsewhere"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Case:
    kind: str
    argv: tuple[str, ...] = ()  # after the command's path; {root}, {work}, {live} filled in


def c(kind: str, *argv: str) -> Case:
    return Case(kind, argv)


UP = "azureml://datastores/localds/paths"
CASES: dict[str, Case] = {
    "workspace show": c(READ),
    "workspace set": c(WRITE, "--name", "other-ws", "--location", "local"),
    "workspace config": c(WRITE, "--path", "{work}/config.json"),
    "compute create": c(WRITE, "-n", "c9", "--backend", "process", "--set", "max_instances=2"),
    "compute list": c(READ),
    "compute show": c(READ, "-n", "c1"),
    "compute delete": c(WRITE, "-n", "c1", "--yes"),
    "compute preempt": c(WRITE, "-n", "low"),
    "compute preemption-policy": c(WRITE, "-n", "low", "--rate-per-node-hour", "2", "--seed", "7"),
    "job create": c(LIVE, "-f", "{live}/job.yml"),
    "job list": c(READ),
    "job show": c(READ, "-n", "done_run"),
    "job stream": c(PLAIN, "-n", "done_run"),
    "job cancel": c(WRITE, "-n", "done_run"),
    "job download": c(WRITE, "-n", "done_run", "--all", "-p", "{work}/dl"),
    "job validate": c(READ, "-f", "{root}/job.yml"),
    "job convert": c(PLAIN, "{root}/submit.py"),
    "environment create": c(WRITE, "-f", "{root}/env.yml", "--version", "7"),
    "environment list": c(READ),
    "environment show": c(READ, "-n", "tree-env"),
    "component create": c(WRITE, "-f", "{root}/comp.yml", "--version", "7"),
    "component list": c(READ),
    "component show": c(READ, "-n", "tree_comp", "--label", "latest"),
    "datastore list": c(READ),
    "datastore show": c(READ, "-n", "localds"),
    "datastore create": c(WRITE, "-n", "newds", "--type", "local", "--path", "{work}/newds"),
    "data upload": c(WRITE, "{root}/up", f"{UP}/up"),
    "data download": c(WRITE, f"{UP}/x", "{work}/down"),
    "data ls": c(READ, f"{UP}/"),
    "data sync": c(WRITE, f"{UP}/x"),
    "data create": c(WRITE, "-n", "tree-data", "-p", f"{UP}/x", "-t", "uri_folder"),
    "data list": c(READ),
    "data show": c(READ, "-n", "tree-asset", "--label", "latest"),
    "data archive": c(WRITE, "-n", "tree-asset", "-v", "1"),
    "model create": c(WRITE, "-n", "tree-model", "-p", "azureml://jobs/done_run/outputs/model"),
    "model list": c(READ),
    "model show": c(READ, "-n", "tree-registered", "-v", "1"),
    "machine add": c(WRITE, "same", "unix:///var/run/docker.sock"),  # this machine's engine, under another name
    "machine list": c(READ),
    "machine remove": c(WRITE, "-n", "m2", "--yes"),
    "fault kill-node": c(WRITE, "c1", "0"),
    "fault partition": c(ONCE, "dkp", "0"),
    "fault slow": c(LIVE, "dk", "0", "--cpus", "0.5"),
    "fault data-error": c(WRITE, "c1", "0", f"{UP}/x/a.txt"),
    "cleanup": c(WRITE, "--all", "--yes"),
    "ui": c(ELSEWHERE, "tests/test_studio.py::test_amlemu_ui_serves_the_page_over_http_until_ctrl_c",
            "tests/test_metrics.py::test_amlemu_ui_mlflow_serves_the_runs_and_stops_its_server_on_ctrl_c"),
    "serve": c(ELSEWHERE, "tests/test_service.py::test_serve_runs_in_the_foreground_until_ctrl_c"),
    # Starts the home's service in the background; the prepared home's cleanup stops it.
    "env": c(PLAIN, "--port", "0"),
}

JOB = """\
code: src
command: python t.py
compute: azureml:c0
environment: {image: python:3.11-slim}
experiment_name: tree
"""


# --- the homes -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory, _homes: set[str]) -> Iterator[Path]:
    """The prepared home (root/home) and the files around it; copied for each WRITE run."""
    root = tmp_path_factory.mktemp("tree")
    emu = Emulator(root / "home", backend="process")
    _homes.add(emu.home.id)
    for folder, files in (("ds/x", {"a.txt": "abc"}), ("ds/out/model", {"w.txt": "weights"}),
                          ("up", {"n.txt": "new"}), ("src", {"t.py": "print('tree')\n"})):
        (root / folder).mkdir(parents=True)
        for name, text in files.items():
            (root / folder / name).write_text(text)
    (root / "job.yml").write_text(JOB + "outputs:\n  model: {type: uri_folder, path: '" + UP + "/out/model'}\n")
    (root / "submit.py").write_text("from azureml.core import ScriptRunConfig\n"
                                    f"src = ScriptRunConfig(source_directory={str(root / 'src')!r}, script='t.py', "
                                    "compute_target='c0')\n")
    try:
        emu.create_compute(ClusterSpec("c0", "STANDARD_D2_V2", max_nodes=1))
        emu.create_compute(ClusterSpec("c1", "STANDARD_D2_V2", min_nodes=1, max_nodes=1))
        emu.create_compute(ClusterSpec("low", "STANDARD_D2_V2", vm_priority="lowpriority", max_nodes=1))
        emu.datastores.create(DatastoreSpec("localds", "local", folder=str(root / "ds")))
        execute(registry.plan_add(emu.store, registry.Machine("m2", "ssh://amlemu@m2.invalid", 4.0, 8 << 30)))
        (root / "env.yml").write_text("name: tree-env\nimage: python:3.11-slim\n"
                                      "conda_file: {dependencies: [python=3.11, {pip: [amlemupin==1.0]}]}\n")
        emu.store.add_environment(load_environment(root / "env.yml"))
        (root / "comp.yml").write_text("name: tree_comp\ncode: src\ncommand: python t.py $[[--n ${{inputs.n}}]]\n"
                                       "environment: {image: 'python:3.11-slim'}\ninputs: {n: {type: integer, optional: true}}\n")
        Components(emu.store).create(load_component(root / "comp.yml"))
        for kind, name in (("data", "tree-asset"), ("model", "tree-registered")):
            emu.assets.create(asset_from_dict(kind, {"name": name, "path": f"{UP}/x"}, base_dir=root))
        cached = emu.home.cache_dir("c1", "c1-node-0") / "data" / "localds" / "x" / "a.txt"
        cached.parent.mkdir(parents=True)
        cached.write_text("abc")
        spec = load_job(root / "job.yml")
        emu.store.add_run("done_run", spec.experiment_name, "c0", job_to_record(spec))
        for status in (RunStatus.QUEUED, RunStatus.PREPARING, RunStatus.RUNNING, RunStatus.FINALIZING,
                       RunStatus.COMPLETED):
            emu.store.set_status("done_run", status, status.value)
        run_dir = emu.home.run_dir("done_run")
        for sub, name, text in (("outputs", "model.txt", "weights"), ("user_logs", "std_log_process_0.txt", "tree\n")):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
            (run_dir / sub / name).write_text(text)
        emu.store.close()
        yield root
    finally:
        Emulator(root / "home").cleanup()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, _homes: set[str]) -> Iterator[Path]:
    """A home with Docker nodes (the faults process nodes do not have) where jobs really start."""
    root = tmp_path_factory.mktemp("tree-live")
    emu = Emulator(root / "home", backend="process")
    _homes.add(emu.home.id)
    (root / "src").mkdir()
    (root / "src" / "t.py").write_text("print('tree')\n")
    (root / "job.yml").write_text(JOB)
    try:
        emu.create_compute(ClusterSpec("c0", "STANDARD_D2_V2", max_nodes=1, idle_seconds_before_scaledown=0))
        for name in ("dk", "dkp"):
            emu.create_compute(ClusterSpec(name, "STANDARD_D2_V2", min_nodes=1, max_nodes=1), backend="docker")
        yield root
    finally:
        emu.cleanup()


class LocalWorkspace:
    """`data sync`'s real workspace, whose datastore is a folder here (the cloud cannot run here)."""

    def __init__(self, root: Path) -> None:
        self.root, self.workspace = root, WorkspaceRef("s", "g", "w")

    def datastore(self, name: str) -> tuple[DatastoreSpec, str | None]:
        return DatastoreSpec(name, "local", account="acct", folder=str(self.root / "cloud")), None


# --- the command tree ------------------------------------------------------------------------------


TREE = dict(commands(cli))


def output_formats(command: click.Command) -> list[str]:
    """The -o formats a command has (none: it prints no data)."""
    for param in command.params:
        if "--output" in param.opts and isinstance(param.type, click.Choice):
            return list(param.type.choices)
    return []


def has_dry_run(command: click.Command) -> bool:
    return any("--dry-run" in param.opts for param in command.params)


def test_every_command_has_a_case() -> None:
    """A command added later fails here until CASES says how to run it."""
    missing, gone = sorted(set(TREE) - set(CASES)), sorted(set(CASES) - set(TREE))
    assert missing == [], f"add a case to CASES in tests/test_cli_tree.py for: {missing}"
    assert gone == [], f"CASES names commands that are gone: {gone}"
    for path, case in CASES.items():
        prints_data = bool(output_formats(TREE[path]))
        assert prints_data == (case.kind not in (PLAIN, ELSEWHERE)), f"{path}: -o {prints_data}, case {case.kind}"


def test_every_data_command_has_every_format() -> None:
    want = ["json", "jsonc", "yaml", "yamlc", "table", "tsv", "none"]
    for path, command in TREE.items():
        if output_formats(command):
            assert sorted(output_formats(command)) == sorted(want), path
            assert any("--query" in p.opts for p in command.params), f"{path} has -o but no --query"


def check_output(fmt: str, out: str, where: str) -> None:
    assert not ANSI.search(out), f"{where}: color escapes without a terminal"
    if fmt in ("json", "jsonc"):
        json.loads(out)
    elif fmt in ("yaml", "yamlc"):
        yaml.safe_load(out)
    elif fmt == "tsv":
        rows = out.splitlines()
        assert len({len(row.split("\t")) for row in rows}) <= 1, f"{where}: rows of different widths:\n{out}"
        assert not out.lstrip().startswith(("{", "[")), f"{where}: JSON, not tsv:\n{out}"
    elif fmt == "none":
        assert out == "", f"{where}: -o none printed {out!r}"


def fill(argv: tuple[str, ...], **where: Path) -> list[str]:
    out = []
    for arg in argv:
        for key, value in where.items():
            arg = arg.replace("{" + key + "}", str(value))
        out.append(arg)
    return out


def invoke(home: Path, argv: list[str], color: bool = False) -> Any:
    return CliRunner().invoke(cli, ["--home", str(home), *argv], env={"AMLEMU_TARGET": "", "AMLEMU_DEBUG": ""},
                              color=color)


def run(home: Path, path: str, argv: list[str], fmt: str | None, dry: bool = False) -> None:
    full = [*path.split(), *argv, *(["--dry-run"] if dry else []), *(["-o", fmt] if fmt else [])]
    result = invoke(home, full)
    where = f"amlemu {' '.join(full)}"
    assert result.exit_code == 0, f"{where}: exit {result.exit_code}\n{result.output}"
    if fmt:
        check_output(fmt, result.stdout, where)


@pytest.mark.parametrize("path", sorted(CASES))
def test_the_command_in_every_format(path: str, template: Path, tmp_path: Path, request: pytest.FixtureRequest,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    case, command = CASES[path], TREE[path]
    monkeypatch.chdir(tmp_path)  # no project's pyproject.toml chooses a target
    formats, dry = output_formats(command), has_dry_run(command)
    if case.kind == ELSEWHERE:
        for named in case.argv:
            file, _, test = named.partition("::")
            assert f"def {test}(" in (REPO / file).read_text(), f"{path}: {named} is gone"
        return
    if case.kind == PLAIN:
        result = invoke(template / "home", [*path.split(), *fill(case.argv, root=template)])
        assert result.exit_code == 0, result.output
        if path == "job convert":
            assert yaml.safe_load(result.stdout)["command"] == "python t.py"
        if path == "env":
            assert "export IDENTITY_ENDPOINT=https://127.0.0.1:" in result.stdout
        return
    if case.kind in (LIVE, ONCE):
        root = request.getfixturevalue("live")
        argv = fill(case.argv, live=root, root=template, work=tmp_path)
        for fmt in formats:
            if dry:
                run(root / "home", path, argv, fmt, dry=True)
            if case.kind == LIVE:
                run(root / "home", path, argv, fmt)
        if case.kind == ONCE:
            run(root / "home", path, argv, "json")
        return
    if case.kind == READ:
        for fmt in formats:
            run(template / "home", path, fill(case.argv, root=template, work=tmp_path), fmt)
        return
    for fmt in formats:  # WRITE: for real on a fresh copy each time, the dry run on the home itself
        work = tmp_path / fmt
        copy_home(template / "home", work / "home")
        monkeypatch.setattr("amlemu.cli.sync.AzureMLTarget", lambda work=work, **_: LocalWorkspace(work))
        if dry:
            run(template / "home", path, fill(case.argv, root=template, work=work), fmt, dry=True)
        run(work / "home", path, fill(case.argv, root=template, work=work), fmt)


def test_colored_formats_are_json_and_yaml_under_the_color(template: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal jsonc/yamlc color the text (ANSI escapes); without them it is the same document.
    (click.echo drops escapes on a stream that is not a terminal: the runner says it is one.)"""
    monkeypatch.setattr("amlemu.cli.output.colored", lambda: True)
    for fmt, parse in (("jsonc", json.loads), ("yamlc", yaml.safe_load)):
        result = invoke(template / "home", ["compute", "show", "-n", "c1", "-o", fmt], color=True)
        assert result.exit_code == 0 and ANSI.search(result.stdout), result.output
        plain = invoke(template / "home", ["compute", "show", "-n", "c1", "-o", fmt[:-1]]).stdout
        assert parse(ANSI.sub("", result.stdout)) == parse(plain)


def test_the_installed_command_answers_version_and_help() -> None:
    """As a user's shell runs it: the console script, its --version and the exit codes in --help."""
    exe = Path(sys.executable).with_name("amlemu")
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "amlemu"]
    done = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0 and re.fullmatch(r"amlemu \d+\.\d+\S*\n", done.stdout), done.stdout + done.stderr
    shown = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert "Exit codes: 0 it worked; 1 an error; 2 " in " ".join(shown.stdout.split())
