"""Components on the service's routes (issue 29), as azure-ai-ml's `ml_client.components.*` and its
pipeline submit call them: containers (`.../components`, `.../components/{name}`: latestVersion,
nextVersion) and versions (`.../components/{name}/versions[/{version}]`; PUT registers one, the
anonymous `azureml_anonymous/<hash>` ones a pipeline's steps get included), over the emulator's
component registry (state/componentstate.py). A state with no emulator home behind it (the tests'
double) keeps no components: these routes answer 501 there."""
from __future__ import annotations

from collections.abc import Callable

from amlemu.service.protocol.calls import Call, Reply
from amlemu.service.state import ServiceError, whole_number


def _components(call: Call):  # type: ignore[no-untyped-def]
    pipelines = getattr(call.st, "pipelines", None)  # the capability that runs components holds them
    if pipelines is None:
        raise ServiceError(501, "NotImplemented", "this service keeps no components", target="components")
    return pipelines.components


def _name(call: Call) -> str:
    return call.params["name"].removeprefix("azureml:")  # the SDK keeps the prefix inside ids


def version(call: Call) -> Reply:
    components, name, ver = _components(call), _name(call), call.params["version"]
    if call.method == "PUT":
        return Reply(201, components.put(name, ver, call.props))
    return Reply(body=components.get(name, ver))


def versions(call: Call) -> Reply:
    top = call.query.get("$top")
    found = _components(call).versions(_name(call), call.query.get("$orderBy"),
                                       None if top is None else whole_number(int(top) if top.isdigit() else top,
                                                                             "$top", 0))
    return Reply(body={"value": found, "nextLink": None})


def container(call: Call) -> Reply:
    return Reply(body=_components(call).container(_name(call)))


def containers(call: Call) -> Reply:
    return Reply(body={"value": _components(call).containers(), "nextLink": None})


def routes(ws: str) -> list[tuple[str, str, Callable[[Call], Reply], bool]]:
    return [("GET", f"{ws}/components", containers, True),
            ("GET", f"{ws}/components/{{name}}", container, True),
            ("GET", f"{ws}/components/{{name}}/versions", versions, True),
            ("GET|PUT", f"{ws}/components/{{name}}/versions/{{version}}", version, True)]
