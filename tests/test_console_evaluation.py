"""The console's model page shows the model's last evaluation (issue 39 item 5): its figures and confusion matrix,
from GET /v1/models/{id}/evaluation, in a real browser (the fixtures of tests/test_console_browser.py)."""
from __future__ import annotations

import numpy as np
import pytest

from . import test_console_browser as console
from .helpers import unit_rows

expect = console.expect
browser, page, live = console.browser, console.page, console.live  # noqa: F811 - the same fixtures, this module's
pytestmark = pytest.mark.xdist_group("containers")


def test_model_page_shows_the_last_evaluation(page, live):
    c = live["client"]
    X = unit_rows(60, 4, seed=11)
    truth = (X[:, 0] > 0).astype(int)
    r = c.post("/v1/models", json={"name": "graded", "algorithm": "retrain", "loss": "logistic", "dim": 4,
                                   "bounds": {"x_norm": 1.0}, "l2": 0.05})
    mid = r.json()["id"]
    ex = [{"id": f"g{i}", "x": x.tolist(), "y": int(t)} for i, (x, t) in enumerate(zip(X, truth))]
    assert c.post(f"/v1/models/{mid}/learn", json={"examples": ex}).status_code == 200
    ev = c.post(f"/v1/models/{mid}/evaluate", json={"x": X.tolist(), "y": truth.tolist()}).json()
    console.sign_in(page, live, live["audit"])
    page.goto(live["url"] + f"#/models/{mid}")
    card = page.locator("#evaluation")
    expect(card).to_contain_text("Last evaluation")
    expect(card).to_contain_text(f"({ev['correct']} of 60 correct)")
    assert page.locator("#confusion tbody tr").count() == 2
    cells = [int(t) for t in page.locator("#confusion tbody td").all_inner_texts()]
    assert cells == [v for row in ev["confusion_matrix"] for v in row] and sum(cells) == 60
    console.shot(page, "model-evaluation", "#evaluation")
    page.goto(live["url"] + f"#/models/{live['credit']}")  # a model never evaluated: no card
    page.wait_for_selector("#deletion-log")
    assert page.locator("#evaluation").count() == 0
    assert np.isfinite(ev["log_loss"])
