"""``olu evaluate``: score a model on a labelled CSV file through POST /v1/models/{id}/evaluate (issue 39).

The CSV has a header row; the label column (``--label``, default ``y``) holds the true labels (numbers, or class
names), every other column is an input: for a dense model the columns are its ``dim`` features in order, for a
model with a feature spec each row becomes a feature dictionary (declared numeric fields as numbers, other fields as
strings, empty cells left out).  A file larger than one request (OLU_MAX_BATCH, or a feature map's ``max_rows``) is
sent in several, and the figures are combined exactly (counts summed; means weighted by n); the model's stored last
evaluation is then the last request's.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Optional

import typer


def _label(v: str) -> Any:
    try:
        return float(v)
    except ValueError:
        return v


def read_csv(path: Path, label: str, model: dict) -> tuple[list, list, bool]:
    """(inputs, labels, dictionaries?) of the file for ``model`` (its GET /v1/models/{id} answer)."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise typer.BadParameter(f"{path} has no rows")
    if label not in rows[0]:
        raise typer.BadParameter(f"{path} has no label column {label!r} (columns: {', '.join(rows[0])})")
    y = [_label(r[label]) for r in rows]
    spec = model.get("features")
    if spec is not None:
        numeric = set(spec.get("numeric") or {})
        X = [{k: (float(v) if k in numeric else v) for k, v in r.items() if k != label and v != ""} for r in rows]
        return X, y, True
    try:
        X = [[float(v) for k, v in r.items() if k != label] for r in rows]
    except ValueError as e:
        raise typer.BadParameter(f"a dense model takes numbers in every column but {label!r}: {e}") from None
    return X, y, False


def combine(parts: list[dict]) -> dict:
    """The figures of the whole file from those of its requests: counts summed, means weighted by n."""
    n = sum(p["n"] for p in parts)
    out: dict[str, Any] = {"n": n, "version": parts[-1]["version"], "requests": len(parts)}
    if all("correct" in p for p in parts):
        out["correct"] = sum(p["correct"] for p in parts)
        out["accuracy"] = out["correct"] / n
    for key in ("log_loss", "mean_squared_error"):
        if all(key in p for p in parts):
            out[key] = sum(p[key] * p["n"] for p in parts) / n
    if all("confusion_matrix" in p for p in parts):
        cm = [row[:] for row in parts[0]["confusion_matrix"]]
        for p in parts[1:]:
            for i, row in enumerate(p["confusion_matrix"]):
                for j, v in enumerate(row):
                    cm[i][j] += v
        out["confusion_matrix"] = cm
    if parts[-1].get("classes"):
        out["classes"] = parts[-1]["classes"]
    return out


def evaluate_command(model_id: str = typer.Argument(..., help="the model to score"),
                     file: Path = typer.Argument(..., exists=True, dir_okay=False, help="a CSV file with a header row"),
                     label: str = typer.Option("y", help="the column of the true labels"),
                     server: str = typer.Option("http://127.0.0.1:8000", envvar="OLU_SERVER", help="the service"),
                     api_key: str = typer.Option(..., envvar="OLU_API_KEY", help="a key with the predict scope"),
                     batch: Optional[int] = typer.Option(None, min=1, help="rows per request (default: the most "
                                                                             "the model takes)")):
    """Score a model on a labelled CSV file: accuracy, log-loss, the confusion matrix or the mean squared error, as
    POST /v1/models/{id}/evaluate answers them (the model learns nothing; only the figures are kept)."""
    import httpx

    with httpx.Client(base_url=server, timeout=120, headers={"authorization": f"Bearer {api_key}"}) as c:
        r = c.get(f"/v1/models/{model_id}")
        if r.status_code != 200:
            typer.echo(f"olu evaluate: {r.status_code} {r.text}", err=True)
            raise typer.Exit(1)
        model = r.json()
        X, y, dictionaries = read_csv(file, label, model)
        size = batch or int((model.get("feature_map") or {}).get("max_rows") or 10_000)
        parts = []
        for a in range(0, len(y), size):
            body = {"features" if dictionaries else "x": X[a:a + size], "y": y[a:a + size]}
            r = c.post(f"/v1/models/{model_id}/evaluate", json=body)
            if r.status_code != 200:
                typer.echo(f"olu evaluate: rows {a}..{min(a + size, len(y)) - 1}: {r.status_code} {r.text}", err=True)
                raise typer.Exit(1)
            parts.append(r.json())
    typer.echo(json.dumps(combine(parts), indent=2))
