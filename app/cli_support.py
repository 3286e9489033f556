"""What every ``olu`` command shares (issue 40): an error is one line on stderr -- a problem's status, title and
detail, a service that cannot be reached, a setting the command cannot start with -- and a non-zero exit, never a
traceback (``OLU_DEBUG=1`` shows it); and the key files ``olu keygen`` writes."""
from __future__ import annotations

import base64
import os
import secrets
from pathlib import Path

import typer
from typer.core import TyperGroup

from .startup import ConfigurationError


def problem_line(response) -> str:
    """One line from an HTTP answer: "422 Unprocessable Entity: <title>: <detail>" for an RFC 9457 problem."""
    head = f"{response.status_code} {response.reason_phrase}".strip()
    try:
        body = response.json()
    except ValueError:
        text = " ".join(response.text.split())
        return f"{head}: {text[:300]}" if text else head
    if not isinstance(body, dict):
        return head
    title, detail = body.get("title"), body.get("detail")
    parts = [head] + [p for p in (title, detail) if p and p != response.reason_phrase]
    return " ".join(": ".join(parts).split())


def one_line(e: BaseException) -> str:
    """What went wrong, in one line, with what to do where it is known."""
    try:
        import httpx
    except ImportError:  # pragma: no cover - httpx is a base dependency
        httpx = None
    if isinstance(e, ConfigurationError):
        return str(e)
    if httpx is not None:
        if isinstance(e, httpx.HTTPStatusError):
            return problem_line(e.response)
        if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout)):
            try:
                url = str(e.request.url.copy_with(path="/", query=None))
            except RuntimeError:  # an error raised without its request
                url = "the service"
            return (f"cannot reach {url} ({' '.join(str(e).split()) or type(e).__name__}): is the service running? "
                    "Start it with the README's first command, or pass --server")
        if isinstance(e, httpx.TimeoutException):
            return f"the service did not answer in time ({type(e).__name__})"
        if isinstance(e, httpx.HTTPError):
            return f"{type(e).__name__}: {' '.join(str(e).split())}"
    if isinstance(e, OSError) and e.filename:
        return f"{e.filename}: {e.strerror or type(e).__name__}"
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _the_clis_own(e: BaseException) -> bool:
    """typer's and click's own exceptions (exit, abort, usage errors): they print and exit as they do."""
    return isinstance(e, (SystemExit, KeyboardInterrupt)) or type(e).__module__.split(".")[0] in ("typer", "click")


class OneLineErrors(TyperGroup):
    """The ``olu`` group: an exception a command does not handle becomes one line on stderr and exit code 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:  # the reader went away (olu ... | head): nothing more to say, to anyone
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            raise SystemExit(1) from None
        except Exception as e:  # noqa: BLE001 - every other error: one line
            if _the_clis_own(e) or os.environ.get("OLU_DEBUG"):
                raise
            name = ctx.invoked_subcommand or ctx.info_name or "olu"
            typer.echo(f"olu {name}: {one_line(e)}", err=True)
            raise SystemExit(1) from None


def write_secret_file(path: Path, data: bytes) -> None:
    """Write a key file with mode 0600; an existing file is never overwritten."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def new_signing_key() -> tuple[bytes, str, str]:
    """(PKCS#8 PEM, key id, public key base64) of a fresh Ed25519 signing key."""
    from .receipts.keys import SigningKey

    sk = SigningKey.generate()
    return sk._private_pem(), sk.key_id, sk.public_key_b64


def new_encryption_key() -> bytes:
    """Base64 of 32 random bytes: an OLU_ENCRYPTION_KEY."""
    return base64.b64encode(secrets.token_bytes(32)) + b"\n"
