"""`-o/--output` and `--query`, as az does them (knack's output.py): one place that turns a
command's data into text. Used by cli/common.py only; the command modules reach it through there.

- json: indented JSON; jsonc: the same, colored when stdout is a terminal (plain otherwise).
- yaml / yamlc: YAML (block style), colored likewise.
- tsv: values only, tab-separated, a row per item of a list (a mapping is one row): a mapping's
  values in key order (sorted, or as a --query's multiselect lists them), a nested mapping as an
  empty field, a nested list as its length, true/false lower-case at the top level; no header.
- table: the command's own human form; after a --query (or for a command without one), az's
  generic table: a column per scalar field, nested values left out.
- none: nothing.

--query is a JMESPath expression (the `jmespath` library) applied to the data before it is
formatted; one that does not parse is a usage error (exit 2), as az's is.

Names come from users and from jobs: what a terminal would act on rather than show (C0 and C1
controls, DEL, the bidirectional overrides such as U+202E) is printed as an escape (\x1b, \u202e)
in every format, never raw.
"""
from __future__ import annotations

import json
import os
import sys
from io import StringIO
from typing import TYPE_CHECKING, Any

import jmespath
from jmespath.exceptions import JMESPathError

from amlemu.errors import ConfigError
from amlemu.names import UNSAFE, UNSAFE_IN_JSON, UNSAFE_KEEPING_LINES, escaped  # noqa: F401 - re-exported

if TYPE_CHECKING:
    import re

FORMATS = ("json", "jsonc", "yaml", "yamlc", "table", "tsv", "none")
TABLE_SKIP_KEYS = ("id", "type", "etag")  # az's generic table leaves these out


def printable(data: Any, pattern: re.Pattern[str] = UNSAFE) -> Any:
    """Every string in `data` (keys too) escaped; anything else, and clean strings, left as they are."""
    if isinstance(data, str):
        return escaped(data, pattern) if pattern.search(data) else data
    if isinstance(data, dict):
        return {printable(k, pattern): printable(v, pattern) for k, v in data.items()}
    if isinstance(data, list):
        return [printable(v, pattern) for v in data]
    return data


def compile_query(text: str) -> Any:
    """The compiled expression; ValueError (one line) when it does not parse."""
    try:
        return jmespath.compile(text)
    except JMESPathError as exc:
        raise ValueError(" ".join(str(exc).split())) from None
    except RecursionError:  # jmespath's parser recurses once per nesting level
        raise ValueError("the expression nests too deeply; write a flatter one") from None


def plain(data: Any) -> Any:
    """JSON's own types only (paths, enums and the like as text): what every format prints."""
    return json.loads(json.dumps(data, default=str))


def apply_query(query: Any, data: Any) -> Any:
    try:
        return query.search(data)
    except JMESPathError as exc:
        raise ConfigError("--query", " ".join(str(exc).split()), "see https://jmespath.org for the syntax") from None
    except RecursionError:  # jmespath walks the expression recursively: a deeply nested one
        raise ConfigError("--query", "nests too deeply to evaluate", "write a flatter expression") from None


def colored() -> bool:
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ


def render(data: Any, fmt: str, queried: bool = False) -> str:
    """The text `-o <fmt>` prints for data (JSON types only)."""
    if fmt == "none":
        return ""
    if fmt in ("json", "jsonc"):
        text = UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m[0]):04x}", json.dumps(data, indent=2, ensure_ascii=False)) + "\n"
        return _highlight(text, "json") if fmt == "jsonc" and colored() else text
    data = printable(data)
    if fmt in ("yaml", "yamlc"):
        import yaml  # noqa: PLC0415

        text = yaml.safe_dump(data, default_flow_style=False, allow_unicode=True, sort_keys=False)
        return _highlight(text, "yaml") if fmt == "yamlc" and colored() else text
    if fmt == "tsv":
        return tsv(data, sort_keys=not queried)
    if fmt == "table":
        return table(data, sort_keys=not queried)
    raise ValueError(f"unknown output format {fmt}")


def _highlight(text: str, language: str) -> str:
    from pygments import highlight  # noqa: PLC0415 - rich's own dependency
    from pygments.formatters import TerminalFormatter  # noqa: PLC0415
    from pygments.lexers import JsonLexer, YamlLexer  # noqa: PLC0415

    return highlight(text, JsonLexer() if language == "json" else YamlLexer(), TerminalFormatter())


# --- tsv -------------------------------------------------------------------------------------------
def _tsv_field(value: Any) -> str:
    if isinstance(value, list):
        return str(len(value))
    if isinstance(value, dict):
        return ""  # keeps the columns in line where other rows hold a value here
    return value if isinstance(value, str) else str(value)


def tsv(data: Any, sort_keys: bool = True) -> str:
    out = StringIO()
    for row in data if isinstance(data, list) else [data]:
        if isinstance(row, dict):
            values = [v for _, v in sorted(row.items())] if sort_keys else list(row.values())
            out.write("\t".join(_tsv_field(v) for v in values))
        elif isinstance(row, list):
            out.write("\t".join(_tsv_field(v) for v in row))
        elif isinstance(row, bool):
            out.write(str(row).lower())
        else:
            out.write(_tsv_field(row))
        out.write("\n")
    return out.getvalue()


# --- az's generic table ----------------------------------------------------------------------------
def _table_row(item: Any, sort_keys: bool) -> dict[str, Any]:
    if isinstance(item, dict):
        keys = sorted(item) if sort_keys else list(item)
        return {k[:1].upper() + k[1:]: item[k] for k in keys
                if k not in TABLE_SKIP_KEYS and item[k] is not None and not isinstance(item[k], (list, dict))}
    if isinstance(item, list):
        return {f"Column{i + 1}": value for i, value in enumerate(item)}
    return {"Result": item}


def table(data: Any, sort_keys: bool = True) -> str:
    rows = [_table_row(item, sort_keys) for item in (data if isinstance(data, list) else [data])]
    if not rows:
        return ""
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    if not columns:
        raise ConfigError("-o table", "this data has no plain fields to show as a table",
                          "pick fields with --query (e.g. --query '[].{name:name}'), or use -o json")
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _cell(value: Any) -> str:
    return "" if value is None else str(value)
