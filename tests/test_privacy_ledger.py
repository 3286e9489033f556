"""Ledger accounting modes: omega-series, per-update, capacity odometer; summaries in the API's shape."""
from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.privacy import (
    ACCOUNTING_MODES,
    BudgetExhausted,
    Capacity,
    ChargeMismatch,
    LedgerState,
    OmegaSeries,
    PerUpdate,
    accounting_from_params,
    add_up,
    capacity_step,
    epsilon_from_rho,
    fits,
    ledger_summary,
    omega_charge,
    rho_from_epsilon_delta,
)

API_LEDGER_FIELDS = {"accounting", "rho_spent", "rho_budget", "epsilon", "delta", "conversion",
                     "capacity_total", "capacity_left"}
budgets = st.floats(-6.0, 2.0).map(lambda x: 10.0 ** x)
omegas = st.floats(1.0, 3.0, exclude_min=True)


def _exact_sum(values) -> Fraction:
    return sum((Fraction(v) for v in values), Fraction(0))


# ----------------------------------------------------------------------------------------------------------
# omega_series (000 §2.3, §6)
# ----------------------------------------------------------------------------------------------------------
def test_omega_charge_formula_and_direction():
    rb, w = 0.5, 1.2
    for i in (1, 2, 10, 1000):
        expected = rb * (w - 1) / (w * i ** w)
        assert omega_charge(rb, w, i) == pytest.approx(expected, rel=1e-13)
        assert omega_charge(rb, w, i) <= expected            # an allowance is rounded down
    # charges shrink with i (a sign error i^{+omega} would grow them)
    assert omega_charge(rb, w, 2) < omega_charge(rb, w, 1)
    # the first charge is rho (omega-1)/omega, e.g. 1/6 of the budget at omega = 1.2
    assert omega_charge(rb, w, 1) == pytest.approx(rb / 6, rel=1e-13)
    with pytest.raises(ValueError):
        omega_charge(rb, w, 0)


@settings(max_examples=12)
@given(budgets, omegas, st.integers(1, 10_000))
@example(1.0, 1.2, 10_000)
@example(1.0, 1.0000001, 10_000)
@example(1e-6, 3.0, 10_000)
def test_omega_series_cumulative_below_budget(rho_budget, omega, n):
    acct, state = OmegaSeries(rho_budget, 1e-6, omega=omega), LedgerState()
    recorded = []
    for i in range(1, n + 1):
        state, charge = acct.spend(state)
        assert charge.index == i
        recorded.append(charge.rho)
    assert state.rho_spent < rho_budget
    assert Fraction(state.rho_spent) >= _exact_sum(recorded)          # ledger total never under-counts
    # the mathematical bound: sum_{i<=n} (w-1)/(w i^w) < 1 (sum i^-w <= w/(w-1))
    assert _exact_sum(recorded) < Fraction(rho_budget)
    assert acct.can_charge(state)                                      # never exhausted: no cap needed
    assert acct.summary(state).capacity_left is None


def test_omega_series_uniform_cap_refuses_k_plus_one():
    acct, state = OmegaSeries(0.3, 1e-6, cap=7), LedgerState()
    assert acct.allocation == "uniform"
    for _ in range(7):
        state, charge = acct.spend(state)
        assert charge.rho == pytest.approx(0.3 / 7, rel=1e-12)
    assert state.rho_spent <= 0.3
    assert acct.summary(state).capacity_left == 0
    with pytest.raises(BudgetExhausted) as info:
        acct.spend(state)
    assert info.value.index == 8 and info.value.accounting == "omega_series"
    assert not acct.can_charge(state)


def test_omega_series_summary_epsilon_within_target():
    # budget calibrated from an (eps, delta) target: the reported epsilon never exceeds the target
    acct = OmegaSeries.from_target(1.0, 1e-6, omega=1.2)
    assert acct.rho_budget == pytest.approx(rho_from_epsilon_delta(1.0, 1e-6), rel=1e-15)
    state = LedgerState()
    prev = 0.0
    for _ in range(200):
        state, _ = acct.spend(state)
        s = acct.summary(state)
        assert s.epsilon == epsilon_from_rho(state.rho_spent, 1e-6)
        assert prev <= s.epsilon < 1.0
        prev = s.epsilon
    d = ledger_summary(acct, state)
    assert API_LEDGER_FIELDS <= set(d)
    assert d["accounting"] == "omega_series" and d["conversion"] == "cks20" and d["capacity_total"] is None
    assert d["rho_budget"] == acct.rho_budget and d["delta"] == 1e-6


def test_classic_conversion_is_recorded_and_used():
    cks, classic = OmegaSeries.from_target(1.0, 1e-6), OmegaSeries.from_target(1.0, 1e-6, conversion="classic")
    assert classic.rho_budget == pytest.approx(0.01747, abs=6e-6)       # 000 §6 table
    assert classic.rho_budget < cks.rho_budget
    s = classic.summary(classic.spend(LedgerState())[0])
    assert s.conversion == "classic"
    assert s.epsilon == epsilon_from_rho(s.rho_spent, 1e-6, "classic")


# ----------------------------------------------------------------------------------------------------------
# capacity (003 memory pair odometer)
# ----------------------------------------------------------------------------------------------------------
@settings(max_examples=40)
@given(budgets, st.integers(1, 2000))
@example(0.1, 5)
@example(1.0, 3)
@example(0.3, 10)
@example(1e-6, 2000)
def test_capacity_odometer_exact_m(rho_total, m):
    acct, state = Capacity(rho_total, m, 1e-6), LedgerState()
    step = acct.rho_step
    assert step <= rho_total / m and step == pytest.approx(rho_total / m, rel=1e-9)
    for k in range(1, m + 1):
        assert fits(state.rho_spent, step, rho_total)              # the odometer admits step k
        state, charge = acct.spend(state)
        assert state.rho_spent <= rho_total                         # never exceeds the total
        assert acct.capacity_left(state) == m - k
    # refused exactly at m + 1 -- by the odometer comparison itself, not only by the count
    assert not fits(state.rho_spent, step, rho_total)
    with pytest.raises(BudgetExhausted):
        acct.spend(state)
    assert Fraction(state.rho_spent) >= _exact_sum([step] * m)


def test_capacity_step_large_m():
    # the rounding argument of capacity_step at a large m (fast loop, no ledger objects)
    rho_total, m = 0.7, 300_000
    step, spent = capacity_step(rho_total, m), 0.0
    for _ in range(m):
        assert add_up(spent, step) <= rho_total
        spent = add_up(spent, step)
    assert add_up(spent, step) > rho_total


def test_capacity_refuses_when_odometer_full_even_if_count_left():
    acct = Capacity(1.0, 4, 1e-6)
    tampered = LedgerState(rho_spent=0.9, charges=1)       # spent does not match the count
    assert acct.capacity_left(tampered) == 0
    with pytest.raises(BudgetExhausted):
        acct.spend(tampered)


def test_capacity_summary_shape():
    acct = Capacity.from_target(1.0, 1e-6, capacity=10)
    state, _ = acct.spend(LedgerState())
    d = acct.summary(state).as_dict()
    assert API_LEDGER_FIELDS <= set(d)
    assert d["accounting"] == "capacity" and d["capacity_total"] == 10 and d["capacity_left"] == 9
    assert d["rho_spent"] == pytest.approx(acct.rho_budget / 10, rel=1e-9)
    assert d["epsilon"] == epsilon_from_rho(d["rho_spent"], 1e-6)


# ----------------------------------------------------------------------------------------------------------
# engine certificates against the ledger
# ----------------------------------------------------------------------------------------------------------
def test_certified_rho_checks():
    acct = Capacity(0.2, 4, 1e-6)
    allowance = acct.next_charge(LedgerState()).rho
    # a float round trip a few ulps above the allowance is recorded as the allowance
    s1, c1 = acct.spend(LedgerState(), certified_rho=allowance * (1 + 1e-14), index=1)
    assert c1.rho == allowance and s1.rho_spent == allowance
    # more noise than allowed (an exact restart: rho = 0) is recorded as it is, but still counts an event
    s2, c2 = acct.spend(s1, certified_rho=0.0, index=2)
    assert c2.rho == 0.0 and s2.rho_spent == s1.rho_spent and s2.charges == 2
    # a certificate above the allowance, or a drifted deletion index, is refused
    with pytest.raises(ChargeMismatch):
        acct.spend(s2, certified_rho=allowance * 1.01)
    with pytest.raises(ChargeMismatch):
        acct.spend(s2, certified_rho=allowance, index=2)
    with pytest.raises(ChargeMismatch):
        acct.spend(s2, certified_rho=-1.0)


def test_omega_series_accepts_engine_charges():
    # the passive engine computes rho_i = a^2/(2 sigma_i^2) with sigma_i = sqrt(w i^w / (2 (w-1) rho)) a
    acct, state = OmegaSeries(0.05, 1e-6, omega=1.2), LedgerState()
    for i in range(1, 50):
        a = 0.37
        sigma = math.sqrt(1.2 * i ** 1.2 / (2 * 0.2 * 0.05)) * a
        state, charge = acct.spend(state, certified_rho=a * a / (2 * sigma * sigma), index=i)
    assert state.rho_spent < 0.05


# ----------------------------------------------------------------------------------------------------------
# per_update (002 Def. 2.4; 004)
# ----------------------------------------------------------------------------------------------------------
def test_per_update_does_not_compose():
    acct, state = PerUpdate(1e-6, rho=0.02), LedgerState()
    assert acct.summary(state).epsilon == 0.0                     # publication of A(D_0) is a retrain's
    state, charge = acct.spend(state)
    one = acct.summary(state)
    assert one.epsilon == epsilon_from_rho(0.02, 1e-6) and charge.epsilon == one.epsilon
    for _ in range(20):
        state, _ = acct.spend(state)
    many = acct.summary(state)
    assert many.epsilon == one.epsilon and many.rho_spent == 0.02   # per-round guarantee, not 21 x rho
    assert many.rho_budget is None and many.capacity_total is None and many.charges == 21
    assert many.details["scope"] == "published_outputs"


def test_per_update_perfect_variant_splits_delta():
    # 002 Thm 3.2: the distance bound holds w.p. 1 - delta/2 (Lemma A.1), the Gaussian gets delta/2
    with pytest.raises(ValueError):
        PerUpdate(1e-6, rho=0.02, variant="perfect")
    acct = PerUpdate(1e-6, rho=0.02, variant="perfect", delta_tail=5e-7)
    state, _ = acct.spend(LedgerState())
    s = acct.summary(state)
    assert s.details["scope"] == "persisted_state" and s.delta == 1e-6
    assert s.epsilon >= epsilon_from_rho(0.02, 5e-7)                      # converted at the Gaussian's share
    assert s.epsilon > PerUpdate(1e-6, rho=0.02).summary(state).epsilon   # costs more than the full delta
    with pytest.raises(ValueError):
        PerUpdate(1e-6, rho=0.02, delta_tail=1e-6)
    with pytest.raises(ValueError):
        PerUpdate(1e-6, epsilon=1.0, delta_tail=1e-7)


def test_per_update_direct_epsilon_and_capacity():
    # 004 relaxed Gaussian: (eps, 2 delta) stated directly, m_max deletions
    acct, state = PerUpdate(2e-6, epsilon=1.0, capacity=3), LedgerState()
    for _ in range(3):
        state, charge = acct.spend(state)
        assert charge.rho is None and charge.epsilon == 1.0 and charge.delta == 2e-6
    s = acct.summary(state)
    assert s.rho_spent is None and s.epsilon == 1.0 and s.conversion == "none" and s.capacity_left == 0
    with pytest.raises(BudgetExhausted):
        acct.spend(state)
    with pytest.raises(ChargeMismatch):
        acct.spend(LedgerState(), certified_rho=0.01)
    with pytest.raises(ValueError):
        PerUpdate(1e-6)
    with pytest.raises(ValueError):
        PerUpdate(1e-6, rho=0.1, epsilon=1.0)


# ----------------------------------------------------------------------------------------------------------
# persistence, epochs, validation
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("acct", [
    OmegaSeries(0.1, 1e-6, omega=1.5), OmegaSeries(0.1, 1e-5, cap=9, conversion="classic"),
    Capacity(0.4, 12, 1e-7), PerUpdate(1e-6, rho=0.03, capacity=5), PerUpdate(2e-6, epsilon=0.5, variant="perfect"),
    PerUpdate(1e-6, rho=0.03, variant="perfect", delta_tail=5e-7),
])
def test_params_round_trip(acct):
    state, _ = acct.spend(LedgerState())
    again = accounting_from_params(acct.params())
    assert type(again) is type(acct) and again.params() == acct.params()
    assert again.summary(LedgerState.from_dict(state.as_dict())) == acct.summary(state)
    assert ledger_summary(acct.params(), state.as_dict()) == acct.summary(state).as_dict()
    assert set(ACCOUNTING_MODES) == {"omega_series", "per_update", "capacity"}


def test_new_epoch_is_a_fresh_ledger():
    acct, state = Capacity(0.1, 2, 1e-6), LedgerState()
    state, _ = acct.spend(state)
    state, _ = acct.spend(state)
    assert not acct.can_charge(state)
    fresh = state.new_epoch()
    assert fresh == LedgerState(rho_spent=0.0, charges=0, epoch=1)
    assert acct.can_charge(fresh) and acct.summary(fresh).epsilon == 0.0


@pytest.mark.parametrize("bad", [
    lambda: OmegaSeries(0.0, 1e-6), lambda: OmegaSeries(0.1, 1e-6, omega=1.0),
    lambda: OmegaSeries(0.1, 1.5), lambda: OmegaSeries(0.1, 1e-6, cap=0),
    lambda: Capacity(0.1, 0, 1e-6), lambda: Capacity(0.1, True, 1e-6), lambda: Capacity(math.inf, 3, 1e-6),
    lambda: PerUpdate(1e-6, rho=0.1, variant="other"), lambda: OmegaSeries(0.1, 1e-6, conversion="x"),
    lambda: accounting_from_params({"accounting": "rdp"}),
])
def test_invalid_configuration_rejected(bad):
    with pytest.raises(ValueError):
        bad()


@settings(max_examples=60)
@given(st.floats(0.0, 10.0), st.floats(0.0, 10.0), st.floats(0.0, 20.0))
@example(0.1, 0.2, 0.3)
@example(0.25, 0.5, 0.75)
def test_fits_is_the_exact_comparison(spent, charge, budget):
    # the budget test is exact: no tolerance lets a charge through that overshoots by any amount
    assert fits(spent, charge, budget) == (Fraction(spent) + Fraction(charge) <= Fraction(budget))
