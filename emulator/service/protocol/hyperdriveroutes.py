"""SDK v1 HyperDrive on the service's routes: the code snapshot azureml-core creates for it (getblob
hands out an upload URL per changed file, the snapshot POST names them and its parent: the v1
state's snapshots, state/v1snapshots.py) and the hyperdrive service's runs (create: the multipart
`config` file of HyperDriveConfig's submit; cancel), which the v1 state makes sweeps of
(state/v1hyperdrive.py). A state without v1 (the tests' double) answers 501.

The upload URLs: azureml-core rebuilds the blob host from the URL as `<account>.blob.<suffix>`
(azureml._file_utils.upload: the host split at its first two dots), so a URL on this service's
`127.0.0.1:<port>` would come back as the unresolvable `127.blob.0.1:<port>`. The URLs handed out
carry the account in their user-info part instead, `https://amlemu.blob.snapshots@127.0.0.1:<port>/...`,
which that split puts back together unchanged: the request reaches this service (the user-info is
sent as a basic-auth header the signed blob route ignores), signed for its one container.
"""
from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from amlemu.service.protocol.calls import Call, Reply
from amlemu.service.protocol.v1online import _v1
from amlemu.service.protocol.v1routes import _multipart
from amlemu.service.state import ACCOUNT, bad_request
from amlemu.service.state.v1snapshots import MAX_FILES, new_container

WS = ("/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.MachineLearningServices"
      "/workspaces/{ws}")
HD = "/hyperdrive/v1.0" + WS + "/experiments/{experiment}/runs"
BLOB_USERINFO = "amlemu.blob.snapshots@"  # see the module's docstring


def upload_base(base: str) -> str:
    """The service's URL as azureml-core's snapshot upload parses it back into the same host."""
    return f"https://{BLOB_USERINFO}{urlsplit(base).netloc}"


def snapshot_blobs(call: Call) -> Reply:
    """`getblob`: an upload URL for each file the client will send, in a fresh container."""
    names = call.body.get("FileNames") if isinstance(call.body, dict) else None
    if not isinstance(names, list) or len(names) > MAX_FILES:
        raise bad_request("FileNames", f"FileNames: a list of at most {MAX_FILES} file names; leave files out "
                          "with .amlignore")
    _v1(call)
    container = new_container()
    sas = f"sv=2021-08-06&sr=c&sp=rcwl&sig={call.ctx.auth.sign(container)}"
    root = f"{upload_base(call.base)}/{ACCOUNT}/{container}"
    return Reply(body={"fileNodes": [{"fullName": str(name), "blobUri": f"{root}/f{i}?{sas}"}
                                     for i, name in enumerate(names)]})


def snapshot_create(call: Call) -> Reply:
    _v1(call).snapshots.create(call.params["id"], call.body)
    return Reply(body={"id": call.params["id"]})


def create_run(call: Call) -> Reply:
    """HyperDriveConfig's submit: ExperimentResponseDto, whose platform_config names the parent run."""
    v1 = _v1(call)
    config = _multipart(call).get("config")
    if config is None:
        raise bad_request("config", "config: missing; submit with azureml-core's Experiment.submit(HyperDriveConfig)")
    return Reply(201, v1.hyperdrive.create(call.params["experiment"], config))


def cancel_run(call: Call) -> Reply:
    return Reply(body=_v1(call).hyperdrive.cancel(call.params["name"]))


ROUTES: list[tuple[str, str, Callable[[Call], Reply], bool | str]] = [
    ("POST", "/content/v2.0" + WS + "/snapshots/getblob", snapshot_blobs, True),
    ("POST", "/content/v2.0" + WS + "/snapshots/{id}", snapshot_create, True),
    ("POST", HD, create_run, True),
    ("POST", HD + "/{name}/cancel", cancel_run, True),
]
