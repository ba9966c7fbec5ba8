"""An environment's Docker build context (`build: {path, dockerfile_path}`), built by the engine as
Azure ML builds it into the job's image, where that can happen here without reaching out:

- every image the Dockerfile starts from (FROM, COPY --from=<image>) must be in the engine already
  (no registry is reachable, and nothing is pulled: `pull=False`);
- its RUN steps run with no network (`network_mode="none"`): the Dockerfile is the job's, untrusted;
- an ADD of a URL (fetched by the engine itself, whatever the network mode) is not built.

Otherwise nothing is built and the notice names what is not emulated (nodes run this machine's
software). The image is tagged by the context's content hash (amlemu/build:<hash>), labelled
amlemu=1, and built once.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path

from amlemu.envs.resolve import ResolvedEnvironment
from amlemu.errors import BuildError

REPOSITORY = "amlemu/build"
MAX_CONTEXT_BYTES = 1 << 30  # hashed and sent to the engine: a larger context is not built here
_FROM = re.compile(r"^FROM\s+(?:--platform=\S+\s+)?(?P<image>\S+)(?:\s+AS\s+(?P<stage>\S+))?", re.IGNORECASE)
_COPY_FROM = re.compile(r"^COPY\s+.*--from=(?P<image>\S+)", re.IGNORECASE)
_ADD_URL = re.compile(r"^ADD\s+(?:--\S+\s+)*(?P<url>(?:https?|git|ssh)://\S+|git@\S+)", re.IGNORECASE)


def instructions(text: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments and blank lines left out."""
    joined = re.sub(r"\\\n", " ", "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#")))
    return [ln.strip() for ln in joined.splitlines() if ln.strip()]


def base_images(text: str) -> tuple[list[str], list[str]]:
    """(the images it starts from, what keeps it from being built here)."""
    images: list[str] = []
    stages: set[str] = set()
    problems: list[str] = []
    for line in instructions(text):
        if match := _FROM.match(line):
            if match["image"].lower() not in stages | {"scratch"}:
                images.append(match["image"])
            if match["stage"]:
                stages.add(match["stage"].lower())
        elif (match := _COPY_FROM.match(line)) and match["image"].lower() not in stages and not match["image"].isdigit():
            images.append(match["image"])
        elif match := _ADD_URL.match(line):
            problems.append(f"ADD {match['url']} would be fetched by the engine (no network is reached here)")
    if not images and not problems:
        problems.append("it has no FROM instruction")
    return images, problems


def context_hash(folder: Path, dockerfile: str) -> str:
    digest = hashlib.sha256(dockerfile.encode())
    total = 0
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            path = Path(root) / name
            if path.is_symlink() or not path.is_file():
                digest.update(f"{path.relative_to(folder)}:special".encode())
                continue
            total += path.stat().st_size
            if total > MAX_CONTEXT_BYTES:
                raise BuildError(f"the build context {folder} is over {MAX_CONTEXT_BYTES >> 20} MiB: not built here")
            digest.update(f"{path.relative_to(folder)}:{path.stat().st_mode & 0o111}:".encode())
            with open(path, "rb") as data:
                while chunk := data.read(1 << 20):
                    digest.update(chunk)
    return digest.hexdigest()[:24]


def plan(env: ResolvedEnvironment, has_image: Callable[[str], bool]) -> tuple[Path | None, str | None]:
    """(the Dockerfile to build, None; or None, the notice naming what is not emulated)."""
    folder = Path(env.build_path or "")
    dockerfile = (folder / env.dockerfile).resolve()
    what = f"environment {env.label}: its Docker build context {folder}"
    if not dockerfile.is_file() or not dockerfile.is_relative_to(folder.resolve()):
        return None, f"{what} has no {env.dockerfile} inside it; nodes run this machine's software"
    images, problems = base_images(dockerfile.read_text(errors="replace"))
    absent = [image for image in images if not has_image(image)]
    if absent:
        problems.append(f"no engine here has its base image{'s' if len(absent) > 1 else ''} {', '.join(absent)} "
                        "(nothing is pulled from a registry; the process backend runs no images)")
    if problems:
        return None, (f"{what} is not built here: {'; '.join(problems)}; nodes run this machine's software "
                      f"(docker load / docker build the base image locally to have it built)")
    return dockerfile, None


def context_tag(env: ResolvedEnvironment, dockerfile: Path) -> str:
    """The tag the context's image is (or will be) built under: its content hash."""
    folder = Path(env.build_path or "")
    return f"{REPOSITORY}:{context_hash(folder, str(dockerfile.relative_to(folder.resolve())))}"


def build_context(env: ResolvedEnvironment, dockerfile: Path, cache: Path, log: Callable[[str], None]
                  ) -> tuple[str, bool]:
    """(the image's tag, whether it was already built)."""
    import docker  # noqa: PLC0415 - only where the docker backend runs the job's image

    folder = Path(env.build_path or "")
    tag = context_tag(env, dockerfile)
    key = tag.split(":")[1]
    root = Path(os.environ.get("AMLEMU_ENV_CACHE") or cache / "envs")
    root.mkdir(parents=True, exist_ok=True)
    client = docker.from_env(timeout=600)
    with open(root / f"build-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second job asking for it waits here, then reuses it
        try:
            client.images.get(tag)
            return tag, True
        except docker.errors.ImageNotFound:
            pass
        log(f"environment {env.label}: docker build of {folder} (no network, nothing pulled)")
        try:
            client.images.build(path=str(folder), dockerfile=str(dockerfile.relative_to(folder.resolve())), tag=tag,
                                pull=False, network_mode="none", rm=True, forcerm=True,
                                labels={"amlemu": "1", "amlemu.env": env.label[:200]})
        except (docker.errors.BuildError, docker.errors.APIError) as exc:
            reason = re.sub(r"\s+", " ", str(exc)).strip()[:300]
            raise BuildError(f"environment {env.label}: docker build of {folder} failed: {reason}") from None
        return tag, False
