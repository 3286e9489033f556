"""Podman for the image and compose tests (issue 31): the problem that makes them skip, the stand-in base image, the
wheels the image installs offline, and the image build.

Where no registry of base images can be reached (CI here), ``python:3.11-slim`` is replaced by a stand-in made of
Debian's packages (containers/python-base.sh, built once and kept in podman's store: ``podman image exists``), and
the image's dependencies are installed from wheels that this machine's pip fetches beforehand (pip inside a
container has neither its certificate bundle nor its configuration): ``--build-arg PIP_OPTIONS=--no-index
--find-links /wheels`` with the wheel folder mounted read-only for the build.  A file lock serialises builds between
pytest workers; podman's layer cache makes a second build of unchanged sources take seconds.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from .procs import REPO

CONF = REPO / "containers" / "containers.conf"
OFFICIAL_BASE = "docker.io/library/python:3.11-slim"
STANDIN_BASE = "localhost/olu-standin-python:3.11"
IMAGE = os.environ.get("OLU_TEST_IMAGE", "localhost/olu:test")  # OLU_TEST_IMAGE: test an image built beforehand
WORK = Path(os.environ.get("OLU_CONTAINER_WORK", "/var/tmp/olu-containers"))
TIMINGS: dict[str, float] = {}  # what the builds took this run (seconds), printed by the tests


def env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONF)}


def podman(*args: str, check: bool = True, timeout: float = 120, input: str | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run(["podman", *args], env=env(), capture_output=True, text=True, timeout=timeout, input=input)
    if check and r.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args[:3])} ... failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return r


def _runs() -> str | None:
    try:
        r = podman("run", "--rm", "--network", "none", STANDIN_BASE if image_exists(STANDIN_BASE) else IMAGE,
                   "true", check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"podman cannot run a container here: {e}"
    return None if r.returncode == 0 else f"podman cannot run a container here: {r.stderr.strip()[-300:]}"


def problem() -> str | None:
    """Why the container tests cannot run here (None: they can).  .ci/containers installs what is missing."""
    if sys.platform != "linux":
        return "container tests need Linux"
    if os.geteuid() != 0:
        return "container tests need root (rootful podman with runc)"
    missing = [t for t in ("podman", "runc") if not shutil.which(t)]
    if missing:
        return f"container tests need {' and '.join(missing)} (apt-get install podman runc mmdebstrap; .ci/containers)"
    if not image_exists(OFFICIAL_BASE) and not image_exists(STANDIN_BASE) and not shutil.which("mmdebstrap"):
        return "no python:3.11-slim image and no mmdebstrap to build its stand-in (apt-get install mmdebstrap)"
    if image_exists(STANDIN_BASE) or image_exists(IMAGE):
        return _runs()
    return None


def image_exists(name: str) -> bool:
    try:
        return podman("image", "exists", name, check=False, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@contextmanager
def _locked(name: str):
    WORK.mkdir(parents=True, exist_ok=True)
    with open(WORK / f"{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def base() -> str:
    """The base image: the official one where it is in podman's store, else the stand-in, built when missing."""
    if image_exists(OFFICIAL_BASE):
        return OFFICIAL_BASE
    with _locked("base"):
        if not image_exists(STANDIN_BASE):
            started = time.perf_counter()
            r = subprocess.run(["bash", str(REPO / "containers" / "python-base.sh"), STANDIN_BASE], env=env(),
                               capture_output=True, text=True, timeout=1200)
            if r.returncode != 0:
                raise RuntimeError(f"python-base.sh failed: {(r.stdout + r.stderr)[-3000:]}")
            TIMINGS["base image (mmdebstrap + import)"] = time.perf_counter() - started
    return STANDIN_BASE


def wheels() -> Path:
    """Wheels of everything requirements.lock pins (plus the build backend), fetched by this machine's pip into a
    folder named by the lock's hash, so a changed lock fetches anew."""
    lock = (REPO / "requirements.lock").read_bytes()
    folder = WORK / f"wheels-{hashlib.sha256(lock).hexdigest()[:16]}"
    with _locked("wheels"):
        if not (folder / ".complete").exists():
            started = time.perf_counter()
            shutil.rmtree(folder, ignore_errors=True)
            r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(folder), "-r",
                                str(REPO / "requirements.lock"), "setuptools>=68", "wheel"],
                               capture_output=True, text=True, timeout=1200)
            if r.returncode != 0:
                raise RuntimeError(f"pip wheel failed: {(r.stdout + r.stderr)[-3000:]}")
            (folder / ".complete").touch()
            TIMINGS["wheels (pip wheel of the lock)"] = time.perf_counter() - started
    return folder


def build_image(tag: str = IMAGE) -> str:
    """``podman build`` of the Dockerfile on ``base()``, installing offline from ``wheels()``; with OLU_TEST_IMAGE
    set, that image as it is (no build)."""
    if os.environ.get("OLU_TEST_IMAGE"):
        return tag
    base_image, folder = base(), wheels()
    with _locked("image"):
        started = time.perf_counter()
        r = subprocess.run(["podman", "build", "--pull=never", "--format", "docker", "--build-arg", f"BASE={base_image}",
                            "--build-arg", "PIP_OPTIONS=--no-index --find-links /wheels",
                            "-v", f"{folder}:/wheels:ro", "-t", tag, str(REPO)],
                           env=env(), capture_output=True, text=True, timeout=1200)
        if r.returncode != 0:
            raise RuntimeError(f"podman build failed: {(r.stdout + r.stderr)[-4000:]}")
        TIMINGS["podman build"] = time.perf_counter() - started
        TIMINGS["build log"] = r.stdout  # type: ignore[assignment]
    return tag


def image_size_mb(tag: str = IMAGE) -> float:
    return json.loads(podman("image", "inspect", tag).stdout)[0]["Size"] / 1e6
