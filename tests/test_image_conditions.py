"""The image's run-time conditions without the image (issue 23): no Docker daemon here and no registry to pull
python:3.11-slim from, so the conditions the Dockerfile sets up are reproduced around a real service process:

- a non-root user (uid 10001, as ``useradd --system --uid 10001 olu``), with no supplementary groups;
- the sources (``/srv/app``, ``migrations``, ``alembic.ini``) owned by root and read-only to that user, HOME there;
- an empty numba cache (NUMBA_CACHE_DIR) and a data directory, both owned by the user.

The service must become live at once, report the kernels compiling on /readyz (503, so no proxy routes to it
yet), serve a learn and a forget meanwhile (numpy path), and write nothing into the sources.  The interpreter of
this machine lives under /root (mode 0700), so the process runs in a private mount namespace (``unshare -m``) in
which /root is a traversable tmpfs holding only a bind mount of the interpreter; the test skips, with the reason,
where that is not allowed.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

from .conftest import ADMIN_TOKEN, free_port
from .helpers import create_model, unit_rows
from .procs import REPO, assert_kernels_compiling, wait_for_200

UID = 10001
# the interpreter's directories: a virtual environment's (sys.prefix) and the Python it was made from
# (sys.base_prefix; the venv's bin/python is a link to it), which may both sit under /root (mode 0700)
PREFIXES = sorted({Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(),
                   Path(sys.executable).resolve().parent.parent})


def _namespace_problem() -> str | None:
    if os.geteuid() != 0:
        return "needs root to switch to the service user"
    if not shutil.which("unshare") or not shutil.which("setpriv"):
        return "needs unshare and setpriv (util-linux)"
    r = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs none /mnt && echo ok"], capture_output=True,
                       text=True)
    return None if r.stdout.strip() == "ok" else f"no private mount namespace here: {r.stderr.strip()[:200]}"


def _tree(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime for p in root.rglob("*")}


@pytest.mark.skipif(_namespace_problem() is not None, reason=str(_namespace_problem()))
def test_non_root_read_only_sources_empty_cache(tmp_path):
    base = Path(tempfile.mkdtemp(prefix="olu-image-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        srv, cache, data = base / "srv", base / "numba-cache", base / "data"
        srv.mkdir(mode=0o755)
        shutil.copytree(REPO / "app", srv / "app", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(REPO / "migrations", srv / "migrations", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(REPO / "alembic.ini", srv)
        subprocess.run(["chmod", "-R", "go-w,a+rX", str(srv)], check=True)  # root's, read-only to the user
        for d in (cache, data):
            d.mkdir()
            os.chown(d, UID, UID)
        before = _tree(srv)
        port = free_port()
        # each interpreter directory is bind-mounted aside, /root is covered by a traversable tmpfs, and those
        # under /root are mounted back at their own paths
        aside = " && ".join(f"mkdir -p {base}/prefix{i} && mount --bind {p} {base}/prefix{i}"
                            for i, p in enumerate(PREFIXES))
        back = " && ".join(f"mkdir -p {p} && mount --bind {base}/prefix{i} {p}"
                           for i, p in enumerate(PREFIXES) if p.is_relative_to("/root"))
        inner = (f'{aside} && mount -t tmpfs -o mode=755 none /root && {back or "true"} && '
                 f'exec setpriv --reuid {UID} --regid {UID} --clear-groups -- {sys.executable} -m uvicorn app.main:app '
                 f'--app-dir {srv} --host 127.0.0.1 --port {port} --no-proxy-headers')
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(srv), "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONUNBUFFERED": "1", "OLU_DATA_DIR": str(data), "NUMBA_CACHE_DIR": str(cache),
               "OLU_ADMIN_TOKEN": ADMIN_TOKEN}
        log = tmp_path / "service.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(["unshare", "-m", "sh", "-c", inner], cwd="/", env=env, stdout=out,
                                    stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for_200(url + "/healthz", proc, log, timeout=90, poll=0.1)
            assert_kernels_compiling(url)
            admin = httpx.Client(base_url=url, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60)
            key = admin.post("/v1/tenants", json={"name": "image"}).json()["api_key"]
            with httpx.Client(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=60) as c:
                mid = create_model(c, dim=3)["id"]
                X = unit_rows(20, 3, seed=1)
                r = c.post(f"/v1/models/{mid}/learn", json={"examples": [
                    {"id": f"r{i}", "x": x.tolist(), "y": float(i % 2)} for i, x in enumerate(X)]})
                assert r.status_code == 200, r.text
                r = c.post(f"/v1/models/{mid}/unlearn", json={"ids": ["r3"]})
                assert r.status_code == 200 and len(r.json()["receipts"]) == 1, r.text
            admin.close()
            # the process is the service user's, and what it wrote is in its own directories only
            status = Path(f"/proc/{_child_pid(proc.pid)}/status").read_text()
            assert f"Uid:\t{UID}\t{UID}" in status, status
            assert all(p.stat().st_uid == UID for p in data.rglob("*")), "a data file not owned by the user"
            assert oct(data.stat().st_mode & 0o777) == "0o700"
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        assert _tree(srv) == before, "the service wrote into its sources"
        text = log.read_text()
        assert "Permission denied" not in text and "Traceback" not in text, text[-4000:]
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def _child_pid(pid: int) -> int:
    """``sh -c ... exec setpriv ... exec python``: the same pid all along (exec), or its only child."""
    kids = Path(f"/proc/{pid}/task/{pid}/children")
    found = kids.read_text().split() if kids.exists() else []
    return int(found[0]) if found else pid
