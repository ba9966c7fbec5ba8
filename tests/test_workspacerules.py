"""The workspace's rules for a job (emulator/workspacerules.py): one wording per rule, whether
`amlemu job validate` lists it, the dry run raises it or submit refuses the job with it; submit
raises the first error in its own order, checks each rule once, and makes a serverless pool only
after every check. Unit checks against a bare home, then one real submit on the process backend."""
from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from amlemu import workspacerules
from amlemu.api import Emulator
from amlemu.cluster import pools
from amlemu.errors import CapacityError, ConfigError
from amlemu.jobs.jobyaml import job_from_dict
from amlemu.specs import JobSpec, RunStatus
from amlemu.validate import check_job


def _dead_url() -> str:
    with socket.socket() as s:  # a loopback port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/iris.csv"


def _job(tmp_path: Path, **fields: Any) -> JobSpec:
    (tmp_path / "src").mkdir(exist_ok=True)
    (tmp_path / "src" / "train.py").write_text("print('hi')\n")
    data = {"command": "python train.py", "code": "src", "environment": "azureml:AzureML-sklearn-1.5@latest",
            **fields}  # no compute: the serverless pool, a record until submit makes it
    return job_from_dict(data, base_dir=tmp_path)


def _link_out(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "secret.txt").write_text("not for the run\n")
    (tmp_path / "src").mkdir(exist_ok=True)
    (tmp_path / "src" / "leak.txt").symlink_to(tmp_path / "secret.txt")
    return {}


def _taken(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "home" / "runs" / "taken_name").mkdir(parents=True)  # a run folder without its record
    return {"name": "taken_name"}


# (id, the job's fields or a function of tmp_path giving them, environment, the error class)
RULES = [
    ("fits", {"resources": {"instance_count": 3}, "distribution": {"type": "mpi"}}, {"AMLEMU_MAX_INSTANCES": "2"},
     CapacityError),
    ("datastore", {"inputs": {"d": {"path": "azureml://datastores/other/paths/x"}}}, {}, ConfigError),
    ("url offline", {"inputs": {"u": {"type": "uri_file", "path": "https://example.com/iris.csv"}}},
     {"AMLEMU_OFFLINE": "1"}, ConfigError),
    ("git offline", {"code": "git+https://example.com/org/repo.git"}, {"AMLEMU_OFFLINE": "1"}, ConfigError),
    ("code link", _link_out, {}, ConfigError),
    ("name", _taken, {}, ConfigError),
    ("environment", {"environment": "azureml:nosuch@latest"}, {}, ConfigError),
]


@pytest.mark.parametrize(("fields", "environ", "kind"), [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_each_rule_has_one_wording_at_validate_dry_run_and_submit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  fields: Any, environ: dict[str, str],
                                                                  kind: type) -> None:
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    emu = Emulator(tmp_path / "home", backend="process")
    job = _job(tmp_path, **(fields(tmp_path) if callable(fields) else fields))
    errors = [f.line() for f in check_job(job, emu) if f.severity == "error"]
    assert len(errors) == 1, errors  # `job validate`: this rule alone
    for verb in (emu.plan_job, emu.submit):
        with pytest.raises(kind) as refused:
            verb(job)
        assert type(refused.value) is kind and f"error: {refused.value}" == errors[0]
    assert emu.store.clusters() == [] and emu.store.runs() == []  # refused before anything is made
    assert not any(p.name != "taken_name" for p in emu.home.root.glob("runs/*"))


def test_a_missing_compute_ends_the_checks_and_submit_says_it_as_validate_does(tmp_path: Path) -> None:
    emu = Emulator(tmp_path / "home", backend="process")
    job = _job(tmp_path, compute="azureml:nope", resources={"instance_count": 5}, distribution={"type": "mpi"})
    verdict = workspacerules.check(job, emu, probe=False)
    assert [f.line() for f in verdict.findings] == [
        "error: compute: 'nope' does not exist in the workspace (computes: none); "
        "create it with `amlemu compute create` or fix the name"]  # nothing to fit: no more findings
    with pytest.raises(ConfigError) as refused:
        emu.submit(job)
    assert f"error: {refused.value}" == verdict.findings[0].line()  # one wording


def test_submit_raises_the_first_error_in_its_order_and_validate_lists_them_all(tmp_path: Path) -> None:
    emu = Emulator(tmp_path / "home", backend="process")
    job = _job(tmp_path, **_taken(tmp_path), environment="azureml:nosuch@latest",
               inputs={"d": {"path": "azureml://datastores/other/paths/x"}},
               outputs={"o": {"path": "azureml://datastores/elsewhere/paths/o"}})
    fields = [f.field for f in check_job(job, emu) if f.severity == "error"]
    assert fields == ["inputs.d.path", "outputs.o.path", "name", "environment"]  # outputs' datastores too
    with pytest.raises(ConfigError, match=r"^inputs.d.path: datastore 'other' not found"):
        emu.submit(job)


def test_a_dry_run_reads_no_url_and_makes_no_pool_where_validate_and_submit_probe(tmp_path: Path) -> None:
    emu = Emulator(tmp_path / "home", backend="process")
    dead = _dead_url()
    job = _job(tmp_path, inputs={"iris": {"type": "uri_file", "path": dead}})
    plan = emu.plan_job(job)  # nothing read: the URL's answer is the submit's business
    assert plan["pool"]["made"] == "at submit" and emu.store.clusters() == []
    assert [f.field for f in check_job(job, emu) if f.severity == "error"] == ["inputs.iris.path"]
    with pytest.raises(ConfigError, match=rf"^inputs.iris.path: {dead} cannot be read here \("):
        emu.submit(job)
    assert emu.store.clusters() == [] and emu.store.runs() == []


def test_links_out_of_the_code_folder_are_each_a_finding_and_submit_counts_the_rest(tmp_path: Path) -> None:
    emu = Emulator(tmp_path / "home", backend="process")
    _link_out(tmp_path)
    (tmp_path / "src" / "also.txt").symlink_to(tmp_path / "secret.txt")
    job = _job(tmp_path)
    errors = [f for f in check_job(job, emu) if f.severity == "error"]
    assert sorted(f.problem.split(" ", 1)[0] for f in errors) == ["'also.txt'", "'leak.txt'"], errors  # one each
    with pytest.raises(ConfigError, match=r"\(and 1 more\); "):
        emu.submit(job)


@pytest.mark.parametrize("backend", ["process"])
def test_one_submit_checks_each_rule_once_and_makes_the_pool_after_them(emu: Emulator, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: dict[str, int] = {"check": 0, "fits": 0}

    def counted(name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            if name == "fits":  # the pool is made after every check: it does not exist while they run
                assert emu.store.clusters() == []
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(workspacerules, "check", counted("check", workspacerules.check))
    monkeypatch.setattr(pools, "check_fits", counted("fits", pools.check_fits))
    (tmp_path / "src").mkdir()
    job = job_from_dict({"command": "echo checked once", "compute": "local"}, base_dir=tmp_path)
    run = emu.submit(job)
    assert calls == {"check": 1, "fits": 1}
    assert [c.spec.name for c in emu.store.clusters()] == [emu.job_cluster(job).spec.name]  # the local pool
    assert run.wait(timeout=120) is RunStatus.COMPLETED


def test_a_bound_job_is_checked_as_it_is(tmp_path: Path) -> None:
    """submit binds the job once (Emulator._job) and checks it as bound: nothing is bound again."""
    emu = Emulator(tmp_path / "home", backend="process")
    job = _job(tmp_path, inputs={"d": {"path": "azureml://datastores/workspaceblobstore/paths/x"}})
    verdict = workspacerules.check(job, emu, probe=False)
    assert verdict.job is job and verdict.findings == [] and verdict.cluster is not None
