"""The one YAML loader of the emulator: safe types only, and bounded, so a hostile or careless
file fails at once with one line instead of eating memory (an alias bomb expands to billions of
nodes), the stack (deep nesting) or the launch (a 10 MB job fails with E2BIG deep in exec).

Limits: the file's size, the number of nodes once every alias is expanded (aliases are counted
as copies of what they name, as every consumer that walks the data sees them), and the depth.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

from amlemu.errors import ConfigError

MAX_BYTES = 1024 * 1024  # a job or compute YAML is a few KiB; data belongs in inputs
MAX_NODES = 100_000
MAX_DEPTH = 64


class _Limit(Exception):
    pass


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose composer stops at MAX_DEPTH levels (it recurses per level: the stack stays
    safe) and MAX_NODES nodes (before the node objects themselves grow large)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth, self._composed = 0, 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self._depth, self._composed = self._depth + 1, self._composed + 1
        if self._depth > MAX_DEPTH:
            raise _Limit(f"nests deeper than {MAX_DEPTH} levels")
        if self._composed > MAX_NODES:
            raise _Limit(f"holds more than {MAX_NODES} nodes")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _check_expansion(root: Node) -> None:
    """Count nodes and depth as if every alias were a copy; memoised per node, so an alias bomb
    is measured in time linear in its text, and refused before anything is built from it."""
    memo: dict[int, tuple[int, int]] = {}
    active: set[int] = set()

    def walk(node: Node, depth: int) -> tuple[int, int]:
        if depth > MAX_DEPTH:
            raise _Limit(f"nests deeper than {MAX_DEPTH} levels once its aliases are expanded")
        key = id(node)
        if key in memo:
            return memo[key]
        if key in active:
            raise _Limit("has an alias inside the node it refers to")
        active.add(key)
        if isinstance(node, SequenceNode):
            children = node.value
        elif isinstance(node, MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = []
        size, deepest = 1, 0
        for child in children:
            child_size, child_depth = walk(child, depth + 1)
            size, deepest = size + child_size, max(deepest, child_depth)
            if size > MAX_NODES:
                raise _Limit(f"expands to more than {MAX_NODES} nodes once its aliases are expanded")
        active.discard(key)
        memo[key] = (size, deepest + 1)
        return memo[key]

    walk(root, 1)


def loads(text: str, field: str, what: str = "YAML") -> Any:
    """Parse YAML text within the limits; errors name `field` (a file, `--set x`)."""
    if len(text) > MAX_BYTES:
        raise ConfigError(field, f"{len(text)} characters of {what}, at most {MAX_BYTES} are read",
                          "keep the file small: data belongs in inputs and datastores")
    loader = None
    try:
        loader = _BoundedLoader(text)
        root = loader.get_single_node()
        if root is None:
            return None
        _check_expansion(root)
        return loader.construct_document(root)
    except _Limit as exc:
        raise ConfigError(field, f"refused: the {what} {exc}", "write the data out plainly, without deep "
                          "nesting or aliases that multiply") from None
    except yaml.reader.ReaderError as exc:
        char = exc.character if isinstance(exc.character, int) else ord(str(exc.character)[:1] or "\0")
        raise ConfigError(field, f"not a YAML text file: character #x{char:04x} at position {exc.position} "
                          "is not allowed", f"give a {what} text file (is it a binary file?)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = " ".join(str(getattr(exc, "problem", None) or "invalid YAML").split())
        raise ConfigError(field, f"YAML syntax error{where}: {problem}") from None
    except RecursionError:  # a constructor's own recursion (merge keys); the limits above make it rare
        raise ConfigError(field, f"refused: the {what} nests too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_file(path: Path, field: str = "-f", what: str = "YAML") -> Any:
    """Read and parse a YAML file; a missing, unreadable, oversized or binary file is one error
    naming `field`. Errors from the YAML itself name the file."""
    try:
        if path.is_dir():
            raise ConfigError(field, f"{path} is a folder", f"give the path of a {what} file")
        with open(path, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)  # never more: /dev/zero and 10 GB files alike
    except FileNotFoundError:
        raise ConfigError(field, f"{path} does not exist", f"give the path of a {what} file") from None
    except OSError as exc:
        raise ConfigError(field, f"cannot read {path}: {exc.strerror or exc}", f"give the path of a {what} file") from None
    if len(data) > MAX_BYTES:
        raise ConfigError(field, f"{path} is over {MAX_BYTES // 1024} KiB, too big for a {what} file",
                          "keep the file small: data belongs in inputs and datastores")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(field, f"{path} is not UTF-8 text (byte {exc.start} is not)",
                          f"give a {what} text file (is it a binary file?)") from None
    return loads(text, str(path), what)
