"""The exact families' projected OGD loop (retrain, sisa; and the OGD iterate of active_olu / second_order_olu),
in one arithmetic that the compiled kernel and its numpy fallback share to the bit (issue 32).

An exact forget recomputes OGD over the retained examples and claims that the result *is* what the model would
hold had the record never been learned.  That claim is about bits: the replay must do the very floating-point
operations the learning did.  Learning may run before numba has loaded its kernels (the cold start, issue 23:
no request waits for the compiler) and a forget after, or the other way round, or on a process without numba.
So both loops below compute, example by example, the same operations in the same order:

    eta  = cap                    if t < t_switch   (schedules.py: CappedStronglyConvex / StronglyConvex /
         = 1 / (mu_sched t)       otherwise           ConstantStep, same expressions)
    s    = ((theta_d + x_0 theta_0) + x_1 theta_1) + ...     (left to right: no pairwise or BLAS summation)
    r    = 1/2 (1 + tanh(s / 2)) - y  (logistic, the C library's tanh: math.tanh in both loops)
         | s - y (squared) | clip(s - y, -delta_h, delta_h) (huber)
    v_j  = theta_j - eta (r x_j + mu theta_j)   (x_d = 1: the bias; each product and sum rounded on its own)
    sq   = ((v_0 v_0 + v_1 v_1) + ...) + v_d v_d  (left to right);  theta = v (radius / sqrt(sq)) if sqrt(sq) > R

Every operation is a single IEEE-754 double operation rounded to nearest: no fused multiply-add (numba compiles
without ``fastmath``, and LLVM contracts nothing it is not told to), no reassociation, and the one transcendental,
tanh, is the same C function in both.  The fallback (``fallback_ogd_at``) runs the kernel's loop on Python floats
(``_list_ogd_at``, small d), or (``_numpy_ogd_at``) with whole-vector numpy operations where they are elementwise
(each element rounded exactly as the scalar loop rounds it) and ``np.cumsum`` for the two sums (an accumulation
is sequential: element k is the rounded sum of element k - 1 and input k).
tests/test_exact_ogd.py checks the two loops agree bit for bit on random streams (hypothesis), and that a model
learning across the switch from the fallback to the kernel forgets exactly.
"""
from __future__ import annotations

import math

import numpy as np

# the kernel's one signature (compiled eagerly in fast._compile, never lazily on a request)
SIGNATURE = "void(float64[::1], float64[:, ::1], float64[::1], int64[::1], float64, int64, float64, int64, " \
            "float64, float64, float64)"


def _py_ogd_at(theta, X, y, steps, cap, t_switch, mu_sched, loss_code, mu, huber_delta, radius):
    """Projected OGD in place on ``theta`` (d + 1: weights, bias) over the raw rows X; example i is consumed at
    clock steps[i] (the kernel's source, compiled by numba)."""
    n, d = X.shape
    for i in range(n):
        t = steps[i]
        if t < t_switch:
            eta = cap
        else:
            eta = 1.0 / (mu_sched * t)
        s = theta[d]
        for j in range(d):
            s += X[i, j] * theta[j]
        if loss_code == 0:
            r = 0.5 * (1.0 + math.tanh(0.5 * s)) - y[i]
        else:
            r = s - y[i]
            if loss_code == 2:
                if r > huber_delta:
                    r = huber_delta
                elif r < -huber_delta:
                    r = -huber_delta
        sq = 0.0
        for j in range(d):
            v = theta[j] - eta * (r * X[i, j] + mu * theta[j])
            theta[j] = v
            sq += v * v
        v = theta[d] - eta * (r * 1.0 + mu * theta[d])
        theta[d] = v
        sq += v * v
        norm = math.sqrt(sq)
        if norm > radius:
            f = radius / norm
            for j in range(d + 1):
                theta[j] = theta[j] * f


# below this dimension the fallback runs on Python floats (a few us a step), above on numpy vectors (the
# per-call overhead of ~10 ufuncs a step, flat in d)
LIST_DIM = 64


def fallback_ogd_at(theta, X, y, steps, cap, t_switch, mu_sched, loss_code, mu, huber_delta, radius):
    """The kernel's loop without numba, in place on ``theta``: the same bits (module docstring)."""
    f = _list_ogd_at if X.shape[1] <= LIST_DIM else _numpy_ogd_at
    f(theta, X, y, steps, cap, t_switch, mu_sched, loss_code, mu, huber_delta, radius)


def _residual(s: float, yi: float, loss_code: int, huber_delta: float) -> float:
    """The loss derivative at score s for the two fallbacks, in the kernel's operations and order (Python floats)."""
    if loss_code == 0:
        return 0.5 * (1.0 + math.tanh(0.5 * s)) - yi
    r = s - yi
    if loss_code == 2:
        if r > huber_delta:
            r = huber_delta
        elif r < -huber_delta:
            r = -huber_delta
    return r


def _list_ogd_at(theta, X, y, steps, cap, t_switch, mu_sched, loss_code, mu, huber_delta, radius):
    """The loop on Python floats (IEEE doubles, each operation rounded as the kernel rounds it)."""
    d = X.shape[1]
    th = theta.tolist()
    cols = range(d)
    for xi, yi, t in zip(X.tolist(), y.tolist(), steps.tolist()):
        eta = cap if t < t_switch else 1.0 / (mu_sched * float(t))
        s = th[d]
        for j in cols:
            s += xi[j] * th[j]
        r = _residual(s, yi, loss_code, huber_delta)
        xi.append(1.0)
        th = [tj - eta * (r * xj + mu * tj) for tj, xj in zip(th, xi)]
        sq = 0.0
        for v in th:
            sq += v * v
        norm = math.sqrt(sq)
        if norm > radius:
            f = radius / norm
            th = [v * f for v in th]
    theta[:] = th


def _numpy_ogd_at(theta, X, y, steps, cap, t_switch, mu_sched, loss_code, mu, huber_delta, radius):
    """The same loop in place, one example at a time with numpy vectors (the fallback: no numba, or not loaded
    yet).  In-place products (``g *= eta``) are the kernel's products with the factors swapped: the same bits."""
    n, d = X.shape
    buf, acc = np.empty(d + 1), np.empty(d + 1)
    xa, g, w = np.ones(d + 1), np.empty(d + 1), np.empty(d + 1)
    th = theta  # updated in place
    for i in range(n):
        t = int(steps[i])
        eta = cap if t < t_switch else 1.0 / (mu_sched * float(t))
        xi = X[i]
        buf[0] = th[d]
        np.multiply(xi, th[:d], out=buf[1:])
        np.cumsum(buf, out=acc)  # s = ((theta_d + x_0 theta_0) + x_1 theta_1) + ...
        s = float(acc[d])
        yi = float(y[i])
        r = _residual(s, yi, loss_code, huber_delta)
        xa[:d] = xi
        np.multiply(xa, r, out=g)      # r x_j (x_d = 1)
        np.multiply(th, mu, out=w)     # mu theta_j
        g += w
        g *= eta
        th -= g                        # v_j = theta_j - eta (r x_j + mu theta_j)
        np.multiply(th, th, out=w)
        np.cumsum(w, out=acc)
        norm = math.sqrt(float(acc[d]))
        if norm > radius:
            th *= radius / norm
