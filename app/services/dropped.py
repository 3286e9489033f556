"""Records a restart dropped (issue 37 item 8): an exact restart of a model that keeps no data discards everything
it learned before (``Unlearner.dropped_through``).  Those records are no longer held -- the model keeps nothing of
them -- though nobody forgot them: their commitments stay in the record index (a later forget of one answers an
exact receipt and counts it forgotten instead).  The model row keeps how many such records there are
(``models.n_dropped``) and the step they run to (``models.dropped_through``); records held, what the records quota
counts, are ``n_records - n_forgotten - n_dropped`` (model_core._ModelRow).  Before migration 0017 a restart's
records stayed counted as held; a model restarted then is corrected at its next forget."""
from __future__ import annotations

from typing import Sequence

from sqlalchemy import func, select

from ..db.tables import Record


def count_dropped(conn, row, engine, steps: Sequence[int]) -> None:
    """In a forget's write transaction, after the forgotten records' rows are inserted: update ``row.n_dropped`` and
    ``row.dropped_through`` for the records of ``steps`` being forgotten and a restart the forget made."""
    before, now = int(row.dropped_through or 0), int(engine.dropped_through())
    dropped = int(row.n_dropped or 0) - sum(1 for t in steps if t <= before)  # dropped, now forgotten
    if now > before:  # a restart: every record learned in (before, now] and not forgotten is dropped
        forgotten = conn.execute(select(func.count()).select_from(Record.__table__).where(
            Record.model_id == row.id, Record.step > before, Record.step <= now,
            Record.status == "forgotten")).scalar_one()
        dropped += (min(now, int(row.n_records)) - before) - int(forgotten)
    if dropped != (row.n_dropped or 0):
        row.n_dropped = max(0, dropped)
    if now > before:
        row.dropped_through = now
