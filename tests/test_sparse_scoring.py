"""Every family scores sparse rows (issue 37, F5-F): a hashed model's predictions are computed from its feature
dictionaries' tokens (features.sparse_rows, a scipy CSR array), not from dense rows of the hashed dim, so each
family's ``predict_published`` must give on a CSR array what it gives on the same rows dense (up to the order of the
sums), for one model and for an ensemble (sisa), binary, multi-class and regression alike."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.sparse import csr_array

from app.registry import build_spec, loss_for
from app.unlearning import ALGORITHMS, engine_class

from .test_budget import BASE, MODERATE_HP, ONLY_LOSS

D = 40


@pytest.mark.parametrize("loss", ["logistic", "softmax", "squared"])
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_a_family_scores_csr_rows_as_the_same_rows_dense(algorithm, loss):
    classes = loss == "softmax"  # exact_ridge serves squared loss only: its classifier is multi-output
    loss = ONLY_LOSS.get(algorithm, loss)
    body = {**BASE, "algorithm": algorithm, "loss": loss, "dim": D, "hyperparameters": MODERATE_HP.get(algorithm, {})}
    if classes:
        body["n_classes"] = 3
    try:
        spec = build_spec(body, max_dim=100_000)
    except Exception as e:  # noqa: BLE001 - a family that does not serve this loss: nothing to score
        pytest.skip(f"{algorithm} with {loss}: {e}")
    family = engine_class(algorithm)
    engine = family(spec)
    rng = np.random.default_rng(3)
    X = np.zeros((30, D))
    for i in range(30):  # a hashed row: a few tokens
        X[i, rng.choice(D, 3, replace=False)] = rng.uniform(-0.5, 0.5, 3)
    y = rng.integers(0, 3 if classes else 2, 30).astype(float)
    if loss == "squared" and not classes:
        y = rng.uniform(-0.9, 0.9, 30)
    engine.learn(X, y)
    theta = engine.published()
    pred_dense, out_dense = family.predict_published(spec, loss_for(spec), theta, X)
    pred_sparse, out_sparse = family.predict_published(spec, loss_for(spec), theta, csr_array(X))
    assert isinstance(out_sparse, np.ndarray) and out_sparse.shape == out_dense.shape
    np.testing.assert_allclose(out_sparse, out_dense, rtol=1e-12, atol=1e-15)
    agree = np.mean(np.asarray(pred_sparse) == np.asarray(pred_dense))
    assert agree == 1.0 or (loss == "squared" and not classes and np.allclose(pred_sparse, pred_dense, rtol=1e-12))
