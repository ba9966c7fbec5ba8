"""The emulator home: one emulated workspace on disk (AMLEMU_HOME), and where each thing lives in it."""
from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from amlemu.errors import ConfigError

# In a run's launch environment: the launch agent's configuration, <home>/runs/<run id>/agent-config.marshal
# (runs/agent.py reads it; cleanup knows a launch by it, as mpirun's argv does not name the run).
AGENT_CONFIG_VARIABLE = "AMLEMU_AGENT_CONFIG"

_ADJECTIVES = ("amiable", "brave", "calm", "eager", "gentle", "happy", "jolly", "keen", "lively", "nice",
               "polite", "quirky", "sharp", "sincere", "tender", "upbeat", "witty", "zen", "bold", "frank")
_NOUNS = ("apple", "basket", "candle", "cloud", "garden", "kettle", "lamp", "lemon", "needle", "onion",
          "pencil", "pillow", "river", "rocket", "spoon", "tiger", "tomato", "violin", "wagon", "yam")


def default_cache() -> Path:
    """Downloads and builds outside any work tree: the Horovod wheel, MNIST, Azurite."""
    env = os.environ.get("AMLEMU_CACHE")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).expanduser() / "amlemu"


def default_home() -> Path:
    return Path(os.environ.get("AMLEMU_HOME", Path.home() / ".amlemu")).expanduser()


def new_run_id() -> str:
    """Azure ML v2 job names look like `sincere_basket_4x7k2m9q1z`."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    suffix = "".join(secrets.choice(alphabet) for _ in range(10))
    return f"{secrets.choice(_ADJECTIVES)}_{secrets.choice(_NOUNS)}_{suffix}"


@dataclass(frozen=True)
class Home:
    root: Path

    @classmethod
    def at(cls, root: str | Path | None = None) -> Home:
        home = cls(Path(root).expanduser().resolve() if root else default_home().resolve())
        fix = "point --home (or $AMLEMU_HOME) at a folder you can write"
        if home.root.exists() and not home.root.is_dir():
            raise ConfigError("home", f"{home.root} is a file, not a folder", fix)
        try:
            home.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError("home", f"cannot create {home.root}: {exc.strerror or exc}", fix) from None
        if not os.access(home.root, os.R_OK | os.W_OK | os.X_OK):  # /proc/self, a read-only mount
            raise ConfigError("home", f"{home.root} is not a folder this user can write", fix)
        return home

    @property
    def id(self) -> str:
        """Short and stable per home: it prefixes every Docker name, so homes never collide."""
        return hashlib.sha256(str(self.root).encode()).hexdigest()[:8]

    @property
    def db(self) -> Path:
        return self.root / "amlemu.db"

    def run_dir(self, run_id: str) -> Path:
        """The run's record: snapshot, logs, outputs, MLflow store (the workspace's side)."""
        return self.root / "runs" / run_id

    def node_dir(self, cluster: str, node: str) -> Path:
        """A node's local disk; it appears as /mnt/azureml inside the node."""
        return self.root / "nodes" / cluster / node

    def cache_dir(self, cluster: str, node: str) -> Path:
        """A node's blob cache (its tree appears read-only at /mnt/amlemu/cache inside the node)."""
        return self.root / "caches" / cluster / node

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"
