"""Every environment reference users write (the shapes of azureml-examples' cli/jobs/basics and Azure
ML's docs) resolves as Azure ML resolves it, pure: a registry's curated environment by label or
version, a workspace's curated name with or without its AzureML- prefix, by label or version, an
inline image; an unknown registry or name is one line naming it and the names that exist."""
from __future__ import annotations

from pathlib import Path

import pytest

from amlemu.envs import curated
from amlemu.envs.resolve import EnvRef, parse_ref, resolve
from amlemu.envs.software import planned_notices
from amlemu.errors import ConfigError
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
