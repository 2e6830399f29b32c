"""The image's dependency closure and ``deploy/constraints.txt``.

The closure is what ``pip install ".[EXTRAS]"`` in ``deploy/Dockerfile`` resolves to: scalemb's requirements
(read from ``pyproject.toml``, the source the image is built from) with the Dockerfile's extras, then, transitively,
each requirement's own ``Requires-Dist`` from the installed distribution's metadata (``importlib.metadata``), with
environment markers evaluated for the image's interpreter (the Python of its ``FROM python:X.Y-slim`` line, Linux,
CPython) and extras followed (``foo[bar]`` adds foo's requirements marked ``extra == "bar"``).

    python deploy/constraints.py          # rewrite deploy/constraints.txt: the closure at the installed versions

``tests/test_deploy.py`` checks that the file pins exactly this closure and that every pin satisfies every
specifier that requires it.
"""
from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
CONSTRAINTS = ROOT / "deploy" / "constraints.txt"
HEADER = """\
# Exact versions the image installs, deploy/Dockerfile's
#     pip install ".[{extras}]" -c constraints.txt
# the closure of those requirements on Python {python}, derived from the installed distributions' metadata by
# `python deploy/constraints.py`, which wrote this file.  Regenerate after a dependency change.
"""


def image_extras(dockerfile: Path = DOCKERFILE) -> list[str]:
    """The extras of the Dockerfile's ``pip install ".[a,b]"`` line."""
    (extras,) = re.findall(r'pip install "\.\[([^\]]+)\]"', dockerfile.read_text())
    return [extra.strip() for extra in extras.split(",")]


def image_python(dockerfile: Path = DOCKERFILE) -> str:
    """``X.Y`` of the Dockerfile's ``FROM python:X.Y-slim``."""
    (version,) = re.findall(r"^FROM python:(\d+\.\d+)-slim", dockerfile.read_text(), re.M)
    return version


def image_environment(python: str) -> dict[str, str]:
    """Marker environment of the image: this machine's, with the image's Python on Linux/CPython."""
    env = default_environment()
    env.update(python_version=python, python_full_version=python + ".0", sys_platform="linux",
               platform_system="Linux", os_name="posix", implementation_name="cpython",
               platform_python_implementation="CPython")
    return env


def _applies(requirement: Requirement, env: dict, extras: set[str]) -> bool:
    """Whether ``requirement`` is installed in ``env`` when its requirer was asked for ``extras``."""
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate(dict(env, extra=extra)) for extra in (extras or {""}))


def project_requirements(pyproject: Path, extras: list[str]) -> list[Requirement]:
    """scalemb's own requirements with ``extras``, from ``pyproject.toml``; an unknown extra is an error."""
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = sorted(set(extras) - set(optional))
    if unknown:
        raise ValueError(f"{pyproject}: no optional-dependencies {unknown} (the Dockerfile installs them)")
    return [Requirement(r) for r in project["dependencies"]] + [Requirement(r) for e in extras for r in optional[e]]


def closure(requirements: list[Requirement], env: dict, project: str = "scalemb"
            ) -> tuple[dict[str, str], dict[str, list[tuple[str, Requirement]]]]:
    """``(versions, required_by)``: every distribution reached from ``requirements`` (canonical name ->
    installed version) and, for each, the ``(requirer, requirement)`` pairs that pulled it in.  A distribution
    that is not installed raises ``PackageNotFoundError`` naming it and who requires it."""
    versions: dict[str, str] = {}
    required_by: dict[str, list[tuple[str, Requirement]]] = {}
    seen_extras: dict[str, set[str]] = {}
    todo = [(project, r, set()) for r in requirements]
    while todo:
        requirer, requirement, requirer_extras = todo.pop()
        if not _applies(requirement, env, requirer_extras):
            continue
        name = canonicalize_name(requirement.name)
        if name == canonicalize_name(project):  # a self-reference (scalemb[x] inside an extra)
            todo += [(project, r, set()) for r in project_requirements(ROOT / "pyproject.toml",
                                                                        sorted(requirement.extras))]
            continue
        required_by.setdefault(name, []).append((requirer, requirement))
        extras = {canonicalize_name(e) for e in requirement.extras}
        if name in versions and extras <= seen_extras[name]:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise metadata.PackageNotFoundError(
                f"{name} (required by {requirer}: {requirement}) is not installed, so its own requirements are "
                f"unknown: pip install -e '.[test]'") from None
        versions[name] = dist.version
        new_extras = extras - seen_extras.get(name, set())
        first = name not in seen_extras
        seen_extras.setdefault(name, set()).update(extras)
        for text in dist.requires or []:
            child = Requirement(text)
            # its base requirements once; those of an extra (marked extra == "...") when the extra is first asked for
            if _applies(child, env, set()):
                if first:
                    todo.append((name, child, set()))
            elif new_extras:
                todo.append((name, child, new_extras))
    return versions, required_by


def image_closure() -> tuple[dict[str, str], dict[str, list[tuple[str, Requirement]]]]:
    """The closure of what ``deploy/Dockerfile`` installs (see the module docstring)."""
    env = image_environment(image_python())
    return closure(project_requirements(ROOT / "pyproject.toml", image_extras()), env)


def read_constraints(path: Path = CONSTRAINTS) -> dict[str, str]:
    """``{name: version}`` of a ``name==version`` file; anything else on a line is an error naming the line."""
    pins = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([\w.+!-]+)", line.strip())
        if not match:
            raise ValueError(f"{path}:{number}: not name==version: {line!r}")
        pins[canonicalize_name(match[1])] = match[2]
    return pins


def main() -> int:
    versions, _ = image_closure()
    text = HEADER.format(extras=",".join(image_extras()), python=image_python())
    text += "".join(f"{name}=={versions[name]}\n" for name in sorted(versions))
    tmp = CONSTRAINTS.with_suffix(".txt.tmp")
    tmp.write_text(text)
    tmp.replace(CONSTRAINTS)
    print(f"{CONSTRAINTS}: {len(versions)} pins", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
