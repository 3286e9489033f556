"""What every request and response shape shares: strict numbers, ids without control characters, the
strict and omit-none bases."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_serializer


# SQLite returns naive datetimes even for DateTime(timezone=True) columns: every stored time is UTC, say so
# (an RFC 3339 date-time needs the offset)
UtcDatetime = Annotated[datetime, AfterValidator(lambda d: d if d.tzinfo else d.replace(tzinfo=timezone.utc))]
# Numbers are strict: a JSON number (an integer is fine), never a boolean or a numeric string.
Finite = Annotated[float, Field(strict=True, allow_inf_nan=False)]
# Positive numbers of a model spec are positive *normal* floats: a subnormal (below 2.2250738585072014e-308) has lost
# precision already, so 1e-320 and 5e-324 are refused alike; each family's calibration check decides the real range.
POSITIVE_NORMAL_MIN = 2.2250738585072014e-308  # sys.float_info.min
PositiveFinite = Annotated[float, Field(ge=POSITIVE_NORMAL_MIN, strict=True, allow_inf_nan=False)]


def _zero_or_normal(v: float) -> float:
    if 0.0 < v < POSITIVE_NORMAL_MIN:
        raise ValueError(f"must be 0 or at least {POSITIVE_NORMAL_MIN!r} (a normal float)")
    return v


# Ids and names never carry control characters (C0 and DEL): they end up in logs, receipts and databases
# (PostgreSQL refuses NUL in text).
NO_CONTROL = r"^[^\x00-\x1f\x7f]*$"
RecordId = Annotated[str, Field(min_length=1, max_length=256, pattern=NO_CONTROL,
                                description="The client's record id (no control characters).")]
Scope = Literal["write", "predict", "audit"]
LossName = Literal["logistic", "squared", "huber", "softmax"]
MAX_CLASSES = 1000  # app/unlearning/maths/losses.py MAX_CLASSES
ClassName = Annotated[str, Field(min_length=1, max_length=200, pattern=NO_CONTROL,
                                 description="A declared class name of a softmax model.")]


class _OmitNone(BaseModel):
    """Optional fields added for softmax models are left out of the JSON when they do not apply, so the answers
    for the other losses are unchanged."""

    _omit: tuple[str, ...] = ()

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler):
        out = handler(self)
        for key in self._omit:
            if out.get(key) is None:
                out.pop(key, None)
        return out


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
