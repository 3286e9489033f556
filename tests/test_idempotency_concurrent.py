"""A real concurrent duplicate: the same unlearn with the same Idempotency-Key from several threads at once.

Exactly one execution: one 200 (first), the others 409 idempotency-request-in-progress while it runs, or a
200 replay (identical body, ``idempotent-replayed``) once it committed.  Never two receipts, never budget
spent twice.  Also concurrent *different* bodies under one key: one wins, the others 409 or 422.
"""
from __future__ import annotations

import threading

import httpx

from .helpers import create_model, examples, unit_rows

ROUNDS = 8
RACERS = 4


def _race(server, key: str, path: str, bodies: list[dict], idem: str) -> list[httpx.Response]:
    barrier = threading.Barrier(len(bodies))
    out: list = [None] * len(bodies)

    def go(i: int) -> None:
        with server.client(key) as c:
            barrier.wait()
            out[i] = c.post(path, json=bodies[i], headers={"Idempotency-Key": idem})

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_concurrent_same_key_same_unlearn_executes_once(server):
    _, key = server.new_tenant("idem-race")
    with server.client(key) as c:
        mid = create_model(c, dim=2)["id"]
        assert c.post(f"/v1/models/{mid}/learn", json={"examples": examples(unit_rows(ROUNDS, 2))}).status_code == 200
        replays = conflicts = 0
        for k in range(ROUNDS):
            rs = _race(server, key, f"/v1/models/{mid}/unlearn", [{"ids": [f"rec-{k}"]}] * RACERS, f"forget-{k}")
            codes = sorted(r.status_code for r in rs)
            assert set(codes) <= {200, 409}, [r.text for r in rs]
            firsts = [r for r in rs if r.status_code == 200 and r.headers.get("idempotent-replayed") != "true"]
            assert len(firsts) == 1, codes
            for r in rs:
                if r.status_code == 200 and r is not firsts[0]:
                    assert r.json() == firsts[0].json()
                    replays += 1
                elif r.status_code == 409:
                    assert r.json()["type"].endswith("/idempotency-request-in-progress")
                    conflicts += 1
            # after the race a retry is a replay of the one answer
            again = c.post(f"/v1/models/{mid}/unlearn", json={"ids": [f"rec-{k}"]}, headers={"Idempotency-Key": f"forget-{k}"})
            assert again.status_code == 200 and again.json() == firsts[0].json()
        deletions = c.get(f"/v1/models/{mid}/deletions").json()["items"]
        assert len(deletions) == ROUNDS == c.get(f"/v1/models/{mid}").json()["n_forgotten"]
        ledger = c.get(f"/v1/models/{mid}/ledger").json()
        assert len([e for e in ledger["entries"] if e["kind"] == "deletion"]) == ROUNDS
        assert replays + conflicts == ROUNDS * (RACERS - 1)


def test_concurrent_same_key_different_bodies_one_wins(server):
    _, key = server.new_tenant("idem-race-2")
    with server.client(key) as c:
        mid = create_model(c, dim=2)["id"]
        batches = [{"examples": examples(unit_rows(2, 2, seed=i), prefix=f"b{i}")} for i in range(RACERS)]
        rs = _race(server, key, f"/v1/models/{mid}/learn", batches, "one-key")
        ok = [r for r in rs if r.status_code == 200]
        assert len(ok) == 1 and all(r.status_code in (409, 422) for r in rs if r.status_code != 200), \
            [r.status_code for r in rs]
        model = c.get(f"/v1/models/{mid}").json()
        assert model["step"] == model["n_records"] == 2 and model["version"] == 2
