"""amlemu as a user installs it: the wheel needs no training stack (torch, torchvision, horovod and
mpi4py are the `trainer` extra), carries its package data, and in a fresh environment gives the CLI,
the pytest plugin's option and the public API without importing torch."""
from __future__ import annotations

import email
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TRAINING_STACK = {"torch", "torchvision", "horovod", "mpi4py"}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from the files git tracks, copied out: what a fresh clone has, and no build/ folder shared
    with another build of the work tree (setuptools builds in the source tree)."""
    out, src = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("source")
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], check=True, capture_output=True).stdout
    for rel in filter(None, tracked.decode().split("\0")):
        if (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(src)], check=True, capture_output=True, timeout=300)
    [built] = out.glob("amlemu-*.whl")
    return built


def _name(requirement: str) -> str:
    return re.split(r"[\s;\[<>=!~]", requirement, maxsplit=1)[0].lower()


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        [name] = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(zf.read(name))


def test_the_core_install_needs_no_training_stack(wheel: Path) -> None:
    requires = _metadata(wheel).get_all("Requires-Dist") or []
    core = {_name(r) for r in requires if "extra ==" not in r}
    assert core and core.isdisjoint(TRAINING_STACK), sorted(core & TRAINING_STACK)
    trainer = {_name(r) for r in requires if 'extra == "trainer"' in r}
    assert trainer == TRAINING_STACK
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert "amlemu/backends/sandbox.sh" in names  # package data: the process node's sandbox
    # Only the project's own import names: `emulator` and `fixtures` are other distributions'.
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"amlemu", "pytest_amlemu"}
    # Every package folder is in the wheel (pyproject lists them: a new one must be added there).
    folders = {"/".join(("amlemu", *p.parent.relative_to(REPO / "emulator").parts, "__init__.py"))
               for p in (REPO / "emulator").rglob("__init__.py")}
    assert folders <= set(names), sorted(folders - set(names))


def test_a_fresh_environment_gets_the_cli_the_plugin_and_the_api_without_torch(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    python = env_dir / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    # The dependencies (not amlemu itself: the test environment's editable install is not seen,
    # a path added by a .pth file is not scanned for .pth files) come from this environment.
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "AMLEMU_HOME": str(tmp_path / "home")}

    def run(*argv: str) -> str:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    assert run(str(env_dir / "bin" / "amlemu"), "--version").strip().endswith(_metadata(wheel)["Version"])
    assert "compute" in run(str(env_dir / "bin" / "amlemu"), "--help")
    assert "--aml-backend" in run(str(python), "-m", "pytest", "--help", "-p", "no:cacheprovider")
    probe = ("import sys, amlemu, amlemu.api, amlemu.specs, pytest_amlemu.plugin\n"
             "assert amlemu.__file__.startswith(sys.prefix), amlemu.__file__\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'horovod', 'mpi4py', 'torchvision'}))")
    assert run(str(python), "-c", probe).strip() == "[]"
