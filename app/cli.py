"""``olu``: serve, migrate, administer tenants and keys, verify receipts offline, and a guided demo."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from .cli_evaluate import evaluate_command
from .cli_support import OneLineErrors

# every error a command does not handle is one line and exit code 1 (cli_support.OneLineErrors; OLU_DEBUG=1: the
# traceback); help is wrapped at the terminal's width, at least 100 columns
app = typer.Typer(help="Certified unlearning service.", no_args_is_help=True, add_completion=False, cls=OneLineErrors,
                  pretty_exceptions_enable=False, rich_markup_mode=None,
                  context_settings={"max_content_width": 120})  # click's help: wrapped, never cut off at 80 columns
tenant_app = typer.Typer(help="Tenants (direct database access).", no_args_is_help=True)
key_app = typer.Typer(help="Tenant API keys (direct database access).", no_args_is_help=True)
signing_app = typer.Typer(help="The receipt-signing key ring in the data directory.", no_args_is_help=True)
app.add_typer(tenant_app, name="tenant")
app.add_typer(key_app, name="key")
app.add_typer(signing_app, name="signing-key")
from .cli_operations import operations_app  # noqa: E402 - the operations verbs (app/cli_operations.py)

app.add_typer(operations_app, name="operations")


def _settings():
    from .startup import load_settings

    return load_settings()


def _database():
    """The configured database, migrated to head (a setting it cannot use: one line, cli_support)."""
    from sqlalchemy.exc import DBAPIError

    from .db.migrate import upgrade_to_head
    from .startup import database_unreachable, open_database, prepare_data_dir

    s = _settings()
    prepare_data_dir(s)
    db = open_database(s)
    try:
        upgrade_to_head(db.engine, _cipher(s))
    except DBAPIError as e:
        db.dispose()
        raise database_unreachable(s, e) from None
    db.scrub_wal()
    return db


def _cipher(st):
    from .startup import load_cipher

    return load_cipher(st)


def _tenants():
    """TenantService on the configured database, sealing record keys with the configured encryption key."""
    from .services.tenants import TenantService

    return TenantService(_database(), _cipher(_settings()))


@app.command()
def serve(host: str = "127.0.0.1", port: int = 8000, workers: int = 1,
          log_level: str = typer.Option("warning", help="uvicorn's own log level")):
    """Serve app.main:app with uvicorn (settings from OLU_* environment variables).  uvicorn's own proxy-header
    handling is off: the service takes the client address from the socket, and a forwarded header only from the
    proxies in OLU_TRUSTED_PROXIES."""
    import uvicorn

    from .main import create_app
    from .unlearning import kernels_status

    # the settings, the database, the keys: checked here once, so that a setting the service cannot start with is
    # one line and exit code 1 before any worker starts (uvicorn would start each worker into the same refusal)
    preflight = create_app()
    if workers > 1:  # each worker builds its own (app.main:app); one worker serves this one
        preflight.state.ctx.db.dispose()
    if kernels_status() == "compiling":
        typer.echo("olu serve: the numba kernels are not in numba's cache yet: each worker compiles them in the "
                   "background (about 30 s to a few minutes) and serves on the numpy path meanwhile (/readyz says "
                   "kernels: compiling); `olu warm` builds the cache once.", err=True)
    if workers > 1 and _settings().resolved_database_url.startswith("sqlite"):
        typer.echo(f"olu serve: warning: {workers} workers on SQLite. SQLite takes one writer at a time, so more "
                   "workers add no ingest and lengthen the learn tail (python -m bench --sections scale: learn p99 "
                   "3.1x one worker's at 2 workers, ingest 0.94x; docs/performance.md). Serve SQLite with one "
                   "worker, or use PostgreSQL (OLU_DATABASE_URL) for several workers or replicas.", err=True)
    uvicorn.run(preflight if workers == 1 else "app.main:app", host=host, port=port, workers=workers,
                log_level=log_level, proxy_headers=False)


@app.command()
def consume(
    api_key: str = typer.Option(..., envvar="OLU_STREAM_API_KEY",
                                help="a tenant API key: names the tenant; authorises events that carry no key of "
                                     "their own (needs the 'write' scope for that)"),
    nats_url: str = typer.Option("nats://127.0.0.1:4222", envvar="OLU_NATS_URL"),
    stream: str = typer.Option("OLU_EVENTS", envvar="OLU_STREAM", help="the JetStream stream of the events"),
    durable: Optional[str] = typer.Option(None, help="durable consumer name shared by the worker processes "
                                                     "(default olu-<tenant id>)"),
    create_stream: bool = typer.Option(False, help="create the stream (subjects <prefix>.<tenant>.*.events) if "
                                                   "missing"),
    subject_prefix: str = typer.Option("olu", help="events are read from <prefix>.<tenant>.<model>.events"),
    results_subject: str = typer.Option("{prefix}.{tenant}.{model}.results",
                                        help="where results and receipts go when an event names no reply_to"),
    dead_letter_subject: str = typer.Option("{prefix}.{tenant}.dead", help="where refused events go"),
    batch: int = typer.Option(100, min=1, help="messages per fetch (in flight per process)"),
    max_ack_pending: int = typer.Option(1000, min=1, help="unacknowledged messages of the durable consumer, all "
                                                          "processes together (backpressure)"),
    ack_wait: float = typer.Option(30.0, help="seconds before an unacknowledged message is redelivered"),
    metrics_port: Optional[int] = typer.Option(None, help="serve Prometheus metrics on 127.0.0.1:PORT/metrics"),
):
    """Apply learn / unlearn events of a tenant's models from NATS JetStream exactly once, publishing each
    forget's signed receipts (and learn acknowledgements) back; refused events go to the dead-letter subject
    (docs/streaming.md). SIGTERM: finish the batch in hand, ack, stop."""
    import asyncio
    import logging
    import signal

    # A SIGTERM during start-up (imports, the database, the broker connection: seconds on a cold machine) is a
    # request to stop too, not a kill: remembered here and honoured once the loop runs (exit 0, nothing in hand).
    stop_requested: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stop_requested.append(signum))

    from .observability import configure_logging
    from .streaming.consumer import ConsumerConfig, build

    st = _settings()
    configure_logging(st.log_level)
    cfg = ConsumerConfig(nats_url=nats_url, stream=stream, durable=durable, subject_prefix=subject_prefix,
                         batch=batch, max_ack_pending=max_ack_pending, ack_wait=ack_wait,
                         create_stream=create_stream, results_subject=results_subject,
                         dead_letter_subject=dead_letter_subject, metrics_port=metrics_port)

    async def main_loop() -> None:
        consumer, db = build(st, api_key, cfg)
        try:
            await consumer.connect()
            consumer.install_signal_handlers()
            if stop_requested:  # asked to stop before the loop's own handlers were in place
                consumer.stop()
            logging.getLogger("olu.stream").info(
                "consuming %s from stream %s as %s", cfg.filter_subject(consumer.tenant_id), stream, consumer.durable)
            typer.echo(f"consuming {cfg.filter_subject(consumer.tenant_id)} from {stream} ({consumer.durable})",
                       err=True)
            await consumer.run()
            totals = consumer.metrics.totals() if hasattr(consumer, "metrics") else {}
            done = ", ".join(f"{n} {what}" for what, n in totals.items()) or "nothing in hand"
            typer.echo(f"olu consume: stopped: {done}; every event in hand was applied, published and acked", err=True)
        finally:
            db.dispose()

    try:
        asyncio.run(main_loop())
    except RuntimeError as e:
        typer.echo(f"olu consume: {e}", err=True)
        raise typer.Exit(3)


@app.command()
def warm():
    """Build numba's cache of the compiled kernels now (NUMBA_CACHE_DIR, or __pycache__ beside the sources), so a
    service started afterwards loads them in about a second.  Without it the first start compiles them in the
    background (a minute or more on one core) while requests take the numpy path.  The image runs it at build
    time."""
    import os
    import time

    from .unlearning import kernels_status, warm_kernels

    started = time.perf_counter()
    warm_kernels(background=False)
    status = kernels_status()
    where = os.environ.get("NUMBA_CACHE_DIR") or "__pycache__ beside the sources"
    typer.echo(f"kernels: {status} in {time.perf_counter() - started:.1f} s (cache: {where})")
    if status not in ("ok", "off"):
        raise typer.Exit(1)


@app.command()
def keygen(path: Optional[Path] = typer.Argument(None, help="write the key to this file (mode 0600; an existing "
                                                           "file is never overwritten); without it, print it"),
           encryption: bool = typer.Option(False, "--encryption",
                                           help="an at-rest encryption key (base64 of 32 random bytes, for "
                                                "OLU_ENCRYPTION_KEY) instead of a receipt-signing key")):
    """Make a key: a receipt-signing key (Ed25519, PKCS#8 PEM, for OLU_SIGNING_KEY_FILE or OLU_SIGNING_KEY), or with
    --encryption an at-rest encryption key.  Without PATH the key goes to stdout (for a secret store) and what it is
    to stderr."""
    from .cli_support import new_encryption_key, new_signing_key, write_secret_file

    if encryption:
        data, what, use = new_encryption_key(), "AES-256-GCM encryption key", "OLU_ENCRYPTION_KEY"
    else:
        data, key_id, public = new_signing_key()
        what, use = f"Ed25519 signing key {key_id} (public key {public})", "OLU_SIGNING_KEY_FILE"
    if path is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        typer.echo(f"{what}: give it to the service as {use.replace('_FILE', '')} (keep it secret)", err=True)
        return
    try:
        write_secret_file(path, data)
    except FileExistsError:
        typer.echo(f"olu keygen: {path} exists: it is never overwritten (a key the service used may still be "
                   "needed to verify or open what it signed or sealed); choose another path", err=True)
        raise typer.Exit(1)
    typer.echo(f"wrote the {what} to {path} (mode 0600); set {use}={path}" if not encryption else
               f"wrote the {what} to {path} (mode 0600); set OLU_ENCRYPTION_KEY to its content, or mount it as the "
               "secret OLU_ENCRYPTION_KEY (OLU_SECRETS_DIR)")


@app.command()
def migrate():
    """Upgrade the database schema to the latest Alembic revision."""
    db = _database()
    from .db.migrate import migration_status

    typer.echo(f"schema: {migration_status(db.engine)} ({db.url.split('@')[-1]})")


@tenant_app.command("create")
def tenant_create(name: str):
    """Create a tenant; prints its id and its first API key (shown once)."""
    out = _tenants().create_tenant(name)
    typer.echo(json.dumps(out, indent=2))


@key_app.command("create")
def key_create(tenant_id: str, scope: list[str] = typer.Option(..., "--scope", help="write, predict or audit"),
               label: Optional[str] = None):
    """Create an API key with the given scopes (repeat --scope); prints it once."""
    from .services.tenants import ALL_SCOPES

    bad = [s for s in scope if s not in ALL_SCOPES]
    if bad:
        raise typer.BadParameter(f"unknown scope(s) {bad}; choose from {list(ALL_SCOPES)}")
    typer.echo(json.dumps(_tenants().create_key(tenant_id, scope, label), indent=2))


@key_app.command("revoke")
def key_revoke(tenant_id: str, key_id: str):
    """Revoke an API key at once."""
    _tenants().revoke_key(tenant_id, key_id)
    typer.echo(f"revoked {key_id}")


@signing_app.command("rotate")
def signing_rotate(grace_seconds: int = typer.Option(300, help="how long the old key keeps signing validly")):
    """Make a new active signing key; the old one is retired but keeps verifying what it signed."""
    from .receipts.keystore import rotate_key

    ring = rotate_key(_settings().data_dir, grace_seconds=grace_seconds)
    typer.echo(f"active key: {ring.key_id}; restart the service processes within {grace_seconds} s")


@app.command()
def verify(bundle: Path = typer.Argument(..., help="an export bundle, or a single receipt, as JSON"),
           keys: Optional[Path] = typer.Option(None, help="public keys (GET /v1/keys answer) as JSON"),
           server: Optional[str] = typer.Option(None, help="fetch the public keys from this service instead")):
    """Verify receipts offline: signature, canonical form, inclusion, checkpoint, consistency; for erasure receipts
    of deleted models also their exact terms and, in a model's bundle, the erased records' count and hash."""
    from .receipts.verify import _strict_loads, verify_bundle

    data = _strict_loads(bundle.read_bytes())
    if isinstance(data, dict) and not {"receipts", "erasures", "consistency"} & set(data):
        data = {"receipts": [data]}  # a single receipt (certificate or erasure) as served by GET /v1/receipts/{id}
    if keys is not None:
        trusted = _strict_loads(keys.read_bytes())
    elif server is not None:
        import httpx

        trusted = httpx.get(server.rstrip("/") + "/v1/keys", timeout=10).json()
    elif isinstance(data, dict) and "public_keys" in data:
        typer.echo("warning: trusting the public keys inside the bundle; pass --keys for independent trust", err=True)
        trusted = data["public_keys"]
    else:
        raise typer.BadParameter("give --keys or --server (the keys to trust)")
    report = verify_bundle(data, trusted)
    for check in report.checks:
        typer.echo(f"{'ok  ' if check.ok else 'FAIL'} {check.check}: {check.detail}")
    typer.echo("verified" if report.ok else "NOT verified")
    raise typer.Exit(0 if report.ok else 1)


# The family the demo uses: the recommendation of docs/accuracy.md for its situation (the service keeps the
# examples, and the records are forgotten after the stream): the exact retrain is the only family measured within
# 2 points of retraining from scratch there at epsilon = 1 (every noisy family loses 10-50 points on a stream of
# this size); the decision table of docs/families.md gives the other situations.
DEMO_ALGORITHM = "retrain"


def demo_features(X, n_train: int):
    """The demo's client-side preprocessing: every column centred and scaled by the *training* split's mean and
    standard deviation (fixed before the stream), then every row scaled onto the unit sphere, so that each row
    meets the declared bound ||x|| <= 1 with its full length.  (Dividing by the largest row norm instead, as the
    demo did before issue 16, shrank a typical row to ~0.2 of the bound: 0.842 held-out accuracy before any
    forget, against 0.947 this way.)"""
    import numpy as np

    m, s = X[:n_train].mean(0), X[:n_train].std(0)
    Z = (X - m) / np.where(s > 0, s, 1.0)
    return Z / np.maximum(np.linalg.norm(Z, axis=1, keepdims=True), 1e-12)


@app.command()
def demo(server: str = typer.Option("http://127.0.0.1:8000", help="a running service"),
         admin_token: str = typer.Option(..., envvar="OLU_ADMIN_TOKEN", help="the service's admin token"),
         forget: int = typer.Option(20, help="how many records to forget"),
         records: Optional[int] = typer.Option(None, min=40, help="use only this many records of the 569 (a quicker "
                                                                  "run; 80 % are streamed, 20 % held out)"),
         algorithm: str = typer.Option(DEMO_ALGORITHM, help="model family (default: the recommendation of "
                                                             "docs/accuracy.md for this situation)")):
    """Stream scikit-learn's bundled breast-cancer data into a new model, forget some records, and show held-out
    accuracy before and after beside an exact retrain on the remaining records, the receipts (verified) and the
    ledger."""
    import httpx
    import numpy as np
    from rich.progress import track

    try:
        from sklearn.datasets import load_breast_cancer
    except ImportError:  # pragma: no cover - scikit-learn is an optional extra
        typer.echo("the demo needs scikit-learn: pip install scikit-learn", err=True)
        raise typer.Exit(2)
    from .receipts.verify import verify_bundle

    X, y = load_breast_cancer(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    X, y = X[order][:records], y[order][:records]
    n_train = int(0.8 * len(y))
    X = demo_features(X, n_train)
    gone = np.random.default_rng(1).permutation(n_train)[:forget]  # the records to forget: random, fixed seed
    with httpx.Client(base_url=server, timeout=60) as c:
        families = {a["name"]: a for a in c.get("/v1/algorithms").raise_for_status().json()["items"]}
        if algorithm not in families:
            raise typer.BadParameter(f"unknown family {algorithm!r}; choose from {', '.join(sorted(families))}",
                                     param_hint="--algorithm")
        r = c.post("/v1/tenants", json={"name": "demo"}, headers={"authorization": f"Bearer {admin_token}"})
        r.raise_for_status()
        c.headers["authorization"] = f"Bearer {r.json()['api_key']}"
        base = {"dim": X.shape[1], "bounds": {"x_norm": 1.0}, "domain_radius": 10.0, "l2": 0.01,
                "privacy": {"epsilon": 1.0, "delta": 1e-6}}
        # knobs a family may require, from the stream itself (online_dp_tree, passive_olu_restart): its length and
        # the number of records the demo forgets
        stream_knobs = {"horizon": n_train, "max_deletions": max(forget, 1)}

        def create(name: str, family: str) -> str:
            losses = families[family]["losses"]
            # a binary classifier: logistic where the family serves it, else its own loss with two classes (exact_ridge:
            # least-squares classification)
            spec = {**base, "loss": "logistic"} if "logistic" in losses else {
                **base, "loss": families[family]["default_loss"], "n_classes": 2}
            hp: dict = {}
            for _ in range(len(stream_knobs) + 1):
                out = c.post("/v1/models", json={"name": name, "algorithm": family, **spec, "hyperparameters": hp})
                missing = [e.get("field", "").removeprefix("hyperparameters.") for e in
                           (out.json().get("errors") or [])] if out.status_code == 422 else []
                if not any(m in stream_knobs and m not in hp for m in missing):
                    break
                hp.update({m: stream_knobs[m] for m in missing if m in stream_knobs})
            out.raise_for_status()
            return out.json()["id"]

        def learn(mid: str, rows, label: str) -> None:
            rows = list(rows)
            for start in track(range(0, len(rows), 50), description=label):
                batch = [{"id": f"patient-{i}", "x": X[i].tolist(), "y": int(y[i])} for i in rows[start:start + 50]]
                c.post(f"/v1/models/{mid}/learn", json={"examples": batch}).raise_for_status()

        def accuracy(mid: str) -> float:
            pred = c.post(f"/v1/models/{mid}/predict", json={"x": X[n_train:].tolist()}).json()["predictions"]
            return float(np.mean(np.asarray(pred) == y[n_train:]))

        def unlearn(mid: str, i: int) -> list:
            out = c.post(f"/v1/models/{mid}/unlearn", json={"ids": [f"patient-{i}"]})
            if out.status_code == 422 and out.json().get("type", "").endswith("/deletion-features-required"):
                # a model that keeps no data but needs the forgotten record's features: the client resends it
                out = c.post(f"/v1/models/{mid}/unlearn", json={"ids": [f"patient-{i}"], "examples": [
                    {"id": f"patient-{i}", "x": X[i].tolist(), "y": int(y[i])}]})
            if out.status_code == 409 and out.json().get("retrain"):
                # the model can certify no further forget until it is retrained (rewind_to_delete beyond m_max): do
                # what the answer says, then forget
                c.post(out.json()["retrain"]).raise_for_status()
                retrains.append(i)
                return unlearn(mid, i)
            out.raise_for_status()
            return out.json()["receipts"]

        mid = create("breast-cancer", algorithm)
        model = c.get(f"/v1/models/{mid}").json()
        typer.echo(f"model {mid} ({algorithm}, loss {model['loss']}); guarantee: {model['guarantee']['definition']}")
        learn(mid, range(n_train), "learning")
        before = accuracy(mid)
        receipts: list = []
        retrains: list = []
        for i in track(gone, description="forgetting"):
            receipts += unlearn(mid, int(i))
        after = accuracy(mid)
        # the reference: a fresh exact model learned from scratch on the remaining records only
        ref = create("breast-cancer, exact retrain reference", "retrain")
        learn(ref, [i for i in range(n_train) if i not in set(gone.tolist())], "exact retrain")
        exact = accuracy(ref)
        typer.echo(f"held-out accuracy: {before:.3f} before, {after:.3f} after forgetting {forget} records"
                   + (f" (retrained on the records it keeps {len(retrains)}x on the way, as its answers asked)"
                      if retrains else ""))
        typer.echo(f"exact retrain on the remaining {n_train - forget} records: {exact:.3f} "
                   f"(model minus retrain: {after - exact:+.3f})")
        if receipts:
            r0 = receipts[0]
            sigma = r0["mechanism"].get("sigma")
            typer.echo(f"first receipt {r0['id']}: mechanism={r0['mechanism']['type']}, "
                       f"sigma={'-' if sigma is None else format(sigma, '.4g')}, "
                       f"epsilon spent={r0['ledger_after']['epsilon']:.4g} at delta={r0['guarantee']['delta']}")
        bundle = c.get("/v1/audit/export", params={"model_id": mid}).raise_for_status().json()
        report = verify_bundle(bundle, c.get("/v1/keys").json())
        typer.echo(f"offline verification of {len(bundle['receipts'])} receipts: {'ok' if report.ok else 'FAILED'}")
        ledger = c.get(f"/v1/models/{mid}/ledger").json()
        spent = "-" if ledger["rho_spent"] is None else f"{ledger['rho_spent']:.4g}"
        eps = "-" if ledger["epsilon"] is None else f"{ledger['epsilon']:.4g}"
        typer.echo(f"ledger: accounting={ledger['accounting']} rho_spent={spent} "
                   f"of {ledger['rho_budget']} -> epsilon={eps} ({ledger['conversion']})")
        typer.echo("which family for which situation, measured: docs/accuracy.md and the decision table of "
                   "docs/families.md")
        if not report.ok:
            raise typer.Exit(1)


app.command("evaluate")(evaluate_command)  # olu evaluate MODEL FILE.csv (app/cli_evaluate.py)


def main() -> None:  # console script entry point
    app()


if __name__ == "__main__":
    sys.exit(main())
