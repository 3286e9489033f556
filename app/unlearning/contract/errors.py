"""The engine's errors (the ground floor of app/unlearning/): what a family raises when a spec, an input or a
forget request is refused, or a computation would leave the finite range.  The service maps each to its problem."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, Sequence


class SpecError(ValueError):
    """The model specification or its hyperparameters are invalid.

    ``fields`` names the spec fields involved as API paths (``bounds.x_norm``, ``hyperparameters.eta``), most
    likely culprit first, when the engine knows them; the service turns them into the field and accepted range
    of its 422 problem."""

    def __init__(self, message: str, *, fields: Sequence[str] = ()):
        super().__init__(message)
        self.fields = tuple(fields)
        # set by the service's field search (registry.build_spec): the field to change and its accepted range
        self.field: str | None = None
        self.accepted: tuple[float, float] | None = None


class NumericError(ArithmeticError):
    """A computation left the finite float range (it would publish or store a non-finite number).

    Creation-time ``check_calibration`` is meant to make this unreachable; it is the runtime guard behind it:
    the service answers a problem and changes nothing instead of publishing null weights."""


class UnderNoisedSpec(SpecError):
    """Settings under which the family's certificate is known to be false (measured under-noised, or a forget that
    could only be decided from unpublished data; issue 14).  Refused at creation; a model stored before the
    refusal still loads, learns and predicts, but refuses every forget (``NotDeletable``) instead of signing
    a false certificate.  ``hp`` holds the normalised hyperparameters."""

    def __init__(self, message: str, hp: Mapping[str, Any]):
        super().__init__(message)
        self.hp = dict(hp)


class InputError(ValueError):
    """Examples violate the declared bounds (wrong shape, non-finite, out of bounds)."""

    def __init__(self, message: str, *, index: int | None = None, code: str = "out-of-bounds-input"):
        super().__init__(message)
        self.index = index
        self.code = code


class CapacityExhausted(RuntimeError):
    """The model cannot certify another deletion; it needs an exact retrain."""


class ForgetError(ValueError):
    """A forget request names steps the engine cannot forget (never learned, already forgotten)."""


class NotDeletable(ForgetError):
    """The record was learned at a step the certified analysis does not cover (pitfall P3: an expansive early
    step of an uncapped schedule).  Nothing was changed; the model needs a restart or an exact retrain."""

    def __init__(self, message: str, *, steps: Sequence[int] = ()):
        super().__init__(message)
        self.steps = tuple(int(s) for s in steps)


# ---- cooperative cancellation (issue 29) ------------------------------------------------------------------------
class Cancelled(Exception):
    """The caller gave up on this computation (a request past its deadline): raised at the engine's next
    ``checkpoint``.  Not a ValueError or ArithmeticError, so no family's refusal handling catches it."""


_installed = threading.local()


def checkpoint() -> None:
    """Called in the engine's long loops (every gradient, every pure-path draw): runs the check the caller
    installed on this thread with ``cancellable`` (it raises ``Cancelled`` once the caller gave up); a no-op when
    none is installed.  The engine stays pure: it only calls a plain callable it was handed."""
    check = getattr(_installed, "check", None)
    if check is not None:
        check()


@contextmanager
def cancellable(check: Callable[[], None]) -> Iterator[None]:
    """Install ``check`` as this thread's checkpoint while the block runs (restored afterwards)."""
    previous = getattr(_installed, "check", None)
    _installed.check = check
    try:
        yield
    finally:
        _installed.check = previous
