"""Rank 1 reads the right shard: the data comes from a datastore, mounted on each node."""
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("shard_reader.py")


@pytest.mark.aml(nodes=2, procs=1)
def test_each_rank_reads_its_own_shard(aml_run, aml_datastore, tmp_path):
    for i in range(4):
        (tmp_path / f"part-{i}.txt").write_text(f"rows of shard {i}")
    data = aml_datastore.upload(tmp_path, "shards")
    run = aml_run.script(SCRIPT, ["${{inputs.data}}"], inputs={"data": data})
    assert "rank 1 read part-1.txt: rows of shard 1" in run.logs(1)
    assert "rank 1 read part-3.txt: rows of shard 3" in run.logs(1)
    assert "part-1.txt" not in run.logs(0)
