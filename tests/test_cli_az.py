"""The command line as `az ml` scripts use it: -n/--name (and the positional alias), -g/-w/--subscription,
-o/--query, az's exit codes, --yes, job list --max-results, job download --output-name/--all,
compute create --set, --version. The whole tree in every format: test_cli_tree.py."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from conftest import REPO

from amlemu.api import Emulator
from amlemu.cli import azshape, cli
from amlemu.cli import output as formats
from amlemu.errors import TargetError
from amlemu.jobs.jobspec_io import job_to_record
from amlemu.jobs.jobyaml import load_job
from amlemu.specs import ClusterSpec, RunStatus
from amlemu.storage.datastores import DatastoreSpec
from amlemu.targets import WorkspaceOptions
from amlemu.targets.azureml import AzureMLTarget, WorkspaceRef, resolve_workspace

UP = "azureml://datastores/localds/paths"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _homes: set[str]) -> Iterator[Path]:
    """A home with a compute (an idle process node), a local datastore and three ended runs, the
    last with a named output `model` written to the datastore."""
    monkeypatch.chdir(tmp_path)  # no project's pyproject.toml chooses a target
    monkeypatch.delenv("AMLEMU_TARGET", raising=False)
    emu = Emulator(tmp_path / "home", backend="process")
    _homes.add(emu.home.id)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "t.py").write_text("print(1)\n")
    (tmp_path / "ds" / "out" / "model").mkdir(parents=True)
    (tmp_path / "ds" / "out" / "model" / "w.txt").write_text("weights")
    (tmp_path / "job.yml").write_text("code: src\ncommand: python t.py\ncompute: azureml:c1\nexperiment_name: az\n"
                                      "environment: {image: python:3.11-slim}\n"
                                      "outputs:\n  model: {type: uri_folder, path: '" + UP + "/out/model'}\n"
                                      "  empty: {type: uri_folder, path: '" + UP + "/nothing'}\n")
    emu.create_compute(ClusterSpec("c1", "STANDARD_D2_V2", min_nodes=1, max_nodes=1))
    emu.datastores.create(DatastoreSpec("localds", "local", folder=str(tmp_path / "ds")))
    record = job_to_record(load_job(tmp_path / "job.yml"))
    for name in ("old_run", "mid_run", "new_run"):
        emu.store.add_run(name, "az", "c1", record)
        for status in (RunStatus.QUEUED, RunStatus.PREPARING, RunStatus.RUNNING, RunStatus.FINALIZING,
                       RunStatus.COMPLETED):
            emu.store.set_status(name, status, status.value)
        for sub, file in (("outputs", "out.txt"), ("user_logs", "std_log_process_0.txt")):
            (emu.home.run_dir(name) / sub).mkdir(parents=True)
            (emu.home.run_dir(name) / sub / file).write_text(name)
    yield tmp_path / "home"
    emu.cleanup()


def amlemu(home: Path, *argv: str, code: int = 0, **kw: Any) -> Any:
    result = CliRunner().invoke(cli, ["--home", str(home), *argv], **kw)
    assert result.exit_code == code, f"exit {result.exit_code}: {result.output}"
    if code:
        assert result.stderr.startswith("amlemu: error: ") and result.stderr.count("\n") == 1, result.stderr
    return result


# --- -n/--name ---------------------------------------------------------------------------------------
def test_name_option_and_the_positional_alias_are_the_same(home: Path) -> None:
    by_option = json.loads(amlemu(home, "job", "show", "-n", "new_run", "-o", "json").stdout)
    assert json.loads(amlemu(home, "job", "show", "new_run", "-o", "json").stdout)["name"] == by_option["name"]
    assert json.loads(amlemu(home, "job", "show", "--name", "new_run", "new_run", "-o", "json").stdout)["name"] == \
        "new_run"  # both, the same: fine
    assert "two job names given (mid_run, new_run)" in amlemu(home, "job", "show", "-n", "mid_run", "new_run",
                                                              code=2).stderr
    assert "Missing option '-n' / '--name' (the compute's name)" in amlemu(home, "compute", "show", code=2).stderr


def test_job_create_takes_the_name_as_az_does(home: Path) -> None:
    plan = json.loads(amlemu(home, "job", "create", "-f", str(home.parent / "job.yml"), "-n", "named_by_n",
                             "--dry-run").stdout)
    assert plan["run_id"] == "named_by_n"


# --- -g/-w/--subscription --------------------------------------------------------------------------
def test_workspace_options_are_checked_against_the_emulated_workspace(home: Path) -> None:
    ws = json.loads(amlemu(home, "workspace", "show", "-o", "json").stdout)
    same = ("-g", ws["resource_group"], "-w", ws["workspace_name"], "--subscription", ws["subscription_id"])
    for argv in (("compute", "list"), ("job", "list"), ("datastore", "list"), ("cleanup", "--dry-run"),
                 ("workspace", "show", "-n", ws["workspace_name"])):
        amlemu(home, *argv, *same)
    wrong = amlemu(home, "compute", "list", "-g", "other-rg", code=1).stderr
    assert wrong.startswith("amlemu: error: -g/--resource-group: 'other-rg' is not the emulated workspace's "
                            f"resource group ('{ws['resource_group']}'); pass -g {ws['resource_group']}")
    assert "--subscription: 'x'" in amlemu(home, "datastore", "list", "--subscription", "x", code=1).stderr
    # On a show verb the workspace it names is not found: az's exit 3.
    assert "-w/--workspace-name: 'other'" in amlemu(home, "job", "show", "-n", "new_run", "-w", "other", code=3).stderr
    amlemu(home, "workspace", "show", "-n", "other", code=3)
    # workspace set's --resource-group is the new value; -w names the workspace as it is now.
    amlemu(home, "workspace", "set", "--resource-group", "rg2", "-w", ws["workspace_name"])
    assert json.loads(amlemu(home, "workspace", "show", "-o", "json", "-g", "rg2").stdout)["resource_group"] == "rg2"


def test_workspace_options_choose_the_azureml_targets_workspace(home: Path) -> None:
    job = str(home.parent / "job.yml")
    plan = json.loads(amlemu(home, "job", "create", "-f", job, "--target", "azureml", "--dry-run",
                             "--subscription", "sub-1", "-g", "rg-1", "-w", "ws-1").stdout)
    assert plan["workspace"] == {"subscription_id": "sub-1", "resource_group": "rg-1", "workspace_name": "ws-1",
                                 "source": "command line"}
    (home.parent / "config.json").write_text(json.dumps({"subscription_id": "s", "resource_group": "g",
                                                         "workspace_name": "w"}))
    plan = json.loads(amlemu(home, "compute", "create", "-n", "c2", "--target", "azureml", "--dry-run",
                             "-w", "ws-2").stdout)
    assert plan["request"]["path"].endswith("/resourceGroups/g/providers/Microsoft.MachineLearningServices/"
                                            "workspaces/ws-2/computes/c2")
    ref = resolve_workspace({}, home.parent, WorkspaceOptions(workspace_name="ws-3"))
    assert (ref.subscription_id, ref.workspace_name) == ("s", "ws-3") and ref.source.endswith("and the command line")
    (home.parent / "config.json").unlink()
    with pytest.raises(TargetError, match="or pass --subscription, -g and -w"):
        resolve_workspace({}, home.parent, WorkspaceOptions(workspace_name="ws-3"))


# --- az's exit codes ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("argv", "code"), [
    (("job", "show", "-n", "nope"), 3), (("compute", "show", "-n", "nope"), 3),
    (("datastore", "show", "-n", "nope"), 3), (("job", "cancel", "-n", "nope"), 1),
    (("compute", "delete", "-n", "nope", "--yes"), 1), (("job", "stream", "-n", "nope"), 1),
    (("job", "download", "-n", "nope"), 1), (("compute", "list", "--colour"), 2),
])
def test_exit_codes_are_azs(home: Path, argv: tuple[str, ...], code: int) -> None:
    """3 only for a show verb's missing resource (az's show commands), 1 for other verbs, 2 for usage."""
    amlemu(home, *argv, code=code)


def test_the_exit_codes_are_in_the_help(home: Path) -> None:
    shown = " ".join(amlemu(home, "--help").stdout.split())
    assert "Exit codes: 0 it worked; 1 an error; 2 a command line that does not parse; 3 a `show` verb" in shown


# --- -o and --query --------------------------------------------------------------------------------
def test_yaml_and_json_are_the_same_document(home: Path) -> None:
    as_json = json.loads(amlemu(home, "compute", "show", "-n", "c1", "-o", "json").stdout)
    assert yaml.safe_load(amlemu(home, "compute", "show", "-n", "c1", "-o", "yaml").stdout) == as_json
    assert amlemu(home, "compute", "show", "-n", "c1", "-o", "none").stdout == ""


def test_query_selects_before_the_format(home: Path) -> None:
    names = amlemu(home, "job", "list", "--query", "[].name", "-o", "tsv").stdout
    assert names == "old_run\nmid_run\nnew_run\n"
    rows = amlemu(home, "job", "list", "--query", "[].[name, status]", "-o", "tsv").stdout.splitlines()
    assert rows[-1] == "new_run\tCompleted"
    # Without -o, a query prints az's own default, JSON: scripts written for az read it as they do az's.
    assert json.loads(amlemu(home, "job", "list", "--query", "[].name").stdout) == ["old_run", "mid_run", "new_run"]
    table = amlemu(home, "compute", "list", "--query", "[].{name:name, idle:idle}", "-o", "table").stdout
    assert table.splitlines() == ["Name  Idle", "----  ----", "c1    1"]
    assert json.loads(amlemu(home, "job", "cancel", "-n", "new_run", "--dry-run", "-o", "json",
                             "--query", "actions[0].action").stdout) == "leave"


def test_a_bad_query_is_one_line(home: Path) -> None:
    parse = amlemu(home, "job", "list", "--query", "[].name[", code=2).stderr
    assert "Invalid value for '--query': not a JMESPath query" in parse
    typed = amlemu(home, "compute", "show", "-n", "c1", "--query", "abs(name)", code=1).stderr
    assert typed.startswith("amlemu: error: --query: In function abs(), invalid type for value: c1")


def test_tsv_follows_azs_rules() -> None:
    """Values only, a row per item; a mapping's values by sorted key (by the query's order after a
    --query), a nested mapping an empty field, a nested list its length, true/false at the top level."""
    data = [{"b": 2, "a": "x", "nested": {"k": 1}, "items": [1, 2, 3], "none": None, "flag": True}]
    assert formats.tsv(data) == "x\t2\tTrue\t3\t\tNone\n"
    assert formats.tsv(data, sort_keys=False) == "2\tx\t\t3\tNone\tTrue\n"
    assert formats.tsv([True, "a b", 3]) == "true\na b\n3\n"
    assert formats.tsv({"only": "row"}) == "row\n"
    assert formats.tsv([]) == ""


def test_the_generic_table_is_azs() -> None:
    assert formats.table([{"name": "a", "id": "skipped", "nested": {"x": 1}, "n": 1}, {"name": "bb"}]) == \
        "N  Name\n-  ----\n1  a\n   bb\n"
    assert formats.table(["x", "y"]) == "Result\n------\nx\ny\n"
    assert formats.table([]) == ""


# --- --yes -------------------------------------------------------------------------------------------
def test_destructive_verbs_ask_and_refuse_without_a_terminal(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for argv in (("compute", "delete", "-n", "c1"), ("cleanup",), ("cleanup", "--all")):
        refused = amlemu(home, *argv, code=1).stderr
        assert "no terminal to ask for confirmation; pass --yes (-y) to go ahead" in refused, refused
        amlemu(home, *argv, "--dry-run")  # a dry run changes nothing: it never asks
    assert json.loads(amlemu(home, "compute", "list", "-o", "json").stdout)[0]["idle"] == 1  # nothing went
    monkeypatch.setattr(azshape, "stdin_is_terminal", lambda: True)
    declined = CliRunner().invoke(cli, ["--home", str(home), "compute", "delete", "-n", "c1"], input="n\n")
    assert declined.exit_code == 1 and "Are you sure you want to perform this operation? [y/N]" in declined.stderr
    assert declined.stderr.endswith("amlemu: error: operation cancelled; nothing was done\n"), declined.stderr
    assert json.loads(amlemu(home, "compute", "list", "-o", "json").stdout) != []
    amlemu(home, "compute", "delete", "-n", "c1", input="y\n")
    assert json.loads(amlemu(home, "compute", "list", "-o", "json").stdout) == []


# --- job list --max-results, job download --output-name/--all --------------------------------------
def test_job_list_max_results(home: Path) -> None:
    newest = amlemu(home, "job", "list", "-r", "2", "--query", "[].name", "-o", "json")
    assert json.loads(newest.stdout) == ["mid_run", "new_run"]
    assert "notice: the 2 most recent jobs; --max-results N or --all-results for more" in newest.stderr
    every = amlemu(home, "job", "list", "--max-results", "1", "--all-results", "--query", "[].name", "-o", "json")
    assert json.loads(every.stdout) == ["old_run", "mid_run", "new_run"] and every.stderr == ""
    assert amlemu(home, "job", "list", "-r", "3", "-o", "json").stderr == ""  # all there are: no notice


def test_job_download_default_named_and_all(home: Path) -> None:
    dl = home.parent / "dl"
    amlemu(home, "job", "download", "-n", "new_run", "-p", str(dl / "default"))
    got = dl / "default" / "new_run"
    assert (got / "outputs" / "out.txt").read_text() == "new_run" and not (got / "named-outputs").exists()
    amlemu(home, "job", "download", "-n", "new_run", "-p", str(dl / "one"), "--output-name", "model")
    got = dl / "one" / "new_run"
    assert (got / "named-outputs" / "model" / "w.txt").read_text() == "weights" and not (got / "outputs").exists()
    plan = json.loads(amlemu(home, "job", "download", "-n", "new_run", "-p", str(dl / "all"), "--all", "--dry-run",
                             "-o", "json").stdout)["actions"]
    assert [(a["action"], a["what"], a.get("name")) for a in plan] == [
        ("copy", "run files", "new_run"), ("download", "named output", "model"), ("skip", "named output", "empty")]
    amlemu(home, "job", "download", "-n", "new_run", "-p", str(dl / "all"), "--all")
    got = dl / "all" / "new_run"
    assert (got / "outputs" / "out.txt").exists() and (got / "named-outputs" / "model" / "w.txt").exists()
    missing = amlemu(home, "job", "download", "-n", "new_run", "--output-name", "nope", code=1).stderr
    assert "output 'nope' not found; job new_run has: default, model, empty" in missing
    unwritten = amlemu(home, "job", "download", "-n", "new_run", "--output-name", "empty", code=1).stderr
    assert f"path '{UP}/nothing' not found" in unwritten


def test_azureml_list_and_download_pass_the_limits_to_mlclient() -> None:
    calls: list[Any] = []

    class Job:
        def __init__(self, name: str) -> None:
            self.name, self.experiment_name, self.compute, self.status = name, "exp", "c", "Completed"

        def _to_dict(self) -> dict[str, Any]:  # what az ml prints of a job: its dict
            return {"name": self.name, "experiment_name": self.experiment_name, "status": self.status}

    class Jobs:
        def list(self) -> Iterator[Job]:
            for name in ("newest", "middle", "oldest"):  # the service lists the newest first
                calls.append(name)
                yield Job(name)

        def download(self, name: str, **kw: Any) -> None:
            calls.append((name, kw))

    target = AzureMLTarget(workspace=WorkspaceRef("s", "g", "w"))
    target._client = type("Client", (), {"jobs": Jobs()})()  # noqa: SLF001 - the client it would build
    assert [j["name"] for j in target.list_jobs(max_results=2)] == ["middle", "newest"]
    assert calls == ["newest", "middle"]  # no more of the listing is read than asked for
    target.download("j1", Path("/tmp/dl"), output_name="model")
    assert calls[-1] == ("j1", {"download_path": "/tmp/dl/j1", "output_name": "model", "all": False})


# --- compute create --set, -n over -f ----------------------------------------------------------------
def test_compute_create_set_and_options_over_the_yaml(home: Path) -> None:
    plan = json.loads(amlemu(home, "compute", "create", "-f", str(REPO / "trainer" / "compute.yml"), "-n", "other",
                             "--set", "max_instances=3", "--set", "idle_time_before_scale_down=30", "--backend",
                             "process", "--dry-run").stdout)
    compute = plan["compute"]
    assert (compute["name"], compute["vm_size"], compute["max_nodes"], compute["idle_seconds_before_scaledown"]) == \
        ("other", "Standard_NC6", 3, 30)
    made = json.loads(amlemu(home, "compute", "create", "-n", "c3", "--set", "tier=low_priority", "--backend",
                             "process", "-o", "json").stdout)
    assert (made["name"], made["vm_priority"], made["max_nodes"]) == ("c3", "lowpriority", 4)
    assert "--set: 'oops' is not key=value" in amlemu(home, "compute", "create", "-n", "c4", "--set", "oops",
                                                      code=1).stderr
    assert "colour: unknown field" in amlemu(home, "compute", "create", "-n", "c4", "--set", "colour=red",
                                             code=1).stderr


# --- --version -------------------------------------------------------------------------------------
def test_version_falls_back_to_pyproject(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise azshape.metadata.PackageNotFoundError(name)
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'version = "{azshape.version()}"' in pyproject
    monkeypatch.setattr(azshape.metadata, "version", missing)
    assert f'version = "{azshape.version()}"' in pyproject
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and result.stdout == f"amlemu {azshape.version()}\n"
