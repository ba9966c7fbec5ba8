"""Environments as data (curated, registered, inline, conda files) and their offline builds: tiny
wheels from a local find-links folder, no index, no network."""
from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import threading
from pathlib import Path

import pytest
from envwheels import wheelhouse

from amlemu.cluster.store import Store
from amlemu.envs import curated
from amlemu.envs.build import HOST_PYTHON, RECORD, PackageSource, build, redact
from amlemu.envs.layer import build_layer
from amlemu.envs.resolve import EnvRef, conda_requirement, from_conda, parse_ref, resolve
from amlemu.envs.software import planned_notices, software_for
from amlemu.errors import BuildError, ConfigError, StateError
from amlemu.jobs.envyaml import load_environment
from amlemu.jobs.jobyaml import load_job

NOBODY = lambda name, version: None  # noqa: E731 - no registered environment


def conda(*pip: str, python: str = HOST_PYTHON) -> dict:
    return {"dependencies": [f"python={python}", "pip", {"pip": list(pip)}]}


@pytest.fixture
def source(tmp_path: Path) -> PackageSource:
    return PackageSource(None, (str(wheelhouse(tmp_path / "wheels")),))


@pytest.fixture(autouse=True)
def env_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AMLEMU_ENV_CACHE", str(tmp_path / "envs"))
    return tmp_path / "envs"


# --- resolution: pure ------------------------------------------------------------------------------
def test_references_parse_as_azure_ml_writes_them() -> None:
    assert parse_ref("azureml:AzureML-ACPT-pytorch-2.2-cuda12.1@latest") == EnvRef("AzureML-ACPT-pytorch-2.2-cuda12.1")
    assert parse_ref("azureml:my-env:3") == EnvRef("my-env", "3")
    assert parse_ref("mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04:latest") is None
    with pytest.raises(ConfigError, match="label 'stable'"):
        parse_ref("azureml:my-env@stable")


@pytest.mark.parametrize("spec, requirement", [
    ("numpy", "numpy"), ("numpy=1.26", "numpy==1.26.*"), ("numpy==1.26.4", "numpy==1.26.4"),
    ("conda-forge::numpy=1.26.4=py311_0", "numpy==1.26.4.*"), ("numpy>=1.2,<2", "numpy>=1.2,<2"),
    ("pytorch=2.1", "torch==2.1.*"), ("cudatoolkit=11.8", None), ("openmpi", None)])
def test_conda_specs_become_pip_requirements(spec: str, requirement: str | None) -> None:
    assert conda_requirement(spec) == requirement


def test_a_conda_file_gives_python_pip_packages_and_what_is_not_emulated() -> None:
    python, requirements, notices = from_conda(
        {"dependencies": ["python=3.11.7", "pip=24", "numpy=1.26", "cudatoolkit=11.8",
                          {"pip": ["amlemupin==1.0", "--extra-index-url https://example.invalid/simple"]}]}, "x")
    assert (python, requirements) == ("3.11", ["numpy==1.26.*", "amlemupin==1.0"])
    assert any("cudatoolkit" in n for n in notices) and any("--extra-index-url" in n for n in notices)


def test_a_pip_line_that_would_fetch_from_anywhere_is_a_notice_not_a_requirement() -> None:
    _, requirements, notices = from_conda({"dependencies": [{"pip": [
        "amlemupin==1.0", "evil @ https://example.invalid/evil-1.0.tar.gz", "git+https://example.invalid/x.git"]}]}, "x")
    assert requirements == ["amlemupin==1.0"]
    assert any("direct URL" in n and "evil @" in n for n in notices) and any("git+https" in n for n in notices)


@pytest.mark.parametrize("spec, version", [("=3.11", "3.11"), (" 3.10.4", "3.10"), ("==3.12.*", "3.12"),
                                           (f">={HOST_PYTHON}", None), (">=3.99", "3.99"), ("", None)])
def test_a_conda_python_spec_names_the_version(spec: str, version: str | None) -> None:
    assert from_conda({"dependencies": [f"python{spec}"]}, "x")[0] == version


def test_curated_environments_are_data_with_a_source_for_every_pin() -> None:
    for env in curated.CURATED:
        assert env.pins and ("torch" in env.pins), env.name  # each says whether it has torch
        if "pytorch" in env.name.lower():
            assert set(env.pins) == set(curated.PINNED), env.name
        assert all(pin.source.startswith("https://github.com/") for pin in env.pins.values()), env.name
    acpt = curated.lookup("azureml-acpt-pytorch-2.2-CUDA12.1")  # names match without regard to case
    assert acpt is not None and acpt.pins["horovod"].version is None and acpt.python == "3.10"
    # No current curated environment has Horovod: the seed's job brings its own (trainer/environment.yml).
    assert [e.name for e in curated.CURATED if e.pins["horovod"].version] == ["AzureML-pytorch-1.10-ubuntu18.04-py38-cuda11-gpu"]


def test_a_curated_environment_this_machine_cannot_be_names_each_difference() -> None:
    notices = planned_notices("azureml:AzureML-ACPT-pytorch-2.2-cuda12.1@latest", None, NOBODY)
    text = " ".join(notices)
    assert "Python 3.10 there" in text and "torch 2.7.1 there" in text
    assert "horovod is not in it" in text and "fails on Azure ML" in text


def test_an_unregistered_environment_is_refused_and_a_registered_one_resolves(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="amlemu environment create"):
        resolve("azureml:mine@latest", None, NOBODY)
    store = Store(tmp_path / "db")
    (tmp_path / "env.yml").write_text("name: mine\nimage: base:1\nconda_file: conda.yml\n")
    (tmp_path / "conda.yml").write_text("dependencies:\n  - python=3.11\n  - pip:\n    - amlemupin==1.0\n")
    first = store.add_environment(load_environment(tmp_path / "env.yml"))
    assert store.add_environment(load_environment(tmp_path / "env.yml")) == first  # the same again: no new version
    (tmp_path / "conda.yml").write_text("dependencies:\n  - python=3.11\n  - pip:\n    - amlemupin==2.0\n")
    second = store.add_environment(load_environment(tmp_path / "env.yml"))
    assert (first["version"], second["version"]) == ("1", "2")  # az ml's next integer version
    assert resolve("azureml:mine@latest", None, store.environment).requirements == ("amlemupin==2.0",)
    assert resolve("azureml:mine:1", None, store.environment).requirements == ("amlemupin==1.0",)
    with pytest.raises(StateError, match="versions cannot change"):
        store.add_environment({**load_environment(tmp_path / "env.yml"), "version": "1"})


def test_a_jobs_inline_environment_reads_its_conda_file_at_load(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "conda.yml").write_text("dependencies:\n  - python=3.11\n  - pip:\n    - amlemupin==1.0\n")
    (tmp_path / "job.yml").write_text("code: src\ncommand: echo hi\ncompute: azureml:c1\n"
                                      "environment:\n  image: base:1\n  conda_file: conda.yml\n")
    job = load_job(tmp_path / "job.yml")
    assert job.image == "base:1" and job.environment_def["conda_file"]["dependencies"][1]["pip"] == ["amlemupin==1.0"]
    (tmp_path / "job.yml").write_text("code: src\ncommand: echo hi\ncompute: azureml:c1\n"
                                      "environment:\n  image: base:1\n  conda_file: nope.yml\n")
    with pytest.raises(ConfigError, match="environment.conda_file"):
        load_job(tmp_path / "job.yml")


def test_an_index_url_never_shows_its_credentials() -> None:
    assert redact("https://user:s3cret@mirror.example/simple") == "https://***@mirror.example/simple"
    assert "s3cret" not in PackageSource("https://user:s3cret@mirror.example/simple").describe()


# --- builds ----------------------------------------------------------------------------------------
def _run(prefix: str, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([f"{prefix}/bin/python", "-c", code], capture_output=True, text=True, check=False,
                          env={"PATH": "/usr/bin:/bin"})  # as a node has it: no PYTHONPATH of the test's


def test_an_environment_holds_exactly_its_declared_packages(tmp_path: Path, source: PackageSource) -> None:
    one = software_for(None, {"image": "b", "conda_file": conda("amlemudep==1.0", "amlemupin==1.0", "packaging")},
                       NOBODY, tmp_path, source)
    two = software_for(None, {"image": "b", "conda_file": conda("amlemupin==2.0")}, NOBODY, tmp_path, source)
    assert _run(one.prefix, "import amlemupin, amlemudep; print(amlemupin.__version__)").stdout.strip() == "1.0"
    assert _run(two.prefix, "import amlemupin; print(amlemupin.__version__)").stdout.strip() == "2.0"
    # packaging came from this machine's venv (linked, not downloaded); what was not declared is absent
    assert one.built.record["reused_from_host"] == {"packaging": one.built.record["installed"]["packaging"]}
    for undeclared in ("amlemudep", "yaml", "pytest", "amlemu"):
        assert "ModuleNotFoundError" in _run(two.prefix, f"import {undeclared}").stderr, undeclared
    # Compiled once at the build, the linked packages too: a node never compiles them on each start.
    assert one.built.record["bytecode"] is True
    site = next(Path(one.prefix).glob("lib/python3*/site-packages"))
    for package in ("amlemupin", "packaging"):
        assert list((site / package / "__pycache__").glob("__init__.*.pyc")), package


def test_an_environment_built_before_bytecode_is_compiled_on_its_next_use(tmp_path: Path, source: PackageSource) -> None:
    definition = {"image": "b", "conda_file": conda("amlemupin==1.0")}
    first = software_for(None, definition, NOBODY, tmp_path, source)
    site = next(Path(first.prefix).glob("lib/python3*/site-packages"))
    shutil.rmtree(site / "amlemupin" / "__pycache__")
    record = json.loads((Path(first.prefix) / RECORD).read_text())
    (Path(first.prefix) / RECORD).write_text(json.dumps({k: v for k, v in record.items() if k != "bytecode"}))
    again = software_for(None, definition, NOBODY, tmp_path, source)
    assert again.built.reused and again.built.record["bytecode"] is True
    assert list((site / "amlemupin" / "__pycache__").glob("__init__.*.pyc"))


def test_the_second_use_reuses_the_cache_and_concurrent_builds_build_once(tmp_path: Path, source: PackageSource,
                                                                           env_cache: Path) -> None:
    definition = {"image": "b", "conda_file": conda("amlemupin==1.0")}
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(software_for(None, definition, NOBODY, tmp_path, source)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.built.reused for r in results) == [False, True, True]  # one build, two waited and reused
    record = json.loads((Path(results[0].prefix) / RECORD).read_text())
    again = software_for(None, definition, NOBODY, tmp_path, source)
    assert again.built.reused and again.built.record == record  # the record of the one build, unchanged
    assert sorted(p.name for p in env_cache.iterdir() if p.is_dir()) == [record["key"], "uv-cache"]


def test_a_source_distribution_is_never_built_here(tmp_path: Path, source: PackageSource) -> None:
    """Building an sdist runs its build code on this machine: a job's environment gets wheels only."""
    marker = tmp_path / "build-backend-ran"
    pkg = tmp_path / "sdist" / "amlemusrc-1.0"
    pkg.mkdir(parents=True)
    (pkg / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: amlemusrc\nVersion: 1.0\n")
    # An in-tree build backend that needs nothing from an index: building would run it.
    (pkg / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n')
    (pkg / "backend.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    folder = Path(source.find_links[0])
    with tarfile.open(folder / "amlemusrc-1.0.tar.gz", "w:gz") as tar:
        tar.add(pkg, arcname="amlemusrc-1.0")
    with pytest.raises(BuildError, match="amlemusrc"):
        build(resolve(None, {"image": "b", "conda_file": conda("amlemusrc==1.0")}, NOBODY), tmp_path, source)
    assert not marker.exists()


def test_an_image_name_cannot_add_lines_to_the_layers_dockerfile(tmp_path: Path, source: PackageSource) -> None:
    hostile = resolve(None, {"image": "alpine\nRUN touch /pwned", "conda_file": conda("amlemupin==1.0")}, NOBODY)
    with pytest.raises(BuildError, match="is not an image reference"):
        build_layer(hostile, tmp_path, source)


def test_a_package_the_source_lacks_fails_the_build_naming_it(tmp_path: Path, source: PackageSource) -> None:
    with pytest.raises(BuildError, match="amlemupin") as failed:
        build(resolve(None, {"image": "b", "conda_file": conda("amlemupin==3.0")}, NOBODY), tmp_path, source)
    assert "\n" not in str(failed.value) and "could not be built" in str(failed.value)
    with pytest.raises(BuildError, match="python 2.7 is not installed"):
        build(resolve(None, {"image": "b", "conda_file": conda(python="2.7")}, NOBODY), tmp_path, source)
