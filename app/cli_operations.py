"""``olu operations``: follow, cancel and start operations as a client of a running service, and run operations in a
worker process of their own (docs/operations.md "Operations").

Client verbs (``--server``, ``--api-key`` or OLU_API_KEY): ``wait`` (a rich progress bar until the operation ends;
exit 0 succeeded, 1 failed, 2 cancelled, 3 still running at ``--timeout``), ``show``, ``list``, ``cancel``, and
``retrain`` (asks for the retrain as an operation, ``Prefer: respond-async``, then waits unless ``--no-wait``).
``work``: a worker that runs operations from the service's database (as every API replica does, unless
OLU_OPERATION_WORKERS=0 there), until SIGTERM or SIGINT, which give back what it runs.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Optional

import typer

operations_app = typer.Typer(help="Operations: long retrains, bulk unlearns and large learns (202 Accepted).",
                             no_args_is_help=True)
SERVER = typer.Option("http://127.0.0.1:8000", envvar="OLU_SERVER", help="the service")
API_KEY = typer.Option(..., envvar="OLU_API_KEY", help="a tenant API key (write scope to cancel or start)")
EXIT = {"succeeded": 0, "failed": 1, "cancelled": 2}


def _client(server: str, api_key: str):
    import httpx

    return httpx.Client(base_url=server.rstrip("/"), headers={"authorization": f"Bearer {api_key}"}, timeout=30)


def _answer(r) -> dict:
    if r.status_code >= 400:
        try:
            problem = r.json()
            why = f"{problem.get('title')}: {problem.get('detail')}"
        except ValueError:
            why = r.text[:200]
        typer.echo(f"olu: HTTP {r.status_code}: {why}", err=True)
        raise typer.Exit(4)
    return r.json()


def _summary(op: dict) -> str:
    p = op["progress"]
    return f"{op['id']} {op['kind']} of {op['model_id']}: {op['status']} ({p['done']}/{p['total']})"


def follow(client, operation_id: str, interval: float, timeout: float | None, quiet: bool = False) -> dict:
    """Poll the operation until it ends (or ``timeout`` seconds), drawing its progress with rich."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    ends = None if timeout is None else time.monotonic() + timeout
    op = _answer(client.get(f"/v1/operations/{operation_id}"))
    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
                  TimeElapsedColumn(), console=console, disable=quiet, transient=False) as bar:
        task = bar.add_task(f"{op['kind']} {op['status']}", total=max(op["progress"]["total"], 1))
        while True:
            total = max(op["progress"]["total"], 1)
            done = total if op["status"] == "succeeded" else min(op["progress"]["done"], total)
            bar.update(task, total=total, completed=done, description=f"{op['kind']} {op['status']}")
            if op["status"] in EXIT or (ends is not None and time.monotonic() >= ends):
                return op
            time.sleep(interval)
            op = _answer(client.get(f"/v1/operations/{operation_id}"))


def _finish(op: dict) -> None:
    typer.echo(json.dumps(op, indent=2))
    if op["status"] == "failed" and op.get("error"):
        e = op["error"]
        typer.echo(f"olu: the operation failed: {e.get('title')}: {e.get('detail')}", err=True)
    raise typer.Exit(EXIT.get(op["status"], 3))


@operations_app.command()
def wait(operation_id: str, server: str = SERVER, api_key: str = API_KEY,
         interval: float = typer.Option(0.5, min=0.05, help="seconds between two looks"),
         timeout: Optional[float] = typer.Option(None, help="give up after this many seconds (exit 3)"),
         quiet: bool = typer.Option(False, help="no progress bar")):
    """Wait for an operation with a progress bar; print it when it ends (exit 0 succeeded, 1 failed, 2 cancelled,
    3 not ended at --timeout)."""
    with _client(server, api_key) as c:
        _finish(follow(c, operation_id, interval, timeout, quiet))


@operations_app.command()
def show(operation_id: str, server: str = SERVER, api_key: str = API_KEY):
    """Print an operation (JSON)."""
    with _client(server, api_key) as c:
        typer.echo(json.dumps(_answer(c.get(f"/v1/operations/{operation_id}")), indent=2))


@operations_app.command("list")
def list_(server: str = SERVER, api_key: str = API_KEY, model_id: Optional[str] = None,
          status: Optional[str] = None, limit: int = typer.Option(20, min=1, max=200)):
    """The tenant's newest operations, one line each."""
    params = {k: v for k, v in {"model_id": model_id, "status": status, "limit": limit}.items() if v is not None}
    with _client(server, api_key) as c:
        for op in _answer(c.get("/v1/operations", params=params))["items"]:
            typer.echo(_summary(op))


@operations_app.command()
def cancel(operation_id: str, server: str = SERVER, api_key: str = API_KEY):
    """Ask an operation to stop (what it committed stays: see its progress and result)."""
    with _client(server, api_key) as c:
        typer.echo(_summary(_answer(c.post(f"/v1/operations/{operation_id}/cancel"))))


@operations_app.command()
def retrain(model_id: str, server: str = SERVER, api_key: str = API_KEY,
            wait_: bool = typer.Option(True, "--wait/--no-wait", help="wait for it with a progress bar"),
            interval: float = typer.Option(0.5, min=0.05), timeout: Optional[float] = None,
            idempotency_key: Optional[str] = typer.Option(None, help="sent as Idempotency-Key (a retry: the same "
                                                                      "operation)")):
    """Retrain a model as an operation (Prefer: respond-async) and wait for it."""
    headers = {"Prefer": "respond-async", **({"Idempotency-Key": idempotency_key} if idempotency_key else {})}
    with _client(server, api_key) as c:
        op = _answer(c.post(f"/v1/models/{model_id}/retrain", headers=headers))
        typer.echo(f"operation {op['id']}", err=True)
        if not wait_:
            typer.echo(json.dumps(op, indent=2))
            return
        _finish(follow(c, op["id"], interval, timeout))


@operations_app.command()
def work(workers: Optional[int] = typer.Option(None, min=1, help="operations at once (default: "
                                                                  "OLU_OPERATION_WORKERS, at least 1)")):
    """Run operations from the service's database in this process (settings from OLU_*), until SIGTERM/SIGINT."""
    import asyncio
    import signal

    from .config import Settings
    from .observability import configure_logging

    st = Settings()
    st.operation_workers = workers or max(1, st.operation_workers)
    configure_logging(st.log_level)
    runner, db = build_worker(st)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await runner.start()
        typer.echo(f"olu operations work: {runner.owner}, {runner.workers} at once", err=True)
        await stop.wait()
        await runner.stop()

    try:
        asyncio.run(main())
    finally:
        db.dispose()


def build_worker(settings):
    """An OperationRunner on the configured database with the service's keys, and the database."""
    from .api.fairness import FairScheduler, compute_slots
    from .api.operation_turns import turns_of
    from .main import open_storage
    from .receipts.keystore import load_or_create_keyring
    from .registry import ModelRegistry
    from .services.models import ModelService
    from .services.operation_runner import OperationRunner
    from .services.operations import OperationStore
    from .services.receipts import ReceiptIssuer

    db, cipher = open_storage(settings)
    keyring = load_or_create_keyring(settings.data_dir,
                                     settings.signing_key.get_secret_value() if settings.signing_key else None,
                                     settings.signing_key_file)
    models = ModelService(db, ModelRegistry(cipher=cipher), ReceiptIssuer(keyring), settings)
    slots = compute_slots(settings.compute_slots)
    turns = turns_of(FairScheduler(slots) if slots else None)
    return OperationRunner(OperationStore(db, cipher, settings), models.core, settings, turns), db


if __name__ == "__main__":  # pragma: no cover
    sys.exit(operations_app())
