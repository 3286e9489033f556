"""A newcomer's first day (issue 40 items 2 and 6): start-ups that explain themselves, `olu keygen`, and an `olu` whose
every error is one line.

* a missing, unreadable or invalid signing key file, an invalid encryption key, a database URL the service cannot
  use, an invalid setting: the service (uvicorn, as the README starts it) ends with one line naming the setting and
  the fix, exit code 1, no traceback, nothing created; `olu keygen` makes the key it asks for, and the same start
  then serves;
* `olu demo --algorithm X` exits 0 for every family (a short stream), choosing a loss and spec the family serves;
* `olu` errors (no service, a refused token, a problem) are one line with the problem's title and detail, exit 1.
"""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import app as cli
from app.unlearning import ALGORITHMS

from .conftest import ADMIN_TOKEN, free_port

ROOT = Path(__file__).resolve().parents[1]


def _start(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """uvicorn app.main:app as the README starts it, with these OLU_ variables; it must end by itself."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("OLU_")}
    full.update({"OLU_DATA_DIR": str(tmp_path / "data"), "OLU_ADMIN_TOKEN": ADMIN_TOKEN, "PYTHONPATH": str(ROOT),
                 **env})
    cmd = [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port", str(free_port())]
    try:
        return subprocess.run(cmd, env=full, cwd=ROOT, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the service started (or kept restarting) with {env}")


def _one_line_refusal(out: subprocess.CompletedProcess, *needles: str) -> str:
    assert out.returncode == 1, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = [line for line in out.stderr.splitlines() if line.startswith("olu: refusing to start:")]
    assert len(lines) == 1, out.stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def test_a_missing_signing_key_file_is_one_line_and_olu_keygen_makes_it(tmp_path):
    key = tmp_path / "secrets" / "olu-signing.pem"
    line = _one_line_refusal(_start(tmp_path, OLU_SIGNING_KEY_FILE=str(key)), "OLU_SIGNING_KEY_FILE",
                             "no such file", f"olu keygen {key}")
    assert not (tmp_path / "data" / "olu.db").exists()  # refused before anything was created or migrated
    key.parent.mkdir()
    r = CliRunner().invoke(cli, ["keygen", str(key)])
    assert r.exit_code == 0 and "OLU_SIGNING_KEY_FILE" in r.output, r.output
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    from app.receipts.keys import SigningKey

    sk = SigningKey.from_text(key.read_bytes())
    assert sk.key_id in r.output
    again = CliRunner().invoke(cli, ["keygen", str(key)])  # never overwritten
    assert again.exit_code == 1 and "never overwritten" in again.output
    assert SigningKey.from_text(key.read_bytes()).key_id == sk.key_id
    # with the key, the same start gets past the keys (it then serves: stopped by the timeout, which is the point)
    from app.config import Settings
    from app.startup import load_keyring

    assert load_keyring(Settings(data_dir=tmp_path / "data", signing_key_file=key)).key_id == sk.key_id
    assert "Traceback" not in line


def _refusal(monkeypatch, tmp_path: Path, **env: str) -> str:
    """The one line create_app refuses these OLU_ variables with (in process: what uvicorn prints, as above)."""
    from app.main import create_app
    from app.startup import ConfigurationError, load_settings

    for k in [k for k in os.environ if k.startswith("OLU_")]:
        monkeypatch.delenv(k)
    for k, v in {"OLU_DATA_DIR": str(tmp_path / "data"), **env}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigurationError) as e:
        create_app(load_settings())
    line = str(e.value)
    assert "\n" not in line
    return line


@pytest.mark.parametrize("env,needles", [
    ({"OLU_SIGNING_KEY_FILE": "{tmp}/k.pem", "_key": "not a key at all"},
     ("OLU_SIGNING_KEY_FILE", "neither PEM nor base64", "olu keygen")),
    ({"OLU_SIGNING_KEY_FILE": "{tmp}/k.pem", "_key": ""}, ("OLU_SIGNING_KEY_FILE", "empty", "olu keygen")),
    ({"OLU_SIGNING_KEY_FILE": "{tmp}"}, ("OLU_SIGNING_KEY_FILE", "directory")),
    ({"OLU_SIGNING_KEY": "nope"}, ("OLU_SIGNING_KEY", "olu keygen")),
    ({"OLU_ENCRYPTION_KEY": "short"}, ("OLU_ENCRYPTION_KEY", "base64 of 32 bytes", "olu keygen --encryption")),
    ({"OLU_ENCRYPTION_KEYS_OLD": "c2hvcnQ="}, ("OLU_ENCRYPTION_KEYS_OLD",)),
    ({"OLU_DATABASE_URL": "postgres-ish://x"}, ("OLU_DATABASE_URL", "postgresql+psycopg://")),
    ({"OLU_DATABASE_URL": "not a url"}, ("OLU_DATABASE_URL",)),
    ({"OLU_DATABASE_URL": "postgresql+psycopg://olu:hunter2@127.0.0.1:1/olu"},
     ("OLU_DATABASE_URL", "cannot be reached", "***", "OLU_AUTO_MIGRATE=false")),
    ({"OLU_MAX_BATCH": "many"}, ("OLU_MAX_BATCH", "integer")),
    ({"OLU_LOG_LEVEL": "LOUD"}, ("OLU_LOG_LEVEL",)),
    ({"OLU_SQLITE_SYNCHRONOUS": "FULL; DROP TABLE models"}, ("OLU_SQLITE_SYNCHRONOUS",)),
])
def test_settings_the_service_cannot_use_are_one_line(monkeypatch, tmp_path, env, needles):
    env = {k: v.replace("{tmp}", str(tmp_path)) for k, v in env.items()}
    if "_key" in env:
        Path(env["OLU_SIGNING_KEY_FILE"]).write_text(env.pop("_key"))
    line = _refusal(monkeypatch, tmp_path, **env)
    for needle in needles:
        assert needle in line, (needle, line)
    assert "hunter2" not in line  # a database password is never printed


def test_an_invalid_setting_ends_the_process_in_one_line(tmp_path):
    _one_line_refusal(_start(tmp_path, OLU_ENCRYPTION_KEY="short"), "OLU_ENCRYPTION_KEY")


def test_olu_keygen_encryption_key_is_accepted(tmp_path):
    r = CliRunner().invoke(cli, ["keygen", "--encryption"])
    assert r.exit_code == 0, r.output
    from app.crypto import parse_key

    assert len(parse_key(r.stdout.strip().splitlines()[0])) == 32


# ---- olu: one line per error -------------------------------------------------------------------------------------
def _cli_one_line(args: list[str], *needles: str) -> str:
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 1, (r.exit_code, r.output)
    assert "Traceback" not in r.output and r.exception is None or isinstance(r.exception, SystemExit), r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1, r.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def test_olu_errors_are_one_line_without_a_traceback(server):
    _cli_one_line(["demo", "--server", f"http://127.0.0.1:{free_port()}", "--admin-token", "x"],
                  "olu demo:", "cannot reach", "is the service running")
    _cli_one_line(["demo", "--server", server.url, "--admin-token", "not-the-admin-token-not-the-admin-token"],
                  "olu demo:", "401")
    _cli_one_line(["verify", str(ROOT / "no-such-bundle.json"), "--keys", str(ROOT / "no-such-keys.json")],
                  "olu verify:", "no-such-bundle.json")


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_olu_demo_works_for_every_family(server, algorithm):
    r = CliRunner().invoke(cli, ["demo", "--server", server.url, "--admin-token", ADMIN_TOKEN, "--algorithm", algorithm,
                                 "--records", "60", "--forget", "3"])
    assert r.exit_code == 0, r.output[-3000:]
    assert f"({algorithm}, loss " in r.output and "held-out accuracy" in r.output
    assert "offline verification of 3 receipts: ok" in r.output, r.output[-2000:]


def test_olu_help_is_wrapped_never_cut_off(monkeypatch):
    """`olu consume --help` was cut at 80 columns ("OLU_STREAM_API_…"): click's help wraps every line instead."""
    monkeypatch.setenv("COLUMNS", "80")
    r = CliRunner().invoke(cli, ["consume", "--help"])
    assert r.exit_code == 0, r.output
    assert "…" not in r.output and all(len(line) <= 120 for line in r.output.splitlines())
    for text in ("OLU_STREAM_API_KEY", "nats://127.0.0.1:4222", "{prefix}.{tenant}.{model}.results", "--metrics-port"):
        assert text in r.output, text


def test_olu_serve_refuses_before_any_worker_starts(monkeypatch, tmp_path):
    """uvicorn's parent exits 0 after its workers refuse; olu serve checks once, before them: one line, exit 1."""
    import uvicorn

    started = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: started.append(kw))
    monkeypatch.setenv("OLU_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("OLU_SIGNING_KEY_FILE", str(tmp_path / "missing.pem"))
    line = _cli_one_line(["serve", "--workers", "4"], "olu serve:", "OLU_SIGNING_KEY_FILE", "olu keygen")
    assert started == [] and "Traceback" not in line


def test_an_invalid_encryption_key_file_in_the_data_directory_is_one_line(monkeypatch, tmp_path):
    (tmp_path / "data").mkdir(mode=0o700)
    (tmp_path / "data" / "encryption.key").write_text("not base64 of 32 bytes\n")
    line = _refusal(monkeypatch, tmp_path)
    assert "encryption key file" in line and "OLU_ENCRYPTION_KEY" in line and "backup" in line, line
