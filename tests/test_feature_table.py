"""README's "Azure ML job features" table stays true: each test file it names exists, and each
feature it marks `not` is still refused with one line naming the field (or, for a probe with no
field, still accepted with a notice). Implementing one of them fails this test until the table says so."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

from amlemu.errors import AmlEmuError
from amlemu.jobs.jobyaml import job_from_dict
from amlemu.pipelines.pipelinespec import pipeline_from_dict

BASE = {"command": "python t.py", "code": "src", "compute": "azureml:c1"}
# A `not` row's probe: the job that uses the feature, and the field its refusal must name.
PROBES: dict[str, tuple[dict[str, Any], str | None]] = {
    "runs-model": ({**BASE, "command": "python t.py ${{inputs.m}}",
                    "inputs": {"m": {"type": "mlflow_model", "path": "runs:/0123/model"}}}, "inputs.m.path"),
    "registry-asset": ({**BASE, "command": "python t.py ${{inputs.m}}",
                        "inputs": {"m": {"type": "uri_folder", "path": "azureml://registries/r/data/d/versions/1"}}},
                       "inputs.m.path"),
    "parallel-step": ({"type": "pipeline", "settings": {"default_compute": "azureml:c1"},
                       "jobs": {"score": {"type": "parallel", "task": {"type": "run_function"}}}}, "jobs.score.type"),
}


def _rows() -> list[tuple[str, str, str]]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Azure ML job features: emulated / partly / not", 1)[1].split("\n#", 1)[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| feature")]
    return [(feature, status, checked) for feature, status, checked in rows]


def test_the_table_names_existing_tests_and_a_probe_for_every_feature_not_emulated() -> None:
    rows = _rows()
    assert len(rows) >= 15
    for feature, status, checked in rows:
        word = status.split(":")[0]
        assert word in ("emulated", "partly", "not"), f"{feature}: status {status!r}"
        if word == "not":
            assert checked in PROBES, f"{feature}: name a probe of tests/test_feature_table.py, not {checked!r}"
        else:
            for name in checked.split(", "):
                assert re.fullmatch(r"tests/test_\w+\.py", name) and (REPO / name).is_file(), f"{feature}: {name}"
    assert {checked for _, status, checked in rows if status.startswith("not")} == set(PROBES)


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_a_feature_marked_not_is_still_refused_naming_its_field(probe: str, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "t.py").write_text("print(1)\n")
    data, field = PROBES[probe]
    if field is None:  # accepted, and the run says what is not emulated
        job = job_from_dict(data, base_dir=tmp_path)
        assert job.notices and all("is not emulated" in notice for notice in job.notices)
        return
    with pytest.raises(AmlEmuError) as refused:
        if data.get("type") == "pipeline":
            pipeline_from_dict(data, base_dir=tmp_path)
        else:
            job_from_dict(data, base_dir=tmp_path)
    assert str(refused.value).startswith(f"{field}:") and "\n" not in str(refused.value)
