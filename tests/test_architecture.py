"""The package map holds: its arrows (import-linter contracts in pyproject.toml, imports inside
functions included) and modules small enough to read."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 350  # emulator/ (the package); fixtures/, the test double's and plugin's, 400
MAX_FIXTURE_LINES = 400
MAX_FUNCTION_LINES = 60


def test_the_import_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint), "--config", str(REPO / "pyproject.toml")], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_every_module_and_function_is_small_enough_to_read() -> None:
    limits = [(p, MAX_LINES) for p in REPO.glob("emulator/**/*.py")] + \
        [(p, MAX_FIXTURE_LINES) for p in REPO.glob("fixtures/**/*.py")]
    long = {str(p.relative_to(REPO)): n for p, limit in limits if (n := len(p.read_text().splitlines())) > limit}
    assert long == {}, f"split these modules (over {MAX_LINES} lines in emulator/, {MAX_FIXTURE_LINES} in fixtures/): {long}"
    functions = {f"{p.relative_to(REPO)}:{node.name}": node.end_lineno - node.lineno + 1
                 for p in REPO.glob("emulator/**/*.py") for node in ast.walk(ast.parse(p.read_text()))
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES}
    assert functions == {}, f"split these functions (over {MAX_FUNCTION_LINES} lines): {functions}"


def test_nothing_imports_the_folders_by_their_own_names() -> None:
    # emulator/ and fixtures/ install as amlemu and pytest_amlemu; from the repository root the
    # folder names would import too, as a second copy of every module that the wheel lacks.
    wrong = []
    for path in REPO.glob("*/**/*.py"):
        if ".venv" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            wrong += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names
                      if n.split(".")[0] in {"emulator", "fixtures"}]
    assert wrong == []
