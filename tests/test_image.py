"""The image, built with podman from the Dockerfile and run (issue 31).

Skipped, with the reason, where podman and runc (and mmdebstrap, for the stand-in base) are missing or not root;
.ci/containers installs them.  The base is python:3.11-slim where podman's store has it, else a stand-in made of
Debian's packages (tests/containers.py).  The container's port is published on 127.0.0.1 only.

What is checked against the running container: it runs as the non-root service user; it is ready (/readyz 200)
with the kernels loaded from the cache the build made (numba writes nothing new into its cache at start, so the
cache is valid for the service user's paths), msgpack bodies are accepted (the accelerators are installed); learn,
unlearn and predict work; the data volume survives a restart of the container (same model, same prediction,
receipts still verify) and its files are owner-only; one access line per request (uvicorn's own is off); the admin
token and the keys show in neither ``podman inspect`` nor ``podman history``.  The image size and the
start-to-ready time are printed (``-s`` or the summary's captured output).
"""
from __future__ import annotations

import json
import secrets
import time

import httpx
import msgpack
import pytest

from . import containers
from .conftest import free_port
from .helpers import all_receipts, create_model, examples, unit_rows, verify_receipt

# one pytest-xdist worker runs every container test (--dist loadgroup): they share the builds and podman's store
_PROBLEM = containers.problem()
pytestmark = [pytest.mark.xdist_group("containers"), pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))]


def _wait_ready(url: str, name: str, timeout: float = 120) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = httpx.get(url + "/readyz", timeout=2)
            if r.status_code == 200:
                return r
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    logs = containers.podman("logs", name, check=False).stdout
    raise TimeoutError(f"{name} not ready in {timeout} s:\n{logs[-3000:]}")


def _cache_listing(name: str) -> str:
    return containers.podman("exec", name, "sh", "-c",
                             "cd /srv/numba-cache && find . -type f -printf '%p %s %T@\\n' | sort").stdout


@pytest.fixture(scope="module")
def image():
    containers.build_image()
    size = containers.image_size_mb()
    built = containers.TIMINGS.get("podman build")
    print(f"\nimage {containers.IMAGE}: {size:.0f} MB" + (f"; built in {built:.1f} s on {containers.base()}" if built else ""))
    for what, seconds in containers.TIMINGS.items():
        if what not in ("podman build", "build log"):
            print(f"  {what}: {seconds:.1f} s")
    return containers.IMAGE


@pytest.fixture
def service(image):
    """A container of the image with a named data volume; the admin token is a podman secret mounted as a file that
    OLU_SECRETS_DIR names (podman 4.3 shows an env-type secret's value in `podman inspect`).  Yields a dict the test fills in; removes the container, volume and secret."""
    tag = secrets.token_hex(4)
    name, volume, secret = f"olu-test-{tag}", f"olu-test-data-{tag}", f"olu-test-admin-{tag}"
    token = secrets.token_hex(24)
    containers.podman("secret", "create", secret, "-", input=token)
    port = free_port()
    state = {"name": name, "volume": volume, "token": token, "url": f"http://127.0.0.1:{port}",
             "run": ["run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8000", "-v", f"{volume}:/data",
                     "--secret", f"{secret},type=mount,target=OLU_ADMIN_TOKEN", "-e", "OLU_SECRETS_DIR=/run/secrets", image]}
    try:
        yield state
    finally:
        containers.podman("rm", "-f", "-t", "0", name, check=False)
        containers.podman("volume", "rm", "-f", volume, check=False)
        containers.podman("secret", "rm", secret, check=False)


def test_container_serves_as_non_root_warm_and_keeps_its_data(service):
    name, url, token = service["name"], service["url"], service["token"]
    started = time.perf_counter()
    containers.podman(*service["run"])
    ready = _wait_ready(url, name)
    to_ready = time.perf_counter() - started
    print(f"\ncontainer start to /readyz 200: {to_ready:.2f} s; readiness {ready.json()['checks']}")
    # the kernels come from the build's cache: loaded, and nothing recompiled into the cache at start
    assert ready.json()["checks"]["kernels"] == "ok", ready.text
    cache_at_build = containers.podman("run", "--rm", "--entrypoint", "sh", containers.IMAGE, "-c",
                                       "cd /srv/numba-cache && find . -type f -printf '%p %s %T@\\n' | sort").stdout
    assert cache_at_build.strip(), "the image has an empty numba cache"
    assert _cache_listing(name) == cache_at_build, "the service recompiled kernels: the build's cache was not valid"

    # the service user, not root, runs the service
    top = containers.podman("exec", name, "sh", "-c", "id -u; id -un; cat /proc/1/status | grep ^Uid").stdout
    assert top.split()[:2] == ["10001", "olu"] and "\t10001\t10001\t10001\t10001" in top, top

    admin = httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"}, timeout=60)
    key = admin.post("/v1/tenants", json={"name": "image"}).json()["api_key"]
    c = httpx.Client(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=60)
    mid = create_model(c, dim=3)["id"]
    X = unit_rows(40, 3, seed=31)
    r = c.post(f"/v1/models/{mid}/learn", json={"examples": examples(X[:30])})
    assert r.status_code == 200, r.text
    body = msgpack.packb({"ids": [f"mp-{i}" for i in range(10)], "x": X[30:].tolist(), "y": [1.0, 0.0] * 5})
    r = c.post(f"/v1/models/{mid}/learn", content=body, headers={"content-type": "application/msgpack"})
    assert r.status_code == 200, r.text  # 415 without msgpack installed
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-3", "mp-2"]})
    assert r.status_code == 200 and len(r.json()["receipts"]) == 2, r.text  # one per record
    prediction = c.post(f"/v1/models/{mid}/predict", json={"x": X[:5].tolist()})
    assert prediction.status_code == 200, prediction.text
    keys = c.get("/v1/keys").json()["keys"] if c.get("/v1/keys").status_code == 200 else None
    receipts = all_receipts(c, mid)

    # one access line per request: the service's own JSON line, not uvicorn's plain one as well
    logs = containers.podman("logs", name).stdout + containers.podman("logs", name).stderr
    assert '"POST /v1/models' not in logs and "HTTP/1.1\" 200" not in logs, logs[-2000:]

    # restart: the same volume under a new container of the same image
    containers.podman("stop", "-t", "10", name)
    containers.podman("rm", name)
    containers.podman(*service["run"])
    _wait_ready(url, name)
    again = c.post(f"/v1/models/{mid}/predict", json={"x": X[:5].tolist()})
    assert again.status_code == 200 and again.json() == prediction.json(), (again.text, prediction.text)
    assert all_receipts(c, mid) == receipts
    if keys is not None:
        assert all(verify_receipt(rc, keys) for rc in receipts)
    r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-4"]})
    assert r.status_code == 200, r.text

    # the data volume's files are the service user's and owner-only
    listing = containers.podman("exec", name, "find", "/data", "-mindepth", "1", "-printf", "%u %m %p\\n").stdout
    assert listing.strip(), "nothing in the data volume"
    for line in listing.splitlines():
        user, mode, path = line.split(" ", 2)
        assert user == "olu" and int(mode, 8) & 0o077 == 0, line
    data_mode = containers.podman("exec", name, "stat", "-c", "%U %a", "/data").stdout.split()
    assert data_mode == ["olu", "700"], data_mode

    # no secret in the container's or the image's configuration or history
    secret_texts = [token, key]
    files = containers.podman("exec", name, "sh", "-c",
                              "find /data -maxdepth 2 -type f -size -4k -name '*key*' -exec cat {} +").stdout
    secret_texts += [s for s in files.split() if len(s) >= 32]
    shown = (containers.podman("inspect", name).stdout + containers.podman("image", "inspect", containers.IMAGE).stdout
             + containers.podman("history", "--no-trunc", containers.IMAGE).stdout)
    for s in secret_texts:
        assert s not in shown, "a secret shows in podman inspect or history"
    assert "OLU_ADMIN_TOKEN" not in json.dumps(json.loads(containers.podman("inspect", name).stdout)[0]["Config"]["Env"])
    c.close()
    admin.close()


def test_numpy_fallback_says_so_in_readyz(service):
    """Where the kernels are turned off (OLU_NUMBA=0, as where numba cannot be imported) the container still serves,
    on the numpy path, and /readyz says "kernels": "off"."""
    run = list(service["run"])
    run[1:1] = ["-e", "OLU_NUMBA=0"]
    containers.podman(*run)
    ready = _wait_ready(service["url"], service["name"])
    assert ready.json()["checks"]["kernels"] == "off", ready.text
    with httpx.Client(base_url=service["url"], headers={"authorization": f"Bearer {service['token']}"}) as admin:
        key = admin.post("/v1/tenants", json={"name": "numpy"}).json()["api_key"]
    with httpx.Client(base_url=service["url"], headers={"authorization": f"Bearer {key}"}, timeout=60) as c:
        mid = create_model(c, dim=4)["id"]
        assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(30, 4, seed=2))}
                      ).status_code == 200
        assert c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["rec-1"]}).status_code == 200
