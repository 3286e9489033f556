"""What a user installs is what is measured and what the image runs (issue 31), checked on the files themselves (the
image itself is built and run by tests/test_image.py where podman is available):

- numba and msgpack are base dependencies, so the README's ``pip install -e .`` and the image install the
  accelerators that docs/performance.md measured (the ``fast`` extra stays, as an alias);
- requirements.lock pins every dependency of the image (the base ones and the stream extra's), each exactly once,
  and the Dockerfile installs from it, then the project without dependencies;
- the Dockerfile's base is a build argument whose default is the official Python image; its command turns
  uvicorn's plain access log off, as the README's does.
"""
from __future__ import annotations

import re
import tomllib

from .procs import REPO


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_the_accelerators_are_in_the_default_install():
    base = {_name(r) for r in _project()["dependencies"]}
    assert {"numba", "msgpack"} <= base
    assert {_name(r) for r in _project()["optional-dependencies"]["fast"]} <= base  # the old extra: an alias


def test_the_lock_pins_every_dependency_of_the_image():
    lines = [line.strip() for line in (REPO / "requirements.lock").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    pins = {}
    for line in lines:
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)", line)
        assert m, f"not an exact pin: {line!r}"
        name = m.group(1).lower().replace("_", "-")
        assert name not in pins, f"{name} pinned twice"
        pins[name] = m.group(2)
    wanted = {_name(r) for r in _project()["dependencies"] + _project()["optional-dependencies"]["stream"]}
    assert wanted <= set(pins), f"not in requirements.lock: {sorted(wanted - set(pins))} (bash .ci/lock)"
    assert "olu-service" not in pins


def test_the_dockerfile_installs_from_the_lock_on_a_configurable_base():
    docker = (REPO / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE=python:3\.11-slim$", docker, re.M) and re.search(r"^FROM \$\{BASE\}$", docker, re.M)
    runs = docker.split("\nRUN ")[1:]
    lock = next(i for i, r in enumerate(runs) if "-r requirements.lock" in r)
    project = next(i for i, r in enumerate(runs) if "--no-deps" in r)
    assert lock < project and "olu warm" in runs[project]
    assert "[stream]" not in docker.split("CMD [")[0].split("#")[0]  # the extras come from the lock
    cmd = docker[docker.rindex("\nCMD ["):]
    assert '"--no-access-log"' in cmd and '"--no-proxy-headers"' in cmd


def test_secrets_come_from_files_in_olu_secrets_dir(tmp_path, monkeypatch):
    """A container's secrets mounted as files (/run/secrets/NAME) instead of environment variables, which
    `podman inspect` and `docker inspect` show: OLU_SECRETS_DIR names the directory; the environment wins."""
    from app.config import Settings

    token = "t" * 40
    (tmp_path / "olu_admin_token").write_text(token + "\n")
    (tmp_path / "OLU_ENCRYPTION_KEY").write_text("k" * 44)
    monkeypatch.delenv("OLU_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("OLU_ENCRYPTION_KEY", raising=False)
    monkeypatch.setenv("OLU_SECRETS_DIR", str(tmp_path))
    s = Settings()
    assert s.admin_token.get_secret_value() == token and s.encryption_key.get_secret_value() == "k" * 44
    monkeypatch.setenv("OLU_ADMIN_TOKEN", "e" * 40)
    assert Settings().admin_token.get_secret_value() == "e" * 40
    monkeypatch.delenv("OLU_SECRETS_DIR")
    monkeypatch.delenv("OLU_ADMIN_TOKEN")
    assert Settings().admin_token is None
