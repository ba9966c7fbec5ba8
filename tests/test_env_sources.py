"""Package sources as the user's pip has them: environments build from pip's configuration files and
PIP_* variables by default (PyPI when none), from AMLEMU_PACKAGE_INDEX / AMLEMU_FIND_LINKS when
those name the emulator's own, and from nothing with AMLEMU_OFFLINE=1; a package no source has
fails the build with one line naming it, the sources tried and the way out."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from envwheels import wheelhouse

from amlemu.api import Emulator
from amlemu.envs import pipsources
from amlemu.envs.build import PackageSource, build
from amlemu.envs.resolve import resolve
from amlemu.errors import BuildError
from amlemu.specs import RunStatus

NOBODY = lambda name, version: None  # noqa: E731 - no registered environment
# A small pure-Python wheel this machine's pip finds in its configured sources (a local index) and
# the project's venv does not have: `pip download --no-deps appdirs==1.4.4` fetches it here.
MISSING_FROM_VENV = "appdirs==1.4.4"


@pytest.fixture
def backend() -> str:
    """One backend is enough here: the build happens before either backend is involved."""
    return "process"


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMLEMU_ENV_CACHE", str(tmp_path / "envs"))
    for name in ("AMLEMU_OFFLINE", "AMLEMU_PACKAGE_INDEX", "AMLEMU_FIND_LINKS"):
        monkeypatch.delenv(name, raising=False)


def only_pip(config: Path, **variables: str) -> dict[str, str]:
    """This process's environment with pip reading `config` alone (no machine-wide file) and no PIP_* but those given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "AMLEMU_"))}
    return {**env, "PIP_CONFIG_FILE": str(config), **variables}


# --- pure: which sources -----------------------------------------------------------------------------
def test_pips_options_merge_as_pip_applies_them_to_install() -> None:
    listed = ("global.index-url='https://mirror.example/simple'\nglobal.find-links='/a /b'\n"
              "install.find-links='/c'\n:env:.extra-index-url='https://x.example/simple https://y.example/simple'\n"
              "global.no-index='false'\nnonsense line\n")
    sources = pipsources.from_options(pipsources.parse(listed))
    assert sources.index_url == "https://mirror.example/simple" and sources.find_links == ("/c",)  # install over global
    assert sources.extra_index_urls == ("https://x.example/simple", "https://y.example/simple") and not sources.no_index
    source = PackageSource(sources.index_url, sources.find_links, sources.extra_index_urls, offline=False,
                           origin=sources.origin)
    assert source.uv_args() == ["--index-url", "https://mirror.example/simple", "--extra-index-url",
                                "https://x.example/simple", "--extra-index-url", "https://y.example/simple",
                                "--find-links", "/c"]


def test_the_default_is_pips_configuration_the_emulators_variables_and_offline_override_it(tmp_path: Path) -> None:
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = https://user:s3cret@mirror.example/simple\nfind-links = /wheels\n")
    pip = PackageSource.from_env(only_pip(conf))
    assert (pip.index_url, pip.find_links, pip.offline) == ("https://user:s3cret@mirror.example/simple", ("/wheels",), False)
    assert "s3cret" not in pip.describe() and "pip's configuration" in pip.describe()
    with_variable = PackageSource.from_env(only_pip(conf, PIP_INDEX_URL="https://other.example/simple"))
    assert with_variable.index_url == "https://other.example/simple"  # a PIP_* variable over the file, as pip
    none = PackageSource.from_env(only_pip(Path(os.devnull)))
    assert none.uv_args() == [] and "(PyPI)" in none.describe()  # nothing configured: pip's default, PyPI
    explicit = PackageSource.from_env(only_pip(conf, AMLEMU_FIND_LINKS="/mine"))
    assert explicit.uv_args() == ["--no-index", "--find-links", "/mine"]  # the emulator's own source, as before
    offline = PackageSource.from_env(only_pip(conf, AMLEMU_OFFLINE="1"))
    assert offline.uv_args() == ["--no-index"] and "AMLEMU_OFFLINE" in offline.describe()
    assert len({pip.key().__repr__(), none.key().__repr__(), offline.key().__repr__()}) == 3  # cached apart


# --- builds ------------------------------------------------------------------------------------------------
def test_a_pip_conf_of_the_users_is_where_a_build_finds_its_packages(tmp_path: Path) -> None:
    links = wheelhouse(tmp_path / "wheels")
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nno-index = true\nfind-links = {links}\n")
    env = resolve(None, {"image": "b", "conda_file": {"dependencies": ["pip", {"pip": ["amlemupin==2.0"]}]}}, NOBODY)
    built = build(env, tmp_path, PackageSource.from_env(only_pip(conf)))
    assert built.record["installed"]["amlemupin"] == "2.0" and "pip's configuration" in built.record["source"]
    with pytest.raises(BuildError) as failed:  # a version no source has: the package, the sources, the way out
        build(resolve(None, {"image": "b", "conda_file": {"dependencies": [{"pip": ["amlemupin==9.0"]}]}}, NOBODY),
              tmp_path, PackageSource.from_env(only_pip(conf)))
    text = str(failed.value)
    assert "package amlemupin (amlemupin==9.0) was not found" in text and f"find-links {links}" in text and "\n" not in text
    assert "pip config set global.extra-index-url" in text


def test_a_job_declaring_a_package_the_venv_lacks_builds_from_pips_sources_and_offline_fails_in_one_line(
        emu: Emulator, cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On this machine's own pip configuration (its local indexes and wheel folders)."""
    lacking = subprocess.run([sys.executable, "-c", "import appdirs"], capture_output=True, check=False)
    assert lacking.returncode != 0, "the venv has appdirs: pick another package it lacks"
    cluster(max_nodes=1)
    (tmp_path / "conda.yml").write_text(f"dependencies:\n  - python=3.11\n  - pip:\n    - {MISSING_FROM_VENV}\n")
    (tmp_path / "job.yml").write_text(
        "command: python -c \"import appdirs; print('appdirs', appdirs.__version__)\"\ncompute: azureml:c1\n"
        "environment:\n  image: amlemu-tests/absent:1\n  conda_file: conda.yml\n")
    monkeypatch.setenv("AMLEMU_OFFLINE", "1")
    offline = emu.submit(tmp_path / "job.yml")
    assert offline.wait(timeout=180) is RunStatus.FAILED
    error = offline.record.error
    assert "package appdirs (appdirs==1.4.4) was not found" in error and "no index (from AMLEMU_OFFLINE=1)" in error, error
    assert "unset AMLEMU_OFFLINE" in error and "\n" not in error
    monkeypatch.delenv("AMLEMU_OFFLINE")
    online = emu.submit(tmp_path / "job.yml")
    assert online.wait(timeout=180) is RunStatus.COMPLETED, online.record.error
    assert "appdirs 1.4.4" in online.logs()
    assert "pip's configuration" in (online.dir / "system_logs" / "lifecycle.txt").read_text()


def test_a_missing_package_is_named_with_its_pin_however_uv_wraps_its_explanation(tmp_path: Path) -> None:
    """uv wraps its explanation at the terminal's width: the pin may sit on the next line."""
    from amlemu.envs import build  # noqa: PLC0415

    wrapped = ("error: No solution found when resolving dependencies\n  cause: Because there is no version of "
               "amlemupin==3.0 and you require\n         amlemupin==3.0, we can conclude that your requirements are\n"
               "         unsatisfiable.\n")
    argv = ["/bin/sh", "-c", f"printf '%s' '{wrapped}'; exit 1"]
    with pytest.raises(build.BuildError) as raised:
        build._run(argv, tmp_path / "uv.log", "environment e", build.PackageSource(None, (str(tmp_path),)))
    assert "package amlemupin (amlemupin==3.0) was not found in the sources tried: no index" in str(raised.value)
