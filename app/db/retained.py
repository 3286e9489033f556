"""The retained-example store of data-holding families, read by the engine through ``RetainedData``.

Examples are keyed by (model, step), stored as little-endian float64 bytes, streamed in step order with keyset
pagination (never all at once), and deleted outright when their record is forgotten (SQLite runs with
secure_delete, so no copy is left in free pages).
"""
from __future__ import annotations

from typing import Collection, Iterator, Sequence

import numpy as np
from sqlalchemy import delete, func, insert, select

from .tables import RetainedExample


class SqlRetained:
    def __init__(self, session, model_id: str, dim: int):
        self.s, self.model_id, self.dim = session, model_id, dim

    def __len__(self) -> int:
        return int(self.s.execute(select(func.count()).select_from(RetainedExample)
                                  .where(RetainedExample.model_id == self.model_id)).scalar_one())

    def get(self, steps: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        wanted = [int(t) for t in steps]
        rows: dict[int, tuple[bytes, float]] = {}
        for i in range(0, len(wanted), 500):
            part = wanted[i : i + 500]
            for step, x, y in self.s.execute(select(RetainedExample.step, RetainedExample.x, RetainedExample.y)
                                             .where(RetainedExample.model_id == self.model_id,
                                                    RetainedExample.step.in_(part))):
                rows[int(step)] = (x, y)
        missing = [t for t in wanted if t not in rows]
        if missing:
            raise KeyError(f"steps not retained: {missing[:5]}")
        X = np.array([np.frombuffer(rows[t][0], dtype="<f8") for t in wanted]).reshape(len(wanted), self.dim)
        return X, np.array([rows[t][1] for t in wanted], dtype=np.float64)

    def chunks(self, size: int, exclude: Collection[int] = ()) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        skip = {int(t) for t in exclude}
        after = 0
        while True:
            page = self.s.execute(select(RetainedExample.step, RetainedExample.x, RetainedExample.y)
                                  .where(RetainedExample.model_id == self.model_id, RetainedExample.step > after)
                                  .order_by(RetainedExample.step).limit(size)).all()
            if not page:
                return
            after = int(page[-1][0])
            kept = [r for r in page if int(r[0]) not in skip]
            if kept:
                steps = np.array([r[0] for r in kept], dtype=np.int64)
                X = np.frombuffer(b"".join(r[1] for r in kept), dtype="<f8").reshape(len(kept), self.dim).copy()
                yield steps, X, np.array([r[2] for r in kept], dtype=np.float64)

    def add(self, steps: np.ndarray, X: np.ndarray, y: np.ndarray) -> None:
        self.s.execute(insert(RetainedExample), [
            {"model_id": self.model_id, "step": int(t), "x": np.ascontiguousarray(x, dtype="<f8").tobytes(),
             "y": float(v)} for t, x, v in zip(steps, X, y)])

    def erase(self, steps: Sequence[int]) -> None:
        wanted = [int(t) for t in steps]
        for i in range(0, len(wanted), 500):
            self.s.execute(delete(RetainedExample).where(RetainedExample.model_id == self.model_id,
                                                         RetainedExample.step.in_(wanted[i : i + 500])))

    def erase_all(self) -> None:
        self.s.execute(delete(RetainedExample).where(RetainedExample.model_id == self.model_id))
