"""Tools the tests run as subprocesses, found beside the interpreter that runs the tests.

``python -m pytest`` run as ``.venv/bin/python -m pytest`` without activating the environment has the
environment's ``bin/`` off ``PATH``; the console scripts installed with the test extra (openapi-python-client,
``olu``, ruff) are there all the same, beside ``sys.executable``.  ``tool`` looks there first and then on
``PATH``; ``tool_env`` puts that directory first on ``PATH`` for tools that run others by bare name (the SDK
generator runs ruff on what it writes).
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def scripts_dir() -> Path:
    """The interpreter's own scripts directory (not resolved: a virtual environment's python is a symlink to the
    base interpreter, whose bin/ does not hold the environment's scripts)."""
    return Path(sys.executable).parent


def tool(name: str) -> str | None:
    """The executable ``name`` beside ``sys.executable``, else on ``PATH``; None when neither has it."""
    for candidate in (name, name + ".exe") if os.name == "nt" else (name,):
        p = scripts_dir() / candidate
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return shutil.which(name)


def tool_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) with the interpreter's scripts directory first on PATH."""
    env = dict(os.environ if env is None else env)
    env["PATH"] = os.pathsep.join([str(scripts_dir()), *[p for p in env.get("PATH", "").split(os.pathsep) if p]])
    return env
