"""Shared verification vectors for the browser console's verifier (app/console/js/verify.js) and the Python one
(app/receipts/verify.py): valid bundles and tampered variants, each as the JSON *text* a file or a server answer
would carry, with the trusted keys. tests/test_console_browser.py runs both verifiers on every vector and
compares their reports check by check.

``synthetic_vectors()`` builds its own log (two signing keys, a rotation, receipts of every shape, erasures,
consistency proofs) without a server; ``tamper_variants()`` derives tampered copies of any bundle, so the same
mutations also run on bundles exported by a live server.
"""
from __future__ import annotations

import base64
import copy
import hashlib
import json
import random
from typing import Any

from app.receipts.canonical import canonical_json, erased_records_sha256, receipt_leaf_bytes
from app.receipts.checkpoint import make_checkpoint, receipt_proof
from app.receipts.keys import KeyRing, PublicKeyEntry, SigningKey, b64decode_strict
from app.receipts.merkle import InMemoryNodeStore, MerkleLog
from app.receipts.verify import _strict_loads, verify_bundle

TENANT = "t-console"
ORIGIN = f"olu/{TENANT}"
OLD = SigningKey.from_seed(bytes(range(7, 39)))
NEW = SigningKey.from_seed(bytes(range(9, 41)))
RING_OLD = KeyRing(OLD, active_not_before="2026-01-01T00:00:00Z")
RING = KeyRing(NEW, active_not_before="2026-06-01T00:00:00.250000Z",
               retired=[PublicKeyEntry(OLD.key_id, OLD.public_key_raw, "2026-01-01T00:00:00Z",
                                       "2026-06-01T00:00:00.250000Z")])
TRUSTED = RING.public_keys()


def _receipt(i: int) -> dict[str, Any]:
    mech = ({"type": "discrete_gaussian", "sigma": 2.5 + i, "sensitivity": 0.25,
             "rho": 0.25 ** 2 / (2 * (2.5 + i) ** 2), "grid": 2.0 ** -20, "rounding": "nearest_even"} if i % 3 == 0 else
            {"type": "exact", "sigma": 0.0, "sensitivity": 0.0, "rho": 0.0} if i % 3 == 1 else
            {"type": "gaussian", "sigma": 0.123456789 * (i + 1), "sensitivity": 1e-7, "rho": 0.1})
    return {
        "id": f"rcp-{i}", "tenant_id": TENANT, "model_id": "mdl-1",
        "record_commitment": hashlib.sha256(f"rec{i}".encode()).hexdigest(),
        "learned_step": 3 * i, "forgotten_step": 3 * i + 2, "deletion_index": i + 1, "epoch": 0,
        "algorithm": "passive_olu", "mechanism": mech,
        "guarantee": {"definition": "renyi", "alpha": None, "epsilon": 1.0, "delta": 1e-6, "conversion": "cks20",
                      "statement": "unicode ✓ é \u2028 \x7f \"quoted\" \\ tab\t"},
        "ledger_after": {"rho_spent": 0.1 * (i + 1), "epsilon": 1.5e-5 * (i + 1), "delta": 1e-6,
                         "capacity_left": None if i % 2 else 30 - i},
        "published_parameters_sha256": hashlib.sha256(bytes([i])).hexdigest(),
        "model_version": i + 1, "big": 2 ** 53 - 1, "tiny": 5e-324, "huge": 1.7976931348623157e308, "neg": -0.0,
        "keys_order": {"\u00e9": 1, "z": 2, "A": 3, "\U0001f600": 4, "\uffff": 5, "": 6},
        # receipts 0..4 were issued before the rotation (signed by OLD), the rest after (signed by NEW)
        "issued_at": f"2026-0{3 if i < 5 else 8}-01T00:00:{i:02d}.{i * 123457 % 10 ** 6:06d}Z", "log_index": i,
    }


def _erasure(i: int, commitments: list[str]) -> dict[str, Any]:
    return {"id": f"ers-{i}", "kind": "model_erasure", "tenant_id": TENANT, "model_id": f"mdl-gone-{i}",
            "algorithm": "retrain", "mechanism": {"type": "exact", "sigma": 0, "sensitivity": 0, "rho": 0},
            "guarantee": {"definition": "exact", "epsilon": 0, "delta": 0, "statement": "erased"},
            "records": {"erased": len(commitments), "commitments_sha256": erased_records_sha256(commitments)},
            "records_learned": len(commitments) + 2, "records_forgotten_before": 2, "model_version": 9,
            "issued_at": "2026-08-03T00:00:00Z", "log_index": i}


def _commitments(i: int, n: int) -> list[str]:
    return sorted(hashlib.sha256(f"gone{i}-{j}".encode()).hexdigest() for j in range(n))


def build_log(n: int = 13, extra: int = 6):
    """A log of n + extra receipts (the last two erasures), checkpoints at n and n + extra."""
    log, size, receipts = MerkleLog(InMemoryNodeStore()), 0, []
    for i in range(n + extra):
        ring = RING_OLD if i < 5 else RING
        r = ring.sign_receipt(_erasure(i, _commitments(i, 3 + i % 2)) if i >= n + extra - 2 else _receipt(i))
        size = log.append(receipt_leaf_bytes(r), size)
        receipts.append(r)
    cp_old = make_checkpoint(ORIGIN, n, log.root(n), "2026-08-01T00:00:00Z", RING)
    cp_new = make_checkpoint(ORIGIN, n + extra, log.root(n + extra), "2026-08-04T00:00:00Z", RING)
    served = [dict(r, proof=receipt_proof(log, i, cp_old if i < n else cp_new)) for i, r in enumerate(receipts)]
    consistency = {"from": cp_old, "to": cp_new,
                   "hashes": [base64.b64encode(h).decode() for h in log.consistency_proof(n, n + extra)]}
    return log, served, consistency


def _flip_b64(text: str, pos: int, mask: int) -> str:
    raw = bytearray(b64decode_strict(text))
    raw[pos % len(raw)] ^= mask
    return base64.b64encode(bytes(raw)).decode()


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


_JUNK: list[Any] = [None, True, False, 0, 1, -1, 3.0, 0.5, 2 ** 60, "", "x", "AAAA", [], {}, [1, "a"], {"a": None},
                    "2026-01-01T00:00:00Z", 1e300, "\u2028", "olu/other"]


def tamper_variants(name: str, bundle: dict, keys: Any, rng: random.Random, count: int = 40) -> list[dict]:
    """Tampered copies of a bundle (as text): byte flips inside receipts, proof and checkpoint fields,
    junk anywhere, integers written as floats, consistency mutations, erasure commitments."""
    out = []

    def add(label, b, k=keys, text=None):
        out.append({"name": f"{name}/{label}", "bundle": text if text is not None else json.dumps(b),
                    "keys": json.dumps(k)})

    receipts = bundle.get("receipts") or []
    for j in range(count):
        b = copy.deepcopy(bundle)
        kind = rng.choice(["byteflip", "proofhash", "checkpoint", "junk", "floatint", "text"])
        if kind in ("byteflip", "text", "proofhash", "checkpoint", "floatint") and not receipts:
            kind = "junk"
        if kind == "byteflip":
            i = rng.randrange(len(receipts))
            r = b["receipts"][i]
            body = bytearray(canonical_json({k: v for k, v in r.items() if k != "proof"}))
            body[rng.randrange(len(body))] ^= rng.randrange(1, 256)
            try:
                tampered = json.loads(bytes(body).decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                tampered = None
            if isinstance(tampered, dict):
                tampered["proof"] = r.get("proof")
                b["receipts"][i] = tampered
            else:  # the receipt as (now broken) text
                b["receipts"][i] = bytes(body).decode("utf-8", "replace")
        elif kind == "text":
            i = rng.randrange(len(receipts))
            text = json.dumps(b["receipts"][i], indent=rng.choice([None, 1]), ensure_ascii=rng.random() < 0.5)
            if rng.random() < 0.5:
                text = text.replace('"epoch": 0', rng.choice(['"epoch": 0, "epoch": 1', '"epoch": NaN',
                                                              '"epoch": 0.0', '"epoch": 1e999']))
            b["receipts"][i] = text
        elif kind == "proofhash":
            i = rng.randrange(len(receipts))
            hashes = b["receipts"][i]["proof"]["hashes"]
            if hashes:
                j2 = rng.randrange(len(hashes))
                hashes[j2] = _flip_b64(hashes[j2], rng.randrange(32), rng.randrange(1, 256))
            else:
                hashes.append(base64.b64encode(bytes(32)).decode())
        elif kind == "checkpoint":
            i = rng.randrange(len(receipts))
            cp = b["receipts"][i]["proof"]["checkpoint"]
            field = rng.choice(["root_hash", "signature", "tree_size", "origin", "timestamp", "key_id"])
            if field in ("root_hash", "signature"):
                cp[field] = _flip_b64(cp[field], rng.randrange(64), rng.randrange(1, 256))
            elif field == "tree_size":
                cp[field] += rng.randrange(1, 8)
            elif field == "key_id":
                cp[field] = rng.choice([OLD.key_id, "0123456789abcdef", 7])
            else:
                s = bytearray(cp[field].encode())
                s[rng.randrange(len(s))] ^= rng.randrange(1, 128)
                cp[field] = bytes(s).decode("utf-8", "replace")
        elif kind == "floatint":
            i = rng.randrange(len(receipts))
            text = json.dumps(b)
            target = rng.choice(['"leaf_index": ', '"tree_size": ', '"log_index": '])
            at = text.find(target, text.find(f'"{receipts[i].get("id", "")}"') if isinstance(receipts[i], dict)
                           else 0)
            if at >= 0:
                end = at + len(target)
                stop = end
                while text[stop].isdigit():
                    stop += 1
                text = text[:stop] + rng.choice([".0", "e0", ""]) + text[stop:]
                add(f"{j}-{kind}", None, text=text)
                continue
        else:  # junk anywhere
            paths = [p for p in _paths(b) if p]
            if not paths:
                continue
            path = rng.choice(paths)
            parent = b
            for k in path[:-1]:
                parent = parent[k]
            parent[path[-1]] = copy.deepcopy(rng.choice(_JUNK))
        add(f"{j}-{kind}", b)
    if "consistency" in bundle:
        for kind in ("hash", "swap", "from_root", "to_size", "to_sig", "no_hashes", "origin"):
            b = copy.deepcopy(bundle)
            c = b["consistency"]
            if kind == "hash" and c["hashes"]:
                c["hashes"][0] = _flip_b64(c["hashes"][0], 3, 0x40)
            elif kind == "swap":
                c["from"], c["to"] = c["to"], c["from"]
            elif kind == "from_root":
                c["from"]["root_hash"] = _flip_b64(c["from"]["root_hash"], 5, 1)
            elif kind == "to_size":
                c["to"]["tree_size"] += 1
            elif kind == "to_sig":
                c["to"]["signature"] = _flip_b64(c["to"]["signature"], 9, 0x80)
            elif kind == "no_hashes":
                c["hashes"] = "nope"
            else:
                c["to"]["origin"] = "olu/someone-else"
            add(f"consistency-{kind}", b)
    for i, e in enumerate(bundle.get("erasures") or []):
        if e.get("commitments"):
            for kind in ("drop", "repeat", "flip", "upper"):
                b = copy.deepcopy(bundle)
                cs = b["erasures"][i]["commitments"]
                if kind == "drop":
                    cs.pop()
                elif kind == "repeat":
                    cs[-1] = cs[0]
                elif kind == "flip":
                    cs[0] = ("1" if cs[0][0] != "1" else "2") + cs[0][1:]
                else:
                    cs[0] = cs[0].upper()
                add(f"erasure{i}-{kind}", b)
    return out


def synthetic_vectors(seed: int = 24) -> list[dict]:
    """Vectors built here: a valid bundle with a key rotation, erasures and a consistency proof, its
    variants with fewer or odd trusted keys, a rewritten history, malformed bundles, and tampered copies."""
    rng = random.Random(seed)
    log, served, consistency = build_log()
    bundle = {"receipts": served[:-2], "consistency": consistency,
              "erasures": [{"receipt": served[-2], "commitments": _commitments(17, 3)},
                           {"receipt": served[-1], "commitments": None}]}
    out = [{"name": "valid", "bundle": json.dumps(bundle), "keys": json.dumps(TRUSTED)},
           {"name": "valid-keys-answer", "bundle": json.dumps(bundle, indent=2), "keys": json.dumps({"keys": TRUSTED})},
           {"name": "valid-ascii", "bundle": json.dumps(bundle, ensure_ascii=True), "keys": json.dumps(TRUSTED)}]
    only_new = [k for k in TRUSTED if k["key_id"] == NEW.key_id]
    odd_keys = [
        ("only-new-key", only_new),
        ("no-keys", []),
        ("keys-not-a-list", "nope"),
        ("junk-keys", [None, 3, "x", {"public_key": "!!"}, {"alg": "RSA", **TRUSTED[0]}] + TRUSTED),
        ("wrong-key-id", [dict(k, key_id="ffffffffffffffff") for k in TRUSTED]),
        ("no-key-id", [{k: v for k, v in e.items() if k != "key_id"} for e in TRUSTED]),
        ("bad-window", [dict(k, not_before="not a time") for k in TRUSTED]),
        ("narrow-window", [dict(k, not_after="2026-03-01T00:00:03Z") for k in TRUSTED]),
        ("naive-window", [dict(k, not_before="2026-03-01T00:00:02.5", not_after=None) for k in TRUSTED]),
    ]
    for label, keys in odd_keys:
        out.append({"name": label, "bundle": json.dumps(bundle), "keys": json.dumps(keys)})
    # a rewritten history: leaf 4 replaced; the new checkpoint is validly signed but cannot extend the old one
    forked, size = MerkleLog(InMemoryNodeStore()), 0
    for i in range(19):
        r = (RING_OLD if i < 5 else RING).sign_receipt(_receipt(i) if i != 4 else dict(_receipt(4), epoch=9))
        size = forked.append(receipt_leaf_bytes(r), size)
    cp_new = make_checkpoint(ORIGIN, 19, forked.root(19), "2026-08-02T00:00:00Z", RING)
    out.append({"name": "forked-history", "keys": json.dumps(TRUSTED), "bundle": json.dumps({"consistency": {
        "from": consistency["from"], "to": cp_new,
        "hashes": [base64.b64encode(h).decode() for h in forked.consistency_proof(13, 19)]}})})
    # consistency edge sizes: a power of two, equal sizes, from an empty tree
    for m, n in ((8, 19), (13, 13), (1, 2), (16, 19)):
        a = make_checkpoint(ORIGIN, m, log.root(m), "2026-08-01T00:00:00Z", RING)
        b = make_checkpoint(ORIGIN, n, log.root(n), "2026-08-01T00:00:00Z", RING)
        out.append({"name": f"consistency-{m}-{n}", "keys": json.dumps(TRUSTED), "bundle": json.dumps({"consistency": {
            "from": a, "to": b, "hashes": [base64.b64encode(h).decode() for h in log.consistency_proof(m, n)]}})})
    # a receipt claiming another log index; another tenant's checkpoint; a liar at position 0
    b = copy.deepcopy(bundle)
    b["receipts"][2]["proof"] = copy.deepcopy(served[3]["proof"])
    out.append({"name": "other-leaf-proof", "bundle": json.dumps(b), "keys": json.dumps(TRUSTED)})
    b = copy.deepcopy(bundle)
    b["receipts"][2]["proof"]["checkpoint"] = make_checkpoint("olu/other-tenant", 13, log.root(13),
                                                              "2026-08-01T00:00:00Z", RING)
    out.append({"name": "other-origin", "bundle": json.dumps(b), "keys": json.dumps(TRUSTED)})
    # a receipt claiming log index 1 at position 0: its audit path is valid, its claim is not
    liar_log, size = MerkleLog(InMemoryNodeStore()), 0
    liar = RING.sign_receipt(dict(_receipt(5), log_index=1))
    honest = RING.sign_receipt(dict(_receipt(6), log_index=1))
    for r in (liar, honest):
        size = liar_log.append(receipt_leaf_bytes(r), size)
    cp = make_checkpoint(ORIGIN, 2, liar_log.root(2), "2026-08-01T00:00:00Z", RING)
    out.append({"name": "log-index-liar", "keys": json.dumps(TRUSTED), "bundle": json.dumps(
        {"receipts": [dict(liar, proof=receipt_proof(liar_log, 0, cp)),
                      dict(honest, proof=receipt_proof(liar_log, 1, cp))]})})
    r = RING_OLD.sign_receipt(dict(_receipt(0), issued_at="2026-07-01T00:00:00Z"))
    out.append({"name": "retired-key-late", "keys": json.dumps(TRUSTED),
                "bundle": json.dumps({"receipts": [dict(r, proof=served[0]["proof"])]})})
    # discrete Gaussian mechanism fields
    good = {"type": "discrete_gaussian", "sigma": 2.0, "sensitivity": 0.5, "rho": 0.5 ** 2 / (2 * 2.0 ** 2),
            "grid": 2.0 ** -20, "rounding": "nearest_even"}
    for j, mech in enumerate([good, {**good, "grid": 0.3}, {**good, "grid": 0.0}, {**good, "rho": 0.5},
                              {**good, "rho": good["rho"] * 0.99}, {**good, "rounding": "floor"},
                              {k: v for k, v in good.items() if k != "grid"}, {**good, "grid": 5e-324},
                              {**good, "grid": 1024}, {**good, "sigma": True}, {**good, "grid": -0.5}]):
        r = RING.sign_receipt({**_receipt(5), "mechanism": mech})
        out.append({"name": f"mechanism-{j}", "keys": json.dumps(TRUSTED), "bundle": json.dumps({"receipts": [r]})})
    # erasure terms
    for j, change in enumerate([{"mechanism": {"type": "exact", "sigma": 0.0, "sensitivity": 0, "rho": 1e-9}},
                                {"guarantee": {"definition": "exact", "epsilon": 0, "delta": 1e-6}},
                                {"records": {"erased": 99, "commitments_sha256": "0" * 64}},
                                {"records": {"erased": True, "commitments_sha256": "0" * 64}},
                                {"records_forgotten_before": 50}, {"model_id": None}, {"kind": "certificate"}]):
        r = RING.sign_receipt({**_erasure(30, _commitments(30, 2)), **change})
        out.append({"name": f"erasure-terms-{j}", "keys": json.dumps(TRUSTED),
                    "bundle": json.dumps({"erasures": [{"receipt": r, "commitments": _commitments(30, 2)}]})})
    out.append({"name": "erasure-entry-bad", "keys": json.dumps(TRUSTED),
                "bundle": json.dumps({"erasures": [{"commitments": []}, "x"]})})
    # malformed bundles
    for j, text in enumerate(['{}', '{"receipts": []}', '{"receipts": "x"}', '[]', '{"receipts": [{}]}',
                              '{"receipts": [{"signature": 1}]}', '{"consistency": {}}', '{"erasures": 3}',
                              '{"receipts": [null, 1, "[1,2]", "{\\"a\\": 1, \\"a\\": 2}"]}',
                              '{"receipts": [{"signature": "x", "n": 9007199254740993}]}']):
        out.append({"name": f"malformed-{j}", "bundle": text, "keys": json.dumps(TRUSTED)})
    # tampered copies of a smaller bundle (one receipt of each mechanism, with and without a retired key)
    small = dict(bundle, receipts=[served[i] for i in (0, 1, 2, 6, 7, 8)], erasures=bundle["erasures"][:1])
    out += tamper_variants("synthetic", small, TRUSTED, rng, count=120)
    return out


def python_report(vector: dict) -> list[list[Any]]:
    """The Python verifier's checks for a vector, as [check, ok, detail] lists."""
    report = verify_bundle(_strict_loads(vector["bundle"]), _strict_loads(vector["keys"]))
    return [[c.check, c.ok, c.detail] for c in report.checks]
