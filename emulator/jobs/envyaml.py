"""Azure ML's environment YAML (`az ml environment create -f env.yml`, and a job's inline
`environment:` mapping) -> a JSON-able definition: name, version, image, the conda file's content
(read now, as Azure ML uploads it at submit), the build context's absolute path."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from amlemu import safeyaml
from amlemu.errors import ConfigError
from amlemu.names import check_asset_name, check_image_reference

FIELDS = {"$schema", "name", "version", "description", "tags", "properties", "image", "conda_file", "build",
          "os_type", "inference_config", "datastore"}
BUILD_FIELDS = {"path", "dockerfile_path"}


def environment_from_dict(data: Any, *, base_dir: Path, where: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(where.rstrip(".") or "environment", "must be a mapping of environment fields")
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise ConfigError(f"{where}{unknown[0]}", "unknown field", f"known fields: {', '.join(sorted(FIELDS))}")
    image, conda, build = data.get("image"), data.get("conda_file"), data.get("build")
    if build is not None and (image or conda):
        raise ConfigError(f"{where}build", "is given with image/conda_file", "give either build or image (+ conda_file)")
    if build is None and not image:
        raise ConfigError(f"{where}image", "missing", "give image (and optionally conda_file), or build.path")
    if image:
        check_image_reference(image, f"{where}image")
    if isinstance(conda, str):
        path = (base_dir / conda).expanduser()
        if not path.is_file():
            raise ConfigError(f"{where}conda_file", f"{path} is not a file", "point it at the conda environment YAML")
        conda = safeyaml.load_file(path, f"{where}conda_file", "conda file")
    if conda is not None and not isinstance(conda, dict):
        raise ConfigError(f"{where}conda_file", "must be a conda environment file (a mapping with dependencies)")
    build_path, dockerfile = None, None
    if build is not None:
        if not isinstance(build, dict) or not build.get("path"):
            raise ConfigError(f"{where}build.path", "missing", "point it at the Docker build context folder")
        unknown = sorted(set(build) - BUILD_FIELDS)
        if unknown:
            raise ConfigError(f"{where}build.{unknown[0]}", "unknown field", "use path and dockerfile_path")
        folder = (base_dir / str(build["path"])).expanduser().resolve()
        if not folder.is_dir():
            raise ConfigError(f"{where}build.path", f"{folder} is not a folder", "point it at the build context")
        build_path = str(folder)
        dockerfile = str(build.get("dockerfile_path") or "Dockerfile")
        if Path(dockerfile).is_absolute() or ".." in Path(dockerfile).parts:
            raise ConfigError(f"{where}build.dockerfile_path", f"{dockerfile!r:.80} is not inside the build context",
                              "give the Dockerfile's path relative to build.path (default: Dockerfile)")
    name, version = data.get("name"), data.get("version")
    # Registered by name (and version) in the workspace: Azure ML's asset rule, before anything is stored.
    name = None if name is None else check_asset_name(name, f"{where}name")
    version = None if version is None else check_asset_name(version, f"{where}version", "version")
    return {"name": name, "version": version,
            "image": None if image is None else str(image), "conda_file": conda, "build_path": build_path,
            **({"dockerfile_path": dockerfile} if dockerfile and dockerfile != "Dockerfile" else {}),
            "description": data.get("description")}


def load_environment(path: str | Path, name: str | None = None, version: str | None = None) -> dict[str, Any]:
    """`amlemu environment create -f env.yml [-n NAME] [--version V]`: the environment to register."""
    path = Path(path)
    data = safeyaml.load_file(path, "-f", "environment YAML")
    if isinstance(data, dict):
        data = {**data, **({"name": name} if name else {}), **({"version": version} if version else {})}
    found = environment_from_dict(data, base_dir=path.parent)
    if not found["name"]:
        raise ConfigError("name", "missing", "give the environment a name (in the YAML or -n)")
    return found
