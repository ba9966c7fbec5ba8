"""Uploads over azure-storage-blob's single-put size (64 MiB) come as blocks: Put Block for each
piece, then Put Block List. The pure staging, then both upload paths of the service (the code
snapshot's SAS URL, the datastore a local input goes to) with pieces forced small."""
from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from amlemu.api import Emulator
from amlemu.service.protocol.auth import Auth
from amlemu.service.protocol import blocks as blocks_module
from amlemu.service.protocol.blocks import ENTRY_BYTES, EXPIRY, Blocks, block_list_ids
from amlemu.service.state.emulator import EmulatorState
from amlemu.service.protocol.routes import Context
from amlemu.service.server import run_in_thread
from amlemu.service.state import ServiceError

WS = ("/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/amlemu-rg/providers/"
      "Microsoft.MachineLearningServices/workspaces/amlemu-ws")
DATA = bytes(range(256)) * 40  # 10 KiB, not a multiple of the piece size


def _list(*ids: str) -> bytes:
    return ("<?xml version='1.0' encoding='utf-8'?>\n<BlockList>" + "".join(f"<Latest>{i}</Latest>" for i in ids)
            + "</BlockList>").encode()


def test_pieces_join_in_the_order_the_list_names_them_and_are_then_forgotten() -> None:
    blocks = Blocks()
    assert blocks.upload("c", "b", {"comp": "block", "blockid": "Mg=="}, b"world") is None
    assert blocks.upload("c", "b", {"comp": "block", "blockid": "MQ=="}, b"hello ") is None
    assert blocks.upload("c", "b", {"comp": "blocklist"}, _list("MQ==", "Mg==")) == b"hello world"
    assert blocks.staged == {}
    assert blocks.upload("c", "b", {}, b"whole") == b"whole"  # a single put is the body itself


def test_a_list_naming_a_piece_never_put_and_other_blob_kinds_are_refused() -> None:
    blocks = Blocks()
    blocks.stage("c", "b", "MQ==", b"x")
    with pytest.raises(ServiceError, match="block Mg== of c/b was never put") as missing:
        blocks.commit("c", "b", _list("MQ==", "Mg=="))
    assert (missing.value.status, missing.value.code) == (400, "InvalidBlockList")
    with pytest.raises(ServiceError, match="comp=appendblock is not served"):
        blocks.upload("c", "b", {"comp": "appendblock"}, b"x")
    with pytest.raises(ServiceError, match="blockid"):
        blocks.upload("c", "b", {"comp": "block"}, b"x")
    assert block_list_ids(b"<BlockList><Committed>QQ==</Committed><Uncommitted>Qg==</Uncommitted></BlockList>") == [
        "QQ==", "Qg=="]
    with pytest.raises(ServiceError, match="BlockList"):
        block_list_ids(b"<!DOCTYPE x [<!ENTITY a 'b'>]><x>&a;</x>")


def test_a_block_costs_what_it_holds_ids_included() -> None:
    """20,000 empty blocks with long ids are not free: each counts its id and its entry."""
    blocks = Blocks()
    blocks.stage("c", "b", "Q" * 88, b"")
    assert blocks.held() == 88 + ENTRY_BYTES
    blocks.stage("c", "b", "Q" * 88, b"abc")  # the same id again replaces its piece
    assert blocks.held() == 3 + 88 + ENTRY_BYTES
    with pytest.raises(ServiceError, match="at most 64 bytes") as long_id:
        blocks.stage("c", "b", "Q" * 89, b"")
    assert (long_id.value.status, long_id.value.target) == (400, "blockid")


def test_a_runs_blocks_have_their_own_share_and_leave_the_users_free(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blocks_module, "RUN_SHARE", 10_000)
    monkeypatch.setattr(blocks_module, "RUNS_TOTAL", 15_000)
    monkeypatch.setattr(blocks_module, "USER_SHARE", 20_000)
    blocks = Blocks()
    piece = b"x" * 4_000
    for n in range(2):
        blocks.stage("uploads-r1", "f", f"{n:04d}", piece, owner="r1")
    with pytest.raises(ServiceError, match="run r1's uncommitted blocks") as full:
        blocks.stage("uploads-r1", "f", "0002", piece, owner="r1")
    assert full.value.status == 413
    blocks.stage("uploads-r2", "f", "0000", piece, owner="r2")
    with pytest.raises(ServiceError, match="the runs' uncommitted blocks"):  # all runs together
        blocks.stage("uploads-r2", "f", "0001", piece, owner="r2")
    for n in range(4):  # the user's share is untouched by the runs'
        blocks.stage("code-1", "big.bin", f"{n:04d}", piece)
    with pytest.raises(ServiceError, match="another uploader"):  # nor can a run add to the user's blob
        blocks.stage("code-1", "big.bin", "0009", piece, owner="r1")
    assert blocks.upload("uploads-r1", "f", {"comp": "blocklist"}, _list("0000", "0001"),
                         owner="r1") == piece * 2
    assert blocks.held("r1") == 0


def test_staged_blocks_expire_an_hour_after_their_last_piece_or_with_their_run() -> None:
    now = [1000.0]
    blocks = Blocks(clock=lambda: now[0])
    blocks.stage("code-1", "old.bin", "MQ==", b"x" * 100)
    blocks.stage("uploads-r1", "f", "MQ==", b"y" * 100, owner="r1")
    now[0] += EXPIRY - 1
    blocks.stage("code-1", "new.bin", "MQ==", b"z", active=lambda run: True)
    assert set(blocks.staged) == {("code-1", "old.bin"), ("uploads-r1", "f"), ("code-1", "new.bin")}
    blocks.stage("code-1", "new.bin", "Mg==", b"z", active=lambda run: run != "r1")  # r1 ended
    assert set(blocks.staged) == {("code-1", "old.bin"), ("code-1", "new.bin")}
    now[0] += 2
    blocks.stage("code-1", "new.bin", "Mw==", b"z")
    assert set(blocks.staged) == {("code-1", "new.bin")}  # old.bin's last piece is over an hour old


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[str, dict[str, str], Path]]:
    """The service over a real emulator home, in this process: (url, bearer header, CA bundle)."""
    emu = Emulator(tmp_path / "emu", backend="process")
    auth = Auth.fresh()
    running = run_in_thread(Context(EmulatorState(emu, lambda line: None), auth), tmp_path / "tls")
    try:
        ca = tmp_path / "tls" / "ca-bundle.pem"
        token = requests.get(f"{running.url}/msi/token", params={"resource": running.url},
                             headers={"X-IDENTITY-HEADER": auth.identity_header}, verify=ca, timeout=10).json()
        yield running.url, {"Authorization": f"Bearer {token['access_token']}"}, ca
    finally:
        running.stop()
        emu.cleanup()


def test_a_code_file_sent_in_blocks_is_one_file_of_the_snapshot(live: tuple[str, dict[str, str], Path]) -> None:
    """azure-storage-blob itself, told to send pieces of 1 KiB (as it sends 4 MiB pieces of a file
    over 64 MiB), through the SAS URL the service hands out for a code upload."""
    from azure.storage.blob import BlobClient  # noqa: PLC0415

    url, bearer, ca = live
    pending = requests.post(url + WS + "/codes/src/versions/1/startPendingUpload", json={}, headers=bearer,
                            verify=ca, timeout=10).json()["blobReferenceForConsumption"]
    container_sas = pending["credential"]["sasUri"]
    base, sas = container_sas.split("?", 1)
    client = BlobClient.from_blob_url(f"{base}/model/weights.bin?{sas}", max_single_put_size=1024,
                                      max_block_size=1024, connection_verify=str(ca))
    client.upload_blob(DATA, metadata={"upload_status": "completed"})
    got = requests.get(f"{base}/model/weights.bin?{sas}", verify=ca, timeout=10)
    assert got.status_code == 200 and got.content == DATA
    assert got.headers["x-ms-meta-upload_status"] == "completed"


def test_a_local_input_file_sent_in_blocks_lands_whole_on_the_datastore(live: tuple[str, dict[str, str], Path]) -> None:
    url, bearer, ca = live
    blob = f"{url}/amlemustore.blob.core.windows.net/workspaceblobstore/LocalUpload/abc/big.bin"
    pieces = [DATA[i:i + 4096] for i in range(0, len(DATA), 4096)]
    ids = [base64.b64encode(f"{n:06d}".encode()).decode() for n in range(len(pieces))]
    for block_id, piece in zip(ids, pieces):
        put = requests.put(blob, params={"comp": "block", "blockid": block_id}, data=piece, headers=bearer,
                           verify=ca, timeout=60)
        assert put.status_code == 201, put.text
    assert requests.get(blob, headers=bearer, verify=ca, timeout=60).status_code == 404  # nothing until the list
    done = requests.put(blob, params={"comp": "blocklist"}, data=_list(*ids), headers=bearer, verify=ca, timeout=60)
    assert done.status_code == 201, done.text
    assert requests.get(blob, headers=bearer, verify=ca, timeout=60).content == DATA
    wrong = requests.put(blob, params={"comp": "blocklist"}, data=_list("bm9wZQ=="), headers=bearer, verify=ca,
                         timeout=60)
    assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "InvalidBlockList"
