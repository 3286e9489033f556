"""The public feature map of a model spec (app/feature_map.py; README "Feature maps")."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .common import Finite, PositiveFinite, Strict
from .rules import json_int

MAX_INPUT = 100_000  # the longest per-feature list (OLU_MAX_DIM's default; the model's dim decides)


class FeatureMapSpec(Strict):
    """A fixed, public nonlinear map phi of the raw rows: the model learns, forgets and predicts on phi(x). Nothing in
    it depends on data: centres (or frequencies) are drawn from N(0, I) with the public `seed`, and `gamma` and the
    input scaling are declared here, never fitted."""
    kind: Literal["rbf", "rff"] = Field(description=(
        "rbf: Nystroem map on public centres, phi(x) = k(z, C) L^-T with k(z, c) = exp(-gamma ||z - c||^2) and L the "
        "Cholesky factor of K_CC + eps I; rff: random Fourier features (a cosine and a sine per frequency)."))
    centres: json_int(ge=1, le=65536) = Field(1024, description=(
        "The mapped dimension D: the number of centres (rbf) or of random features (rff, an even number). The "
        "work and memory budget bounds it (422 naming feature_map.centres and its accepted range)."))
    gamma: Annotated[float, Field(ge=1e-12, le=1e12, strict=True, allow_inf_nan=False)] | None = Field(None, description=(
        "The kernel's bandwidth in standardised units; default 1 / dim."))
    seed: json_int(ge=0, le=2**32 - 1) = Field(0x4F4C55, description=(
        "The public seed of the centres (numpy's legacy RandomState, whose streams never change)."))
    centre: Annotated[list[Finite], Field(max_length=MAX_INPUT)] | None = Field(None, description=(
        "Per input feature, the value subtracted before scaling (one per dim; default 0)."))
    scale: Annotated[list[PositiveFinite], Field(max_length=MAX_INPUT)] | None = Field(None, description=(
        "Per input feature, the divisor after centring (one per dim; default 1)."))
    ranges: Annotated[list[Annotated[list[Finite], Field(min_length=2, max_length=2)]],
                      Field(max_length=MAX_INPUT)] | None = Field(None, description=(
        "Instead of centre and scale: per input feature [lo, hi] (lo < hi), mapped onto [-1, 1]."))
    clip: Annotated[float, Field(ge=1e-6, le=1e6, strict=True, allow_inf_nan=False)] | None = Field(None, description=(
        "Scaled values are clipped to [-clip, clip]: any finite raw row is accepted. Default 4 (1 with ranges)."))


class ServedFeatureMap(Strict):
    """The map as stored, every default filled in."""
    kind: str
    centres: int
    gamma: float
    seed: int
    centre: list[float]
    scale: list[float]
    clip: float
    input_dim: int = Field(description="The raw rows' length (the model's dim).")
    dim: int = Field(description="The mapped dimension D the engine learns on.")
    bound: float = Field(description="The L2 bound of every mapped vector (min(1, bounds.x_norm)): every guarantee "
                                     "and constant of the model is computed with it.")
    max_rows: int = Field(description="The most rows one request maps (its work budget).")
