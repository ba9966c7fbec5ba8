"""Import costs put off until they are needed (or never paid).

jsonschema (which azure-ai-ml imports) imports rfc3987_syntax whenever it is installed, for its
"iri" format checkers, and that module compiles 39 Lark grammars as it is imported: over a second
of CPU in every CLI call that loads azure-ai-ml (about a third of one), for a check azure-ai-ml
never asks for (it validates without a format checker). `defer_rfc3987_syntax` puts a stand-in in
its place whose `is_valid_syntax` (the one name jsonschema takes) and every other attribute load
the real module on first use, so a format check that does run behaves as before. Its dunders are
the real module's or missing: azure-ai-ml's experimental warnings call inspect.stack(), which asks
every module for `__file__`, and loading the real module there cost ~6 s a CLI call.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from typing import Any

NAME = "rfc3987_syntax"


def defer_rfc3987_syntax() -> None:
    """Before jsonschema is imported; a no-op when it is imported already or the module is absent."""
    if NAME in sys.modules or "jsonschema" in sys.modules:
        return
    spec = importlib.util.find_spec(NAME)
    if spec is None or spec.submodule_search_locations is None:
        return
    stand_in = types.ModuleType(NAME)
    stand_in.__path__ = list(spec.submodule_search_locations)  # its submodules import as they are
    stand_in.__spec__, stand_in.__file__, stand_in.__loader__ = spec, spec.origin, spec.loader

    def real() -> types.ModuleType:
        return importlib.import_module(f"{NAME}.syntax_helpers")  # what the package's __init__ re-exports

    def is_valid_syntax(term: str, value: str) -> bool:
        return real().is_valid_syntax(term, value)  # type: ignore[no-any-return]

    def __getattr__(name: str) -> Any:  # noqa: N807 - a module's own attribute hook (PEP 562)
        if name.startswith("__"):  # inspect.stack() asks every module for its dunders: not a use
            raise AttributeError(name)
        return getattr(real(), name)

    stand_in.is_valid_syntax = is_valid_syntax  # type: ignore[attr-defined]
    stand_in.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules[NAME] = stand_in


def import_docker() -> types.ModuleType:
    """The docker SDK without its ssh transport unless DOCKER_HOST asks for ssh://: the SDK imports
    paramiko (~30 ms, a third of its own import) for it whenever paramiko is installed, and treats
    its absence as "no ssh support". Every docker node's supervisor pays the SDK's import."""
    if "docker" in sys.modules or "paramiko" in sys.modules or os.environ.get("DOCKER_HOST", "").startswith("ssh://"):
        return importlib.import_module("docker")
    sys.modules["paramiko"] = None  # type: ignore[assignment] - import paramiko now raises ImportError
    try:
        return importlib.import_module("docker")
    finally:
        del sys.modules["paramiko"]  # a later import of paramiko (another library's) finds the real one
