"""Hostile and careless input, table-driven: every case is one line on stderr naming the field and
the fix, a non-zero exit, no traceback, and a home left exactly as it was (nothing half-created).

Each case runs the real CLI in-process against a home of its own, copied from one template made
once per module (a process-backend compute `c1`, a local datastore, a datastore whose endpoint
does not answer, a finished run's record whose name is taken). No node is started.
"""
from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from amlemu.api import Emulator
from amlemu.cli import cli
from amlemu.specs import ClusterSpec
from amlemu.storage.datastores import DatastoreSpec

JOB = ("code: src\ncommand: python train.py\ncompute: azureml:c1\n"
       "environment: azureml:AzureML-acpt-pytorch-2.2-cuda12.1@latest\n")
BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))
DEEP = "a: " + "[" * 200 + "]" * 200 + "\n"
BIG = "#" + "x" * (10 * 1024 * 1024) + "\n"  # 10 MB
BINARY = bytes(range(256)) * 64
SAS = "sv=2030-01-01&sig=NOTREAL"


def job(extra: str = "", base: str = JOB) -> dict[str, str]:
    return {"job.yml": base + extra}


def env_var(name_yaml: str, value: str = "x") -> dict[str, str]:
    return job(f"environment_variables:\n  {name_yaml}: {value}\n")


def corrupt_db(home: Path, files: Path) -> None:
    for suffix in ("-wal", "-shm"):
        Path(f"{home / 'amlemu.db'}{suffix}").unlink(missing_ok=True)
    (home / "amlemu.db").write_bytes(b"this is not a database, it was overwritten " * 200)


def newer_db(home: Path, files: Path) -> None:
    with sqlite3.connect(home / "amlemu.db") as db:
        db.execute("PRAGMA user_version = 99")


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]  # after `--home <home>`; {files} and {home} are filled in
    expect: str  # what the one error line must contain
    code: int = 1
    files: dict[str, str | bytes] = field(default_factory=dict)  # written under {files} first
    stream: str = "stderr"  # stdout: `job validate` prints its findings there
    home_arg: bool = True  # False: the argv names its own --home
    setup: Callable[[Path, Path], None] | None = None  # (home, files) before the home is snapshot


def c(id: str, *argv: str, expect: str, **kw) -> Case:  # noqa: A002 - the table reads better so
    return Case(id, argv, expect, **kw)


JOB_F = ("job", "create", "-f", "{files}/job.yml")
ENV_F = ("environment", "create", "-f", "{files}/env.yml")
ENV_FILE = {"env.yml": "name: good\nimage: python:3.11\n"}
BAD_IMAGES = ["a b", "UPPER/x", ":tag", "x:", "x@sha256:zz", "//x", "a" * 300]


def image_job(ref: str) -> dict[str, str]:
    return job(base=JOB.replace("azureml:AzureML-acpt-pytorch-2.2-cuda12.1@latest", f"{{image: '{ref}'}}"))
VALIDATE_F = ("job", "validate", "-f", "{files}/job.yml")
COMPUTE_F = ("compute", "create", "-f", "{files}/job.yml", "--backend", "process")
DEAD = "azureml://datastores/deadblob/paths/x"

CASES = [
    # --- finding 5: inputs that used to end in a traceback --------------------------------------
    c("binary-job", *JOB_F, expect="is not UTF-8 text", files={"job.yml": BINARY}),
    c("nul-job", *JOB_F, expect="not a YAML text file: character #x0000", files={"job.yml": b"code: src\0\n"}),
    c("binary-validate", *VALIDATE_F, expect="is not UTF-8 text", files={"job.yml": BINARY}, stream="stdout"),
    c("binary-compute", *COMPUTE_F, expect="is not UTF-8 text", files={"job.yml": BINARY}),
    c("folder-job", "job", "create", "-f", "{files}", expect="is a folder; give the path of a job YAML file"),
    c("folder-compute", "compute", "create", "-f", "{files}", expect="is a folder"),
    c("folder-validate", "job", "validate", "-f", "{files}", expect="is a folder", stream="stdout"),
    c("bomb-job", *JOB_F, expect="expands to more than", files={"job.yml": BOMB}),
    c("bomb-compute", *COMPUTE_F, expect="expands to more than", files={"job.yml": BOMB}),
    c("bomb-validate", *VALIDATE_F, expect="expands to more than", files={"job.yml": BOMB}, stream="stdout"),
    c("bomb-set", *JOB_F, "--set", "inputs.x=[*a, *a]", expect="--set inputs.x: YAML syntax error", files=job()),
    c("deep-job", *JOB_F, expect="nests deeper than", files={"job.yml": DEEP}),
    c("home-is-a-file", "--home", "{files}/afile", "compute", "list", expect="is a file, not a folder",
      files={"afile": "x"}, home_arg=False),
    c("home-is-proc", "--home", "/proc/self", "compute", "list", expect="is not a folder this user can write",
      home_arg=False),
    c("home-missing", "--home", "{files}/typo", "compute", "list", expect="does not exist; create it first (mkdir -p",
      home_arg=False),
    c("corrupt-db-compute-list", "compute", "list", expect="is corrupt", setup=corrupt_db),
    c("corrupt-db-job-list", "job", "list", expect="amlemu cleanup --reset-state", setup=corrupt_db),
    c("corrupt-db-workspace", "workspace", "show", expect="state database", setup=corrupt_db),
    c("corrupt-db-cleanup", "cleanup", "--yes", expect="amlemu cleanup --reset-state", setup=corrupt_db),
    c("newer-db", "compute", "list", expect="written by a newer amlemu", setup=newer_db),
    c("newer-db-cleanup", "cleanup", "--yes", expect="upgrade amlemu", setup=newer_db),
    c("download-into-file", "job", "download", "taken_name", "--download-path", "{files}/afile",
      expect="--download-path: ", files={"afile": "x"}),
    c("local-datastore-on-a-file", "datastore", "create", "--name", "fileds", "--type", "local",
      "--path", "{files}/afile", expect="is a file; give a folder", files={"afile": "x"}),
    c("unreachable-blob-ls", "data", "ls", DEAD, expect="datastore deadblob: cannot reach 127.0.0.1:9"),
    c("unreachable-blob-download", "data", "download", DEAD, "{files}/out", expect="cannot reach 127.0.0.1:9"),
    c("unreachable-blob-upload", "data", "upload", "{files}/afile", DEAD, expect="cannot reach 127.0.0.1:9",
      files={"afile": "x"}),
    # --- finding 6: input that used to be accepted or lost silently ----------------------------
    c("job-name-leading-dash", *JOB_F, expect="name: -bad is not a valid job name", files=job("name: '-bad'\n")),
    c("job-name-slash", *JOB_F, expect="not a valid job name", files=job("name: a/../b\n")),
    c("job-name-too-long", *JOB_F, expect="not a valid job name", files=job(f"name: {'n' * 256}\n")),
    c("job-name-not-a-string", *JOB_F, expect="not a valid job name", files=job("name: [a]\n")),
    c("job-name-taken", *JOB_F, expect="a job named 'taken_name' already exists", files=job("name: taken_name\n")),
    c("job-name-taken-dry-run", *JOB_F, "--dry-run", expect="already exists", files=job("name: taken_name\n")),
    c("job-name-taken-validate", *VALIDATE_F, expect="name: a job named 'taken_name' already exists",
      files=job("name: taken_name\n"), stream="stdout"),
    c("env-name-with-equals", *JOB_F, expect="environment_variables.A=B: is not a valid variable name",
      files=env_var('"A=B"')),
    c("env-name-with-newline", *JOB_F, expect=r"environment_variables.'A\nB': is not a valid", files=env_var('"A\\nB"')),
    c("env-name-leading-digit", *JOB_F, expect="environment_variables.1A: is not a valid", files=env_var('"1A"')),
    c("env-name-empty", *JOB_F, expect="environment_variables.'': is not a valid", files=env_var('""')),
    c("env-name-not-a-string", *JOB_F, expect="environment_variables.12: is not a valid", files=env_var("12")),
    c("env-reserved-azureml", *JOB_F, expect="environment_variables.AZUREML_RUN_ID: is set by the platform",
      files=env_var("AZUREML_RUN_ID")),
    c("env-reserved-batch", *JOB_F, expect="AZ_BATCH_MASTER_NODE: is set by the platform",
      files=env_var("AZ_BATCH_MASTER_NODE")),
    c("env-reserved-master", *JOB_F, expect="MASTER_ADDR: is set by the platform", files=env_var("MASTER_ADDR")),
    c("env-reserved-ompi", *JOB_F, expect="OMPI_MCA_plm: is set by the platform", files=env_var("OMPI_MCA_plm")),
    c("env-reserved-amlemu", *JOB_F, expect="AMLEMU_HOME: is set by the platform", files=env_var("AMLEMU_HOME")),
    c("env-reserved-mlflow", *JOB_F, expect="MLFLOW_TRACKING_URI: is set by the platform",
      files=env_var("MLFLOW_TRACKING_URI")),
    c("env-reserved-by-set", *JOB_F, "--set", "environment_variables.RANK=3", expect="RANK: is set by the platform",
      files=job()),
    c("env-reserved-validate", *VALIDATE_F, expect="error: environment_variables.WORLD_SIZE: is set by the platform",
      files=env_var("WORLD_SIZE"), stream="stdout"),
    c("env-bad-name-validate", *VALIDATE_F, expect="error: environment_variables.A=B: is not a valid",
      files=env_var('"A=B"'), stream="stdout"),
    c("env-value-nul", *JOB_F, expect="contains a NUL character", files=env_var("A", '"x\\0y"')),
    c("env-value-huge", *JOB_F, expect="a process's variable holds at most", files=env_var("A", "y" * 200_000)),
    c("ten-mb-job", *JOB_F, expect="is over 1024 KiB", files={"job.yml": BIG}),
    c("ten-mb-validate", *VALIDATE_F, expect="is over 1024 KiB", files={"job.yml": BIG}, stream="stdout"),
    c("ten-mb-compute", *COMPUTE_F, expect="is over 1024 KiB", files={"job.yml": BIG}),
    c("datastore-name-dotdot", "datastore", "create", "--name", "../x", "--type", "local", "--path", "{files}/d",
      expect="name: ../x is not a valid datastore name"),
    c("datastore-name-hyphen", "datastore", "create", "--name", "my-data", "--type", "azurite",
      "--container-name", "data", expect="not a valid datastore name"),
    c("subscription-not-a-guid", "workspace", "set", "--subscription-id", "not-a-guid",
      expect="--subscription-id: not-a-guid is not a subscription id"),
    c("workspace-name-bad", "workspace", "set", "--name", "../ws", expect="--name: ../ws is not a valid workspace"),
    c("resource-group-bad", "workspace", "set", "--resource-group", "rg.", expect="--resource-group: rg. is not"),
    c("data-ls-missing", "data", "ls", "azureml://datastores/localds/paths/absent",
      expect="path 'azureml://datastores/localds/paths/absent' not found"),
    # --- the earlier clear cases -----------------------------------------------------------------
    c("size-unknown", "compute", "create", "--name", "c2", "--size", "STANDARD_XL9", expect="vm_size: unknown size"),
    c("min-above-max", "compute", "create", "--name", "c2", "--min-instances", "3", "--max-instances", "2",
      expect="max_nodes: 2 is below min_nodes 3"),
    c("min-negative", "compute", "create", "--name", "c2", "--min-instances", "-1", expect="min_nodes: must be a non-negative"),
    c("min-not-int", "compute", "create", "--name", "c2", "--min-instances", "abc", expect="'abc' is not a valid integer",
      code=2),
    c("compute-no-name", "compute", "create", expect="--name: missing"),
    c("compute-bad-name", "compute", "create", "--name", "1bad", expect="name: '1bad' is not a valid compute name"),
    c("compute-bad-tier", "compute", "create", "--name", "c2", "--tier", "spot", expect="vm_priority: 'spot' is not"),
    c("compute-yaml-unknown-field", *COMPUTE_F, expect="colour: unknown field", files={"job.yml": "name: c2\ncolour: red\n"}),
    c("compute-yaml-type", *COMPUTE_F, expect="type: 'kubernetes' is not emulated",
      files={"job.yml": "name: c2\ntype: kubernetes\n"}),
    c("compute-yaml-list", *COMPUTE_F, expect="compute: the YAML must be a mapping", files={"job.yml": "- a\n- b\n"}),
    c("compute-exists", "compute", "create", "--name", "c1", "--backend", "process", expect="compute 'c1' already exists"),
    c("compute-show-missing", "compute", "show", "nope", expect="compute 'nope' not found", code=3),
    c("compute-delete-missing", "compute", "delete", "nope", expect="compute 'nope' not found"),
    c("job-show-missing", "job", "show", "nope", expect="job 'nope' not found", code=3),
    c("job-cancel-missing", "job", "cancel", "nope", expect="job 'nope' not found"),
    c("job-file-missing", "job", "create", "-f", "{files}/absent.yml", expect="absent.yml does not exist"),
    c("validate-file-missing", "job", "validate", "-f", "{files}/absent.yml", expect="does not exist", stream="stdout"),
    c("job-unknown-compute", *JOB_F, expect="compute: 'nope' does not exist in the workspace (computes: c1)", files=job(base=JOB.replace("c1", "nope"))),
    c("job-too-many-nodes", *JOB_F, expect="resources.instance_count: 5 nodes exceed max_instances 2",
      files=job("resources: {instance_count: 5}\ndistribution: {type: mpi}\n")),
    c("job-instance-count-negative", *JOB_F, expect="resources.instance_count: must be at least 1",
      files=job("resources: {instance_count: -2}\n")),
    c("job-instance-count-text", *JOB_F, expect="must be an integer, got 'two'", files=job("resources: {instance_count: two}\n")),
    c("set-not-key-value", *JOB_F, "--set", "nope", expect="--set: 'nope' is not key=value", files=job()),
    c("set-bad-yaml", *JOB_F, "--set", "inputs.x=[", expect="--set inputs.x: YAML syntax error", files=job()),
    c("uri-not-a-datastore-uri", *JOB_F, expect="inputs.d.path: 'azureml://datastores/ws/mnist' is not a datastore URI",
      files=job("inputs:\n  d: {path: 'azureml://datastores/ws/mnist'}\n")),
    c("uri-dotdot", *JOB_F, expect="contains '..'", files=job("inputs:\n  d: {path: 'azureml://datastores/localds/paths/a/../../e'}\n")),
    c("input-mode-rw", *JOB_F, expect="inputs.d.mode: rw_mount is not allowed here",
      files=job("inputs:\n  d: {path: src, mode: rw_mount}\n")),
    c("input-mode-unknown", *JOB_F, expect="inputs.d.mode: 'eval_mount' is not a data mode",
      files=job("inputs:\n  d: {path: src, mode: eval_mount}\n")),
    c("output-local-path", *JOB_F, expect="outputs.o.path: './out' is not a datastore URI",
      files=job("outputs:\n  o: {path: ./out}\n")),
    c("input-unknown-datastore", *JOB_F, expect="inputs.d.path: datastore 'other' not found",
      files=job("inputs:\n  d: {path: 'azureml://datastores/other/paths/x'}\n")),
    c("yaml-syntax", *JOB_F, expect="YAML syntax error at line", files={"job.yml": "code: src\ncommand: [python\n"}),
    c("yaml-not-a-mapping", *JOB_F, expect="job: the YAML must be a mapping", files={"job.yml": "- a\n"}),
    c("unknown-field", *JOB_F, expect="bogus: unknown field", files=job("bogus: 1\n")),
    c("command-missing", *JOB_F, expect="command: missing", files={"job.yml": "code: src\ncompute: c1\n"}),
    c("code-missing", *JOB_F, expect="code: ", files=job(base=JOB.replace("code: src", "code: nowhere"))),
    c("script-missing", *JOB_F, expect="script missing.py not found", files=job(base=JOB.replace("train.py", "missing.py"))),
    c("distribution-unknown", *JOB_F, expect="distribution.type: 'ray' is not supported",
      files=job("distribution: {type: ray}\n")),
    c("type-sweep", *JOB_F, expect="code: is the trial's, not the sweep's; move it under trial:",
      files=job("type: sweep\n")),
    c("timeout-zero", *JOB_F, expect="limits.timeout: must be a positive number", files=job("limits: {timeout: 0}\n")),
    c("datastore-bad-type", "datastore", "create", "--name", "d2", "--type", "s3", expect="--type", code=2),
    c("datastore-missing-secret", "datastore", "create", "--name", "d2", "--type", "azure_blob", "--account-name", "a",
      "--container-name", "data", "--sas-token-env", "UNSET_VAR_FOR_TEST", expect="$UNSET_VAR_FOR_TEST: is empty or unset"),
    c("datastore-exists", "datastore", "create", "--name", "localds", "--type", "local", "--path", "{files}",
      expect="datastore 'localds' already exists"),
    c("datastore-show-missing", "datastore", "show", "nope", expect="datastore 'nope' not found", code=3),
    c("data-ls-bad-uri", "data", "ls", "wasbs://c@a/x", expect="is not a datastore URI"),
    c("data-upload-missing-local", "data", "upload", "{files}/absent", DEAD, expect="does not exist", code=2),
    c("kill-missing-node", "fault", "kill-node", "c1", "3", expect="node '3 of compute c1' not found"),
    c("preempt-dedicated", "compute", "preempt", "c1", expect="only low-priority nodes are preempted"),
    c("unknown-target", *JOB_F, "--target", "nope", expect="--target", code=2, files=job()),
    c("unknown-command", "frobnicate", expect="No such command 'frobnicate'", code=2),
    c("unknown-option", "compute", "list", "--colour", expect="No such option '--colour'; see `", code=2),
    # --- issue 25: limits as AmlCompute has them, names checked before anything is stored ---------
    *[c(f"image-{i}", *JOB_F, expect="environment.image: ", files=image_job(ref)) for i, ref in enumerate(BAD_IMAGES)],
    c("image-validate", *VALIDATE_F, expect="error: environment.image: a b is not an image reference",
      files=image_job("a b"), stream="stdout"),
    c("image-by-reference", *JOB_F, expect="environment: a b is not an image reference",
      files=job(base=JOB.replace("azureml:AzureML-acpt-pytorch-2.2-cuda12.1@latest", "'a b'"))),
    c("max-instances-billion", "compute", "create", "--name", "c2", "--max-instances", "1000000000",
      expect="max_nodes: 1000000000 is above AmlCompute's limit of 65000"),
    c("max-instances-over-quota", "compute", "create", "--name", "c2", "--max-instances", "101",
      expect="quota of 100 per cluster"),
    c("max-instances-fraction", *COMPUTE_F, expect="max_nodes: must be a non-negative integer, got 1.5",
      files={"job.yml": "name: c2\nmax_instances: 1.5\n"}),
    c("idle-time-huge", "compute", "create", "--name", "c2", "-d", str(99999999999 * 86400),
      expect="more than Azure ML's duration holds"),
    c("experiment-300", *JOB_F, expect="experiment_name: ", files=job(f"experiment_name: {'e' * 300}\n")),
    c("experiment-non-ascii", *JOB_F, expect="experiment_name: caf\u00e9 is not a valid experiment name",
      files=job("experiment_name: caf\u00e9\n")),
    c("experiment-nul", *JOB_F, expect="experiment_name: 'a\\x00b' is not", files=job('experiment_name: "a\\0b"\n')),
    c("display-name-100kb", *JOB_F, expect="display_name: ", files=job(f"display_name: {'d' * 100_000}\n")),
    *[c(f"env-create-{label}", *ENV_F, *extra, expect=words, files=ENV_FILE) for label, extra, words in [
        ("dotdot", ("-n", "../../evil"), "name: ../../evil is not a valid environment name"),
        ("spaced", ("-n", " spaced "), "name: ' spaced ' is not a valid environment name"),
        ("version-dotdot", ("--version", "../1"), "version: ../1 is not a valid environment version"),
        ("newline", ("-n", "a\nb"), "name: 'a\\nb' is not a valid"),
        ("long", ("-n", "n" * 256), "(256 characters) is not a valid environment name"),
        ("script", ("-n", "<script>"), "name: <script> is not a valid"),
        ("escape", ("-n", "a\x1b]0;x\x07"), "name: 'a\\x1b]0;x\\x07' is not")]],
    c("env-create-nul", *ENV_F, expect="name: 'a\\x00b' is not a valid", files={"env.yml": 'name: "a\\0b"\nimage: x\n'}),
    c("deep-query", "job", "list", "--query", "[" * 5000 + "]" * 5000, expect="nests too deeply", code=2),
]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    emu = Emulator(root / "home", backend="process")
    emu.create_compute(ClusterSpec("c1", "STANDARD_D2_V2", max_nodes=2))
    emu.datastores.create(DatastoreSpec("localds", "local", folder=str(root / "localds")))
    emu.datastores.create(DatastoreSpec("deadblob", "azure_blob", container="data", account="acct",
                                        credential="sas", endpoint="http://127.0.0.1:9"), SAS)
    emu.store.add_run("taken_name", "exp", "c1", {"note": "a finished run's record"})
    emu.store.close()
    return root / "home"


def snapshot(home: Path) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """Every file's size and mtime (the database's noise files aside) and the database's rows."""
    files = {str(p.relative_to(home)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(home.rglob("*"))
             if not p.name.startswith("amlemu.db")}
    try:
        with sqlite3.connect(f"file:{home / 'amlemu.db'}?mode=ro", uri=True) as db:
            rows = list(db.iterdump())
    except sqlite3.DatabaseError:
        rows = [(home / "amlemu.db").read_bytes().hex()]  # a corrupt database: its bytes must not change
    return files, rows


@pytest.fixture
def world(template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    home, files = tmp_path / "home", tmp_path / "files"
    shutil.copytree(template, home)
    (files / "src").mkdir(parents=True)
    (files / "src" / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)  # no project's pyproject.toml chooses a target
    for var in ("AMLEMU_TARGET", "AMLEMU_DEBUG", "AMLEMU_HOME"):
        monkeypatch.delenv(var, raising=False)
    yield home, files
    if home.is_dir() and any((home / "runs").glob("*")):  # a case that wrongly launched: stop it
        Emulator(home).cleanup()


def fill(text: str, home: Path, files: Path) -> str:
    return text.replace("{files}", str(files)).replace("{home}", str(home))


# A hostile file (a YAML bomb, /dev/zero) must not hang the CLI: a hang fails here. A deadline, not
# a speed check: the first `job validate` in a worker imports azure-ai-ml, 25 s on a loaded machine.
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_one_line_and_changes_nothing(case: Case, world) -> None:
    home, files = world
    for name, content in case.files.items():
        path = files / name
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    if case.setup:
        case.setup(home, files)
    before = snapshot(home)
    argv = [fill(a, home, files) for a in case.argv]
    result = CliRunner().invoke(cli, (["--home", str(home)] if case.home_arg else []) + argv)
    output = result.stdout + result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), output
    assert "Traceback" not in output
    assert result.exit_code == case.code, output
    if case.stream == "stderr":
        assert result.stderr.endswith("\n") and result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith("amlemu: error: ") and case.expect in result.stderr, result.stderr
    else:  # job validate: the findings on stdout, nothing on stderr
        assert result.stderr == ""
        assert any(line.startswith("error: ") and case.expect in line for line in result.stdout.splitlines()), output
    assert snapshot(home) == before, "the home changed"
    assert not (files / "out").exists()


def test_there_are_at_least_sixty_cases() -> None:
    assert len(CASES) >= 60 and len({case.id for case in CASES}) == len(CASES)


# --- what a table row cannot show ------------------------------------------------------------------
def run_cli(home: Path, *argv: str, **kw):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, ["--home", str(home), *argv], **kw)


@pytest.mark.timeout(60)  # a bomb expanded would not end: a deadline, not a speed check
def test_the_alias_bomb_fails_fast_in_bounded_memory(world) -> None:
    home, files = world
    (files / "job.yml").write_text(BOMB)
    tracemalloc.start()
    try:
        result = run_cli(home, "job", "create", "-f", str(files / "job.yml"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.exit_code == 1 and "expands to more than" in result.stderr
    assert peak < 50 * 2**20, peak


@pytest.mark.parametrize("argv", [["--home", "{file}", "compute", "list"], ["job", "create", "-f", "{bomb}"],
                                  ["--home", "{home}", "job", "list"], ["nonsense"]])
def test_the_real_command_prints_one_line_and_no_traceback(tmp_path: Path, argv: list[str]) -> None:
    """The installed entry point, in a process of its own (the in-process runner could hide what
    Python prints on its way out)."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "bomb.yml").write_text(BOMB)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "amlemu.db").write_bytes(b"garbage" * 1000)
    values = {"{file}": str(tmp_path / "file"), "{bomb}": str(tmp_path / "bomb.yml"), "{home}": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-m", "amlemu", *[values.get(a, a) for a in argv]], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "AMLEMU_HOME": str(tmp_path / "home")})
    assert done.returncode in (1, 2) and "Traceback" not in done.stdout + done.stderr
    assert done.stderr.startswith("amlemu: error: ") and done.stderr.count("\n") == 1, done.stderr


def test_a_conda_url_or_a_broken_marker_is_left_out_with_a_notice_not_a_bug(world) -> None:
    """Issue 25: a URL as a conda (non-pip) dependency was installed, fetched from anywhere; a
    newline inside a pip line's marker was "this is a bug". Both are left out, each with a notice."""
    home, files = world
    conda = ('{dependencies: [python=3.11, "https://example.com/evil.whl", "numpy @ https://example.com/e.whl", '
             '{pip: ["tqdm; python_version > \\"3\\n\\""]}]}')
    (files / "job.yml").write_text(JOB.replace("azureml:AzureML-acpt-pytorch-2.2-cuda12.1@latest",
                                               f"{{image: 'python:3.11', conda_file: {conda}}}"))
    result = run_cli(home, "job", "create", "-f", str(files / "job.yml"), "--dry-run", "-o", "json")
    assert result.exit_code == 0 and "this is a bug" not in result.output, result.output
    assert result.stdout.count("is not installed here") == 3, result.stdout
