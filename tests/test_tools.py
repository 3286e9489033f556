"""Issue 21 item 7: tools the tests run are found beside sys.executable, so ``<env>/bin/python -m pytest`` passes
without the environment on PATH."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .tools import scripts_dir, tool, tool_env


def _exe(path: Path) -> Path:
    path.write_text("#!/bin/sh\necho hello\n")
    path.chmod(0o755)
    return path


def test_tool_prefers_the_interpreters_directory_then_path(tmp_path, monkeypatch):
    env_bin, on_path = tmp_path / "env" / "bin", tmp_path / "path"
    env_bin.mkdir(parents=True)
    on_path.mkdir()
    monkeypatch.setattr(sys, "executable", str(env_bin / "python"))
    monkeypatch.setenv("PATH", str(on_path))
    _exe(env_bin / "only-beside")
    _exe(env_bin / "both")
    _exe(on_path / "both")
    _exe(on_path / "only-on-path")
    (env_bin / "not-executable").write_text("x")
    assert scripts_dir() == env_bin
    assert tool("only-beside") == str(env_bin / "only-beside")  # not on PATH: found anyway
    assert tool("both") == str(env_bin / "both")  # the environment's own copy wins
    assert tool("only-on-path") == str(on_path / "only-on-path")  # the fallback
    assert tool("not-executable") is None and tool("nowhere") is None
    path = tool_env({"PATH": str(on_path)})["PATH"].split(os.pathsep)
    assert path == [str(env_bin), str(on_path)]


def test_a_symlinked_interpreter_is_not_resolved(tmp_path, monkeypatch):
    """A venv's bin/python links to the base interpreter; the scripts live beside the link, not the target."""
    base, venv = tmp_path / "base" / "bin", tmp_path / "venv" / "bin"
    base.mkdir(parents=True)
    venv.mkdir(parents=True)
    _exe(base / "python")
    (venv / "python").symlink_to(base / "python")
    _exe(venv / "the-tool")
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    monkeypatch.setenv("PATH", "")
    assert tool("the-tool") == str(venv / "the-tool")


def test_the_test_tools_run_without_the_environment_on_path():
    """The tools the suite needs, with PATH holding only the system directories (no activated environment)."""
    env = tool_env({"PATH": "/usr/bin:/bin"})
    for name in ("openapi-python-client", "olu"):
        exe = tool(name)
        assert exe is not None, f"{name} is part of the test extra / the package (looked in {scripts_dir()})"
        out = subprocess.run([exe, "--help"], check=False, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
