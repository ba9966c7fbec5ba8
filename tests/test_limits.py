"""AmlCompute's limits and Azure ML's name rules, applied alike by the spec, the CLI and the
service (issue 25): node counts, idle times, experiment and display names, environment names,
image references, and what the CLI prints of names. Pure or in-process: no node is started."""
from __future__ import annotations

import json
import sqlite3
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner

from amlemu.api import Emulator
from amlemu.cli import cli
from amlemu.cli import output as formats
from amlemu.cluster import autoscale
from amlemu.cluster.store import Store
from amlemu.envs import hostdists
from amlemu.envs.resolve import from_conda, requirement
from amlemu.errors import ConfigError
from amlemu.names import check_image_reference
from amlemu.service.state.computerest import cluster_from_rest
from amlemu.service.state.v1 import _check_experiment
from amlemu.service.state import Registry, ServiceError, Workspace
from amlemu.specs import AZURE_MAX_INSTANCES, ClusterSpec, RunStatus, check_quota, max_instances_quota

HOSTILE = "evil\x1b]0;pwned\x07\x1b[2J\u202eplh\x9b31m"


# --- node counts and idle time ----------------------------------------------------------------
def test_a_cluster_is_bounded_by_amlcompute_and_by_the_quota() -> None:
    with pytest.raises(ConfigError, match="max_nodes: 1000000000 is above AmlCompute's limit of 65000"):
        ClusterSpec("big", max_nodes=1_000_000_000)
    with pytest.raises(ConfigError, match="idle_seconds_before_scaledown: .* more than Azure ML's duration holds"):
        ClusterSpec("big", idle_seconds_before_scaledown=99999999999 * 86400)
    assert max_instances_quota({}) == 100 and max_instances_quota({"AMLEMU_MAX_INSTANCES": "500"}) == 500
    for raw in ("0", "65001", "lots", "-3"):
        with pytest.raises(ConfigError, match=r"\$AMLEMU_MAX_INSTANCES: .* is not a node count"):
            max_instances_quota({"AMLEMU_MAX_INSTANCES": raw})
    with pytest.raises(ConfigError, match="above the emulator's quota of 100 .* AMLEMU_MAX_INSTANCES=<n>"):
        check_quota(ClusterSpec("big", max_nodes=101), 100)
    assert check_quota(ClusterSpec("big", max_nodes=AZURE_MAX_INSTANCES), AZURE_MAX_INSTANCES).max_nodes == 65000


def test_allocating_on_the_largest_cluster_costs_what_is_in_use_not_max_instances(tmp_path: Path) -> None:
    class CountingSet(set):  # every index free_indices looks at
        looked = 0

        def __contains__(self, item: object) -> bool:
            CountingSet.looked += 1
            return super().__contains__(item)

    assert autoscale.free_indices(CountingSet({0, 1, 3}), 2) == [2, 4] and CountingSet.looked == 5
    store = Store(tmp_path / "amlemu.db")
    spec = ClusterSpec("c1", max_nodes=AZURE_MAX_INSTANCES)
    store.add_run("r1", "exp", "c1", {})
    store.set_status("r1", RunStatus.QUEUED)
    tracemalloc.start()
    try:
        allocation = autoscale.try_allocate(store, spec, "r1", 2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert allocation is not None and [n.name for n in allocation.new] == ["c1-node-0", "c1-node-1"]
    assert peak < 512 * 1024, peak  # a list of 65,000 free indices alone would be over 2 MB


def test_the_service_applies_the_same_limits_with_the_field_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def body(**scale: object) -> dict[str, object]:
        return {"properties": {"computeType": "AmlCompute", "properties": {"scaleSettings": scale}}}

    monkeypatch.delenv("AMLEMU_MAX_INSTANCES", raising=False)
    cases = [(body(maxNodeCount=1_000_000_000), "limit of 65000"), (body(maxNodeCount=101), "quota of 100"),
             (body(maxNodeCount=4, nodeIdleTimeBeforeScaleDown="P99999999999D"), "duration holds"),
             (body(maxNodeCount=4, nodeIdleTimeBeforeScaleDown=float("nan")), "is not a duration")]
    for sent, words in cases:
        with pytest.raises(ServiceError) as caught:
            cluster_from_rest("c2", sent)
        assert caught.value.status == 400 and words in str(caught.value.message), sent
    monkeypatch.setenv("AMLEMU_MAX_INSTANCES", "200")
    assert cluster_from_rest("c2", body(maxNodeCount=150, nodeIdleTimeBeforeScaleDown="PT2M")).max_nodes == 150


# --- names ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../../evil", " spaced ", "a\0b", "a\nb", "n" * 256, "<script>", ".hidden"])
def test_the_service_registry_refuses_what_environment_create_refuses(tmp_path: Path, name: str) -> None:
    registry = Registry(Workspace("0" * 8 + "-0000-0000-0000-" + "0" * 12, "rg", "ws", "westeurope"),
                        tmp_path / "registry.json")
    for args in (("environments", name, "1"), ("environments", "good", name)):
        with pytest.raises(ServiceError) as caught:
            registry.put(*args, {"image": "python:3.11"})
        assert caught.value.status == 400 and caught.value.target in ("name", "version")
    with pytest.raises(ServiceError, match="properties.image"):
        registry.put("environments", "good", "1", {"image": "a b"})
    assert registry.put("environments", "AzureML-sklearn-1.0-ubuntu20.04", "1.2", {"image": "python:3.11"})
    assert not any(registry.assets["environments"].get((name, "1")) for name in [name])


def test_a_v1_experiment_name_is_checked_before_it_is_recorded() -> None:
    for name in ("a\0b", "e" * 257, "caf\u00e9", "../x"):
        with pytest.raises(ServiceError) as caught:
            _check_experiment(name)
        assert caught.value.status == 400 and caught.value.target == "experimentName"
    _check_experiment("my-experiment_2")


@pytest.mark.parametrize("ref", ["a b", "UPPER/x", ":tag", "x:", "x@sha256:zz", "//x", "a" * 300, "x\n", "a/../b"])
def test_an_image_reference_follows_the_engines_grammar(ref: str) -> None:
    with pytest.raises(ConfigError, match="is not an image reference"):
        check_image_reference(ref)


@pytest.mark.parametrize("ref", ["python:3.11", "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04:latest",
                                 "localhost:5000/team/img:v1", "ubuntu@sha256:" + "a" * 64, "My.Registry.io/x_y:1"])
def test_real_image_references_pass(ref: str) -> None:
    assert check_image_reference(ref) == ref


# --- environments -----------------------------------------------------------------------------
def test_environment_list_skips_a_bad_record_with_a_notice(tmp_path: Path) -> None:
    home = tmp_path / "home"
    emu = Emulator(home, backend="process")
    emu.store.add_environment({"name": "good", "version": "1", "image": "python:3.11", "conda_file": None,
                               "build_path": None, "description": None})
    emu.store.close()
    with sqlite3.connect(home / "amlemu.db") as db:  # as an older amlemu stored it, unchecked
        spec = {"name": "../../evil", "version": "1", "image": "python:3.11", "conda_file": None, "build_path": None}
        db.execute("INSERT INTO environments VALUES (?, ?, ?, ?)", ("../../evil", "1", json.dumps(spec), 0.0))
    result = CliRunner().invoke(cli, ["--home", str(home), "environment", "list", "-o", "json"])
    assert result.exit_code == 0, result.output
    assert [e["name"] for e in json.loads(result.stdout)] == ["good"]
    assert "notice: skipped a stored environment record: name: ../../evil is not a valid" in result.stderr


def test_a_conda_url_or_a_broken_marker_is_never_installed() -> None:
    conda = {"dependencies": ["python=3.11", "numpy=1.26", "https://example.com/evil.whl", "numpy @ https://x/e.whl",
                              "file:///etc/passwd", {"pip": ['tqdm; python_version > "3\n"', "rich\n==1"]}]}
    python, requirements, notices = from_conda(conda, "conda_file")
    assert python == "3.11" and requirements == ["numpy==1.26.*"]
    assert sum("is not installed here" in n for n in notices) == 5, notices
    assert requirement('tqdm; python_version > "3\n"') is None  # packaging raises a SyntaxError for it
    assert hostdists.closure(['tqdm; python_version > "3\n"'], {}) == ([], ['tqdm; python_version > "3\n"'])


# --- what the CLI prints ----------------------------------------------------------------------
def test_names_reach_the_terminal_escaped_in_every_format(tmp_path: Path) -> None:
    home = tmp_path / "home"
    emu = Emulator(home, backend="process")
    emu.store.add_run("r1", HOSTILE, "c1", {"display_name": HOSTILE, "job": {"display_name": HOSTILE}})
    emu.store.close()
    for fmt in ("table", "tsv", "json", "yaml"):
        result = CliRunner().invoke(cli, ["--home", str(home), "job", "list", "-o", fmt])
        assert result.exit_code == 0, result.output
        assert not any(ch in result.stdout for ch in "\x1b\x07\x9b\u202e"), (fmt, result.stdout)
        assert "evil" in result.stdout and ("\\x1b]0;pwned" in result.stdout or "\\u001b]0;pwned" in result.stdout)
    assert json.loads(formats.render({"n": HOSTILE}, "json")) == {"n": HOSTILE}  # still the same JSON
    missing = CliRunner().invoke(cli, ["--home", str(home), "job", "show", HOSTILE])
    assert missing.exit_code == 3 and "\x1b" not in missing.stderr and "\\x1b" in missing.stderr


def test_workspace_config_never_writes_through_a_link(tmp_path: Path) -> None:
    target, link = tmp_path / "precious.txt", tmp_path / "config.json"
    target.write_text("keep me\n")
    link.symlink_to(target)
    (tmp_path / "home").mkdir()
    result = CliRunner().invoke(cli, ["--home", str(tmp_path / "home"), "workspace", "config", "--path", str(link)])
    assert result.exit_code == 1 and "is a symbolic link" in result.stderr and str(link) in result.stderr
    assert target.read_text() == "keep me\n" and link.is_symlink()
    result = CliRunner().invoke(cli, ["--home", str(tmp_path / "home"), "workspace", "config", "--path",
                                      str(tmp_path / "plain.json")])
    assert result.exit_code == 0 and json.loads((tmp_path / "plain.json").read_text())["workspace_name"]
