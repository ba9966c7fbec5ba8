"""The README and docs/ cannot go stale silently: every repository path, `amlemu` command and
option, `amlemu.` module (and attribute), `AMLEMU_` variable and `make` target they name exists."""
from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import click
import pytest
from conftest import REPO

from amlemu.cli import cli

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TOP = ("emulator", "fixtures", "trainer", "tests", "compose", "bench", "scripts", "examples", "docs", ".ci")
SOURCES = [p for top in TOP if top != "docs" for p in (REPO / top).rglob("*") if p.is_file()] + \
    [REPO / "Makefile", REPO / "pyproject.toml"]


def _spans(text: str) -> list[str]:
    """Inline code spans and the lines of fenced code blocks."""
    blocks = re.findall(r"(?ms)^```\w*\n(.*?)^```", text)
    inline = re.findall(r"(?<!`)`([^`\n]+)`(?!`)", re.sub(r"(?ms)^```.*?^```", "", text))
    return inline + [line for block in blocks for line in block.splitlines()]


def _all_spans() -> list[tuple[str, str]]:
    return [(page.name, span) for page in PAGES for span in _spans(page.read_text())]


def test_the_docs_exist_and_the_readme_is_a_front_door() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200, "README.md is the front door: move details to docs/"
    linked = set(re.findall(r"\]\((docs/[\w-]+\.md)\)", readme))
    assert linked == {f"docs/{p.name}" for p in PAGES[1:]}, "README's table of pages lists docs/ exactly"


def test_every_repository_path_named_exists() -> None:
    pattern = re.compile(rf"(?<![\w./<-])((?:{'|'.join(re.escape(t) for t in TOP)})/[\w./*-]*[\w*/])")
    missing = []
    for page, span in _all_spans():
        for path in pattern.findall(span):
            path = path.rstrip("/.")
            found = list(REPO.glob(path)) if "*" in path else [REPO / path] if (REPO / path).exists() else []
            if not found:
                missing.append(f"{page}: {path}")
    assert missing == []


def test_every_python_file_named_exists_somewhere() -> None:
    names = {p.name for p in SOURCES}
    missing = [f"{page}: {span}" for page, span in _all_spans()
               if re.fullmatch(r"[\w]+\.py", span) and span not in names]
    assert missing == []


# Named by the docs as examples of what a contributor would add, not as what exists.
EXAMPLES = {"amlemu.backends.swarm"}


def _resolve(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(target, attr):
                return False
            target = getattr(target, attr)
        return True
    return False


def test_every_amlemu_module_and_attribute_named_exists() -> None:
    names = {name for _, span in _all_spans() for name in re.findall(r"(?<![\w.])amlemu(?:\.[A-Za-z_]\w*)+", span)}
    assert names, "the docs name modules"
    assert sorted(n for n in names if not _resolve(n) and n not in EXAMPLES) == []


def _check_command(words: list[str]) -> list[str]:
    """What of `amlemu <words>` does not exist: a group's verb or an option."""
    command: click.Command = cli
    chain = [cli]
    problems = []
    takes_value = False
    for word in words:
        if word in ("|", "#", ";", "&&", ">", "2>&1", "...") or word.startswith(("#", "$(", "`")):
            break
        if takes_value:  # the value of the option before it
            takes_value = False
        elif word.startswith("-") and len(word) > 1:
            option = word.split("=", 1)[0]
            if option == "--help":  # click's own, on every command
                continue
            params = [p for c in chain for p in c.params if option in p.opts or option in p.secondary_opts]
            if not params:
                problems.append(f"{' '.join(c.name or 'amlemu' for c in chain)}: no option {option}")
            takes_value = "=" not in word and any(isinstance(p, click.Option) and not p.is_flag and not p.count
                                                  for p in params)
        elif isinstance(command, click.Group) and not word.startswith("<"):
            unknown = [v for v in word.split("|") if v not in command.commands]
            if unknown:
                problems.append(f"{command.name}: no command {'|'.join(unknown)}")
                break
            command = command.commands[word.split("|")[0]]
            chain.append(command)
    return problems


def test_every_amlemu_command_and_option_named_exists() -> None:
    problems, seen = [], 0
    for page, span in _all_spans():
        for found in re.finditer(r"(?:^|\s|\()amlemu((?: [^\s`|#;)]+| \|[\w|]+)*)", span):
            try:
                words = shlex.split(found.group(1), comments=True)
            except ValueError:
                words = found.group(1).split()
            if words:
                seen += 1
                problems += [f"{page}: `amlemu {' '.join(words)}`: {p}" for p in _check_command(words)]
    assert seen > 30 and problems == []


def test_every_variable_and_make_target_named_exists() -> None:
    text = "\n".join(p.read_text(errors="replace") for p in SOURCES)
    docs = "\n".join(p.read_text() for p in PAGES)
    variables = set(re.findall(r"\bAMLEMU_[A-Z0-9_]*[A-Z0-9]\b", docs))
    assert sorted(v for v in variables if v not in text) == []
    targets = set(re.findall(r"(?m)^([\w-]+):", (REPO / "Makefile").read_text()))
    named = set(re.findall(r"`make ([\w-]+)", docs)) | set(re.findall(r"(?m)^make ([\w-]+)", docs))
    assert named and sorted(named - targets) == []


@pytest.mark.parametrize("words,problem", [
    (["job", "create", "-f", "x.yml", "--stream"], None),
    (["job", "show|stream|cancel"], None),
    (["job", "launch"], "no command launch"),
    (["job", "create", "--no-such-flag"], "no option --no-such-flag"),
    (["--home", "/x", "compute", "list"], None),
])
def test_the_command_checker_finds_what_is_missing(words: list[str], problem: str | None) -> None:
    found = _check_command(words)
    assert (found == []) if problem is None else any(problem in p for p in found)
