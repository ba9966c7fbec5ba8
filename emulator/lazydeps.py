"""Import costs put off until they are needed.

jsonschema (which azure-ai-ml imports) imports rfc3987_syntax whenever it is installed, for its
"iri" format checkers, and that module compiles 39 Lark grammars as it is imported: over a second
of CPU in every CLI call that loads azure-ai-ml (about a third of one), for a check azure-ai-ml
never asks for (it validates without a format checker). `defer_rfc3987_syntax` puts a stand-in in
its place whose `is_valid_syntax` (the one name jsonschema takes) and every other attribute load
the real module on first use, so a format check that does run behaves as before.
"""
from __future__ import annotations

import importlib
import importlib.util
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
    stand_in.__spec__ = spec

    def real() -> types.ModuleType:
        return importlib.import_module(f"{NAME}.syntax_helpers")  # what the package's __init__ re-exports

    def is_valid_syntax(term: str, value: str) -> bool:
        return real().is_valid_syntax(term, value)  # type: ignore[no-any-return]

    def __getattr__(name: str) -> Any:  # noqa: N807 - a module's own attribute hook (PEP 562)
        return getattr(real(), name)

    stand_in.is_valid_syntax = is_valid_syntax  # type: ignore[attr-defined]
    stand_in.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules[NAME] = stand_in
