"""Jobs run in the environment they name, on both backends: an import the environment lacks fails
the job (the ImportError in its log, a notice naming the environment), the same job with the
package declared completes, two pins of one package are each job's own, and the second run of an
environment reuses its build. Packages come from tiny local wheels (find-links, no index)."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from conftest import JobFactory, import_base_image
from envwheels import wheelhouse

from amlemu.api import Emulator
from amlemu.envs.build import RECORD
from amlemu.specs import RunStatus

SCRIPT = """
import amlemupin
print("amlemupin", amlemupin.__version__, flush=True)
"""


@pytest.fixture
def envs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A find-links folder as the package source (no index) and a cache of the test's own."""
    monkeypatch.setenv("AMLEMU_FIND_LINKS", str(wheelhouse(tmp_path / "wheels")))
    monkeypatch.setenv("AMLEMU_ENV_CACHE", str(tmp_path / "envs"))
    return tmp_path / "envs"


def with_env(make_job: JobFactory, *pip: str) -> Path:
    """A single-node job whose inline environment's conda file declares `pip` (image: not in the engine)."""
    job = make_job(SCRIPT, distribution="none")
    (job.parent / "conda.yml").write_text("dependencies:\n  - python=3.11\n  - pip\n  - pip:\n"
                                          + "".join(f"    - {p}\n" for p in pip))
    job.write_text(job.read_text() + "environment:\n  image: amlemu-tests/absent:1\n  conda_file: conda.yml\n")
    return job


def lifecycle(emu: Emulator, run) -> str:  # type: ignore[no-untyped-def]
    return (run.dir / "system_logs" / "lifecycle.txt").read_text()


def test_an_import_the_environment_lacks_fails_and_declaring_it_completes(emu: Emulator, cluster, make_job: JobFactory,
                                                                          envs: Path) -> None:
    cluster(max_nodes=1)
    job = with_env(make_job, "packaging")
    planned = emu.plan_job(job)["notices"]  # what `job create` prints at submit
    lacking = emu.submit(job)
    assert lacking.wait(timeout=180) is RunStatus.FAILED
    assert json.loads((lacking.dir / "system_logs" / "launch.json").read_text())["notices"] == planned
    assert "environment amlemu-tests/absent:1: nodes run exactly its packages (packaging)" in " ".join(planned)
    assert "ModuleNotFoundError: No module named 'amlemupin'" in lacking.logs()
    assert "environment amlemu-tests/absent:1 does not contain" in lacking.record.error
    assert "notice: the job imports amlemupin, which environment amlemu-tests/absent:1" in lifecycle(emu, lacking)
    declared = emu.submit(with_env(make_job, "amlemupin==1.0"))
    assert declared.wait(timeout=180) is RunStatus.COMPLETED, declared.record.error
    assert "amlemupin 1.0" in declared.logs()
    unobtainable = emu.submit(with_env(make_job, "amlemupin==3.0"))  # as Azure ML's failed image build
    assert unobtainable.wait(timeout=180) is RunStatus.FAILED
    assert "could not be built" in unobtainable.record.error and "amlemupin==3.0" in unobtainable.record.error


def test_two_pins_are_each_jobs_own_and_a_second_run_reuses_the_build(emu: Emulator, cluster, make_job: JobFactory,
                                                                      envs: Path) -> None:
    cluster(max_nodes=1)
    runs = [emu.submit(with_env(make_job, f"amlemupin=={v}")) for v in ("1.0", "2.0", "1.0")]
    for run in runs:
        assert run.wait(timeout=180) is RunStatus.COMPLETED, run.record.error
    assert [r.logs().strip().splitlines()[-1] for r in runs] == ["amlemupin 1.0", "amlemupin 2.0", "amlemupin 1.0"]
    records = {p.name: json.loads((p / RECORD).read_text()) for p in envs.iterdir() if (p / RECORD).is_file()}
    assert len(records) == 2  # one build per environment: the third run found the first's
    assert "reused from the cache" in lifecycle(emu, runs[2]) and "built in" in lifecycle(emu, runs[0])
    first = next(r for r in records.values() if r["installed"].get("amlemupin") == "1.0")
    assert f"at {envs / first['key']}" in lifecycle(emu, runs[2])


def test_where_the_engine_has_the_image_the_packages_are_a_docker_layer_on_it(tmp_path: Path, envs: Path) -> None:
    """A base image present locally (imported here, as no registry is reachable): the environment's
    packages are built onto it by `docker build`, under a tag named by content hash, built once."""
    import docker

    from amlemu.envs.layer import SITE
    from amlemu.envs.software import plan_software, software_for

    client = docker.from_env()
    base = import_base_image(client)
    made: list[str] = [base]
    try:
        definition = {"image": base, "conda_file": {"dependencies": ["python=3.11", {"pip": ["amlemupin==2.0"]}]}}
        engine = lambda i: bool(client.images.list(i))  # noqa: E731 - the docker backend's has_image
        planned = plan_software(None, definition, lambda n, v: None, tmp_path, has_image=engine)  # the dry run's
        assert planned.image and not planned.built and not client.images.list(planned.image)  # nothing built
        first = software_for(None, definition, lambda n, v: None, tmp_path, has_image=lambda i: bool(client.images.list(i)))
        made.append(first.image)
        again = software_for(None, definition, lambda n, v: None, tmp_path, has_image=lambda i: True)
        assert first.prefix is None and first.image.startswith("amlemu/env:") and again.image == first.image
        assert first.image == planned.image and plan_software(None, definition, lambda n, v: None, tmp_path,
                                                              has_image=engine).built
        layered = client.images.get(first.image)
        assert layered.attrs["RootFS"]["Layers"][0] == client.images.get(base).attrs["RootFS"]["Layers"][0]
        assert f"PYTHONPATH={SITE}" in layered.attrs["Config"]["Env"]
        container = client.containers.create(first.image, command=["none"])
        try:
            stream, _ = container.get_archive(f"{SITE}/amlemupin/__init__.py")
            member = tarfile.open(fileobj=io.BytesIO(b"".join(stream)))
            assert member.extractfile("__init__.py").read() == b"__version__ = '2.0'\n"
        finally:
            container.remove(force=True)
    finally:
        for image in reversed(made):
            client.images.remove(image, force=True)
