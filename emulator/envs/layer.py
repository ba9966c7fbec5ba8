"""Where the Docker engine has the job's image: that image with the environment's packages as a
layer on top, made by `docker build` (FROM the image, COPY of the packages installed for the
environment's Python, PYTHONPATH naming them), tagged by content hash and built once. The image's
own OS, CUDA and Python are then the job's, as on Azure ML; the packages are the declared ones."""
from __future__ import annotations

import fcntl
import hashlib
import os
import re
import tempfile
from pathlib import Path

from amlemu.envs.build import PackageSource, find_python, install
from amlemu.envs.resolve import ResolvedEnvironment
from amlemu.errors import BuildError

REPOSITORY = "amlemu/env"
SITE = "/opt/amlemu/site-packages"  # where the layer puts the packages in the image

IMAGE_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*")  # registry/name:tag@digest, nothing else


def layer_tag(env: ResolvedEnvironment, source: PackageSource, base_id: str) -> str:
    return f"{REPOSITORY}:{hashlib.sha256(f'{base_id}/{env.key(source.key())}'.encode()).hexdigest()[:24]}"


def planned_tag(env: ResolvedEnvironment, source: PackageSource) -> str:
    """The layered image's tag, without building it (the engine has the job's image)."""
    import docker  # noqa: PLC0415 - only where the docker backend runs the job's image

    return layer_tag(env, source, docker.from_env(timeout=600).images.get(env.image).id)


def build_layer(env: ResolvedEnvironment, cache: Path, source: PackageSource, log: Path | None = None
                ) -> tuple[str, bool]:
    """(the layered image's tag, whether it was already built)."""
    if not IMAGE_REF.fullmatch(env.image or ""):  # the job's text must not add a line to the Dockerfile
        raise BuildError(f"environment {env.label}: image {env.image!r} is not an image reference")
    import docker  # noqa: PLC0415 - only where the docker backend runs the job's image

    client = docker.from_env(timeout=600)
    base = client.images.get(env.image)
    tag = layer_tag(env, source, base.id)
    root = Path(os.environ.get("AMLEMU_ENV_CACHE") or cache / "envs")
    root.mkdir(parents=True, exist_ok=True)
    key = tag.split(":")[1]
    with open(root / f"image-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            client.images.get(tag)
            return tag, True
        except docker.errors.ImageNotFound:
            pass
        log = log or root / f"image-{key}.log"
        log.write_text("")
        with tempfile.TemporaryDirectory(dir=root, prefix="layer-") as tmp:
            context = Path(tmp)
            (context / "site-packages").mkdir()
            python = find_python(env.python, log)
            install(env, context / "site-packages", context / "bin", ["--target", str(context / "site-packages"),
                                                                      "--python", python], log, source)
            (context / "Dockerfile").write_text(
                f"FROM {env.image}\nCOPY site-packages {SITE}\nENV PYTHONPATH={SITE}\n")
            try:
                client.images.build(path=str(context), tag=tag, rm=True, forcerm=True,
                                    labels={"amlemu": "1", "amlemu.env": env.label[:200]})
            except docker.errors.BuildError as exc:
                raise BuildError(f"environment {env.label}: docker build of its layer on {env.image} failed: "
                                 f"{str(exc).splitlines()[0]}") from None
        return tag, False
