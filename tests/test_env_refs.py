"""Every environment reference users write (the shapes of azureml-examples' cli/jobs/basics and Azure
ML's docs) resolves as Azure ML resolves it, pure: a registry's curated environment by label or
version, a workspace's curated name with or without its AzureML- prefix, by label or version, an
inline image, a Docker build context (built by the engine where it has the base images); an
unknown registry or name is one line naming it and the names that exist."""
from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from conftest import import_base_image

from amlemu.envs import contextbuild, curated
from amlemu.envs.resolve import EnvRef, parse_ref, resolve
from amlemu.envs.software import Software, missing_import, plan_software, planned_notices, software_for
from amlemu.errors import ConfigError
from amlemu.jobs.envyaml import load_environment
from amlemu.jobs.jobyaml import load_job

NOBODY = lambda name, version: None  # noqa: E731 - no registered environment
SKLEARN = "azureml://registries/azureml/environments/sklearn-1.5/labels/latest"  # the examples' most used


@pytest.mark.parametrize("ref, parsed", [
    (SKLEARN, EnvRef("sklearn-1.5", None, "azureml")),
    ("azureml://registries/azureml/environments/sklearn-1.5/versions/23", EnvRef("sklearn-1.5", "23", "azureml")),
    ("azureml:AzureML-sklearn-1.5@latest", EnvRef("AzureML-sklearn-1.5")),
    ("azureml:AzureML-sklearn-1.5:23", EnvRef("AzureML-sklearn-1.5", "23")),
    ("azureml:sklearn-1.5@latest", EnvRef("sklearn-1.5")),
    ("azureml:AzureML-sklearn-1.5", EnvRef("AzureML-sklearn-1.5")),
])
def test_each_shape_of_a_curated_reference_is_the_same_curated_environment(ref: str, parsed: EnvRef) -> None:
    assert parse_ref(ref) == parsed
    env = resolve(ref, None, NOBODY)
    assert env.kind == "curated" and env.curated is curated.lookup("AzureML-sklearn-1.5")
    assert "scikit-learn~=1.5.0" in env.requirements and env.python == "3.10" and env.label == parsed.label
    assert (f"version {parsed.version} is emulated with the pins of AzureML-sklearn-1.5@latest" in " ".join(env.notices)
            ) == (parsed.version is not None)


def test_a_workspace_environment_of_a_curated_name_is_the_workspaces() -> None:
    mine = {"name": "sklearn-1.5", "version": "1", "image": "python:3.11", "conda_file": None, "build_path": None}
    assert resolve("azureml:sklearn-1.5@latest", None, lambda name, version: mine).kind == "image"
    # a registry's reference never reads the workspace
    assert resolve(SKLEARN, None, lambda name, version: mine).kind == "curated"


@pytest.mark.parametrize("name", ["AzureML-sklearn-1.5", "AzureML-lightgbm-3.3", "AzureML-tensorflow-2.16-cuda12",
                                  "AzureML-minimal-py311-inference", "AzureML-ACPT-pytorch-2.2-cuda12.1"])
def test_the_curated_environments_azure_mls_examples_use_are_in_the_table_with_their_sources(name: str) -> None:
    env = curated.lookup(name)
    assert env is not None and curated.lookup(env.short_name) is env and env.python and env.image
    for package, pin in env.pins.items():
        assert pin.source.startswith("https://github.com/Azure/azureml-assets/blob/"), package
    shown = " ".join(planned_notices(f"azureml://registries/azureml/environments/{env.short_name}/labels/latest",
                                     None, NOBODY))
    assert f"environments/{env.short_name}/labels/latest" in shown  # named by the reference the job wrote


@pytest.mark.parametrize("ref, message", [
    ("azureml://registries/contoso/environments/sklearn-1.5/labels/latest",
     r"^environment: azureml://registries/contoso/.*: registry 'contoso' is not emulated \(the registry that exists "
     r"here is azureml, with .*AzureML-sklearn-1.5"),
    ("azureml://registries/azureml/environments/sklearn-9.9/labels/latest",
     r"^environment: .*curated environment sklearn-9.9 is not in amlemu's table \(it has .*AzureML-lightgbm-3.3"),
    ("azureml:AzureML-sklearn-9.9@latest", r"curated environment AzureML-sklearn-9.9 is not in amlemu's table"),
    ("azureml:mine@latest", r"^environment: azureml:mine@latest is not registered in this workspace; register it .*"
                            r"or name a curated one \(.*AzureML-sklearn-1.5"),
    ("azureml:AzureML-sklearn-1.5@stable", r"label 'stable' .* is not supported"),
    ("azureml://registries/azureml/environments/sklearn-1.5/labels/stable", r"label 'stable' .* is not supported"),
    ("azureml:/sklearn", r"is not an environment reference; write azureml:<name>@latest, .*azureml://registries/"),
])
def test_an_unknown_registry_name_or_label_is_one_line_naming_what_exists(ref: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        resolve(ref, None, NOBODY)
    assert "\n" not in str(err.value)


def test_inline_image_shapes_load_as_the_examples_write_them(tmp_path: Path) -> None:
    for image in ("library/python:latest", "python", "library/python:3.11.6"):
        (tmp_path / "job.yml").write_text(f"command: echo hi\ncompute: azureml:c1\nenvironment:\n  image: {image}\n")
        job = load_job(tmp_path / "job.yml")
        assert job.image == image and resolve(job.environment, job.environment_def, NOBODY).kind == "image"
    (tmp_path / "job.yml").write_text(f"command: echo hi\ncompute: azureml:c1\nenvironment: {SKLEARN}\n")
    assert load_job(tmp_path / "job.yml").environment == SKLEARN and load_job(tmp_path / "job.yml").image is None


# --- build contexts ---------------------------------------------------------------------------------
def test_a_dockerfiles_base_images_and_what_keeps_it_from_being_built_here() -> None:
    text = ("# comment\nFROM --platform=linux/amd64 mcr.microsoft.com/azureml/openmpi5.0-ubuntu24.04:latest AS base\n"
            "RUN apt-get update && \\\n    apt-get install -y git\nFROM base\nCOPY --from=base /a /a\n"
            "COPY --from=other/tool:1 /t /t\nADD https://example.com/x.tgz /x\n")
    images, problems = contextbuild.base_images(text)
    assert images == ["mcr.microsoft.com/azureml/openmpi5.0-ubuntu24.04:latest", "other/tool:1"]
    assert problems == ["ADD https://example.com/x.tgz would be fetched by the engine (no network is reached here)"]
    assert contextbuild.base_images("RUN echo\n")[1] == ["it has no FROM instruction"]


def test_a_build_context_is_built_by_the_engine_when_it_has_the_base_image_else_a_notice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A base image present locally (imported here, as no registry is reachable): the context is
    built into an image the nodes run, tagged by content hash and built once; a base image the
    engine lacks (or a backend without one) leaves nodes on this machine's software, with the notice."""
    import docker

    monkeypatch.setenv("AMLEMU_ENV_CACHE", str(tmp_path / "envs"))
    client = docker.from_env()
    base = import_base_image(client)
    context = tmp_path / "context"
    (context / "docker").mkdir(parents=True)
    (context / "hello.txt").write_text("hello from the context\n")
    (context / "docker" / "train.Dockerfile").write_text(f"FROM {base}\nCOPY hello.txt /opt/hello.txt\nENV GREETING=hi\n")
    (tmp_path / "env.yml").write_text("name: built\nbuild:\n  path: context\n  dockerfile_path: docker/train.Dockerfile\n")
    definition = load_environment(tmp_path / "env.yml")
    made = [base]
    try:
        engine = lambda image: bool(client.images.list(image))  # noqa: E731 - the docker backend's has_image
        planned = plan_software(None, definition, NOBODY, tmp_path, has_image=engine)  # the dry run's: nothing built
        assert planned.image and not planned.built and not client.images.list(planned.image)
        first = software_for(None, definition, NOBODY, tmp_path, has_image=engine)
        assert first.image == planned.image and plan_software(None, definition, NOBODY, tmp_path, has_image=engine).built
        made.append(str(first.image))
        assert first.image and first.image.startswith("amlemu/build:") and first.prefix is None
        built = client.images.get(first.image)
        assert "GREETING=hi" in built.attrs["Config"]["Env"] and built.labels["amlemu"] == "1"
        container = client.containers.create(first.image, command=["none"])
        try:
            stream, _ = container.get_archive("/opt/hello.txt")
            assert tarfile.open(fileobj=io.BytesIO(b"".join(stream))).extractfile("hello.txt").read() == \
                b"hello from the context\n"
        finally:
            container.remove(force=True)
        assert software_for(None, definition, NOBODY, tmp_path, has_image=engine).image == first.image  # built once
        lines: list[str] = []
        on_process = software_for(None, definition, NOBODY, tmp_path, log=lines.append)  # no engine: no image
        assert on_process.image is None and on_process.prefix is None
        assert f"no engine here has its base image {base}" in " ".join(on_process.notices) and lines
    finally:
        for image in reversed(made):
            client.images.remove(image, force=True)


def test_an_import_a_curated_environment_has_but_this_machine_lacks_names_both() -> None:
    env = resolve("azureml:AzureML-tensorflow-2.16-cuda12@latest", None, NOBODY)
    hint = missing_import("ModuleNotFoundError: No module named 'tensorflow'", Software(env, None, ()), lambda _: None)
    assert hint and "has (tensorflow==2.16.2) but this machine's software" in hint and "not downloaded" in hint
    other = missing_import("ModuleNotFoundError: No module named 'foo'", Software(env, None, ()), lambda _: None)
    assert other and "which this machine's software does not contain; declare it" in other
