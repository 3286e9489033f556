"""Signed checkpoints and the offline bundle verifier: a valid bundle passes every check, and any tampering
with a receipt, a proof hash or a checkpoint field is detected."""
from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from app.receipts.canonical import canonical_json, receipt_leaf_bytes
from app.receipts.checkpoint import (checkpoint_body, checkpoint_note, make_checkpoint, receipt_proof,
                                     verify_checkpoint)
from app.receipts.keys import KeyRing, SigningKey, b64decode_strict
from app.receipts.merkle import InMemoryNodeStore, MerkleLog
from app.receipts.verify import main, verify_bundle

TENANT = "t-42"
ORIGIN = f"olu/{TENANT}"
OLD = SigningKey.from_seed(bytes(range(32)))
NEW = SigningKey.from_seed(bytes(range(1, 33)))
RING_OLD = KeyRing(OLD, active_not_before="2026-01-01T00:00:00Z")
# after rotation on 2026-06-01: NEW active, OLD retired
from app.receipts.keys import PublicKeyEntry  # noqa: E402

RING = KeyRing(NEW, active_not_before="2026-06-01T00:00:00Z",
               retired=[PublicKeyEntry(OLD.key_id, OLD.public_key_raw, "2026-01-01T00:00:00Z",
                                       "2026-06-01T00:00:00Z")])
TRUSTED = RING.public_keys()


def _receipt(i: int) -> dict:
    return {
        "id": f"rcpt-{i}", "tenant_id": TENANT, "model_id": "m-1",
        "record_commitment": hashlib.sha256(f"rec{i}".encode()).hexdigest(),
        "learned_step": 3 * i, "forgotten_step": 3 * i + 2, "epoch": 0, "algorithm": "passive_olu",
        "mechanism": {"type": "gaussian", "sigma": 0.123456789 * (i + 1), "sensitivity": 1e-7, "rho": 0.1},
        "guarantee": {"definition": "renyi", "alpha": 2.0, "epsilon": 1.0, "delta": 1e-6, "conversion": "CKS20"},
        "ledger_after": {"rho_spent": 0.1 * (i + 1), "epsilon": 1.5, "delta": 1e-6, "capacity_left": None},
        "published_parameters_sha256": hashlib.sha256(bytes([i])).hexdigest(),
        "model_version": i + 1, "note": "unicode ✓ é \u2028",
        # receipts 0..4 were issued before the rotation (signed by OLD), the rest after (signed by NEW)
        "issued_at": f"2026-0{3 if i < 5 else 8}-01T00:00:{i:02d}Z", "log_index": i,
    }


def _build(n: int = 13, extra: int = 6):
    store = InMemoryNodeStore()
    log = MerkleLog(store)
    receipts, size = [], 0
    for i in range(n + extra):
        ring = RING_OLD if i < 5 else RING
        r = ring.sign_receipt(_receipt(i))
        size = log.append(receipt_leaf_bytes(r), size)
        receipts.append(r)
    cp_old = make_checkpoint(ORIGIN, n, log.root(n), "2026-08-01T00:00:00Z", RING)
    cp_new = make_checkpoint(ORIGIN, n + extra, log.root(n + extra), "2026-08-02T00:00:00Z", RING)
    served = [dict(r, proof=receipt_proof(log, i, cp_old)) for i, r in enumerate(receipts[:n])]
    consistency = {"from": cp_old, "to": cp_new,
                   "hashes": [base64.b64encode(h).decode() for h in log.consistency_proof(n, n + extra)]}
    return log, served, consistency


LOG, RECEIPTS, CONSISTENCY = _build()


def _bundle(**kw):
    b = {"receipts": json.loads(json.dumps(RECEIPTS)), "consistency": json.loads(json.dumps(CONSISTENCY))}
    b.update(kw)
    return b


def _failed(report) -> set[str]:
    return {c.check for c in report.checks if not c.ok}


def _flip_b64(text: str, pos: int, mask: int) -> str:
    raw = bytearray(b64decode_strict(text))
    raw[pos % len(raw)] ^= mask
    return base64.b64encode(bytes(raw)).decode()


def test_valid_bundle_passes_every_check():
    report = verify_bundle(_bundle(), TRUSTED)
    assert report.ok, str(report)
    names = {c.check for c in report.checks}
    for i in range(len(RECEIPTS)):
        for c in ("canonical", "key", "signature", "checkpoint", "inclusion"):
            assert f"receipt[{i}].{c}" in names
    assert {"consistency.from_checkpoint", "consistency.to_checkpoint", "consistency.proof"} <= names
    assert all(isinstance(c, tuple) and len(c) == 3 for c in report.checks)
    assert "VERIFIED" in str(report)
    # a /v1/keys answer is accepted as the trust list too
    assert verify_bundle(_bundle(), {"keys": TRUSTED}).ok


def test_receipt_given_as_text_and_strict_parsing():
    text = json.dumps(RECEIPTS[3], indent=2, ensure_ascii=True)  # any formatting of the same JSON
    assert verify_bundle({"receipts": [text]}, TRUSTED).ok
    dup = text.replace('"epoch": 0,', '"epoch": 0, "epoch": 1,')
    assert dup != text
    assert "receipt[0].canonical" in _failed(verify_bundle({"receipts": [dup]}, TRUSTED))
    nan = text.replace('"epoch": 0', '"epoch": NaN')
    assert "receipt[0].canonical" in _failed(verify_bundle({"receipts": [nan]}, TRUSTED))


@given(st.integers(0, len(RECEIPTS) - 1), st.integers(0, 10**6), st.integers(1, 255))
def test_any_byte_flip_of_a_receipt_is_detected(which, pos, mask):
    r = RECEIPTS[which]
    body = canonical_json({k: v for k, v in r.items() if k != "proof"})
    b = bytearray(body)
    b[pos % len(b)] ^= mask
    try:
        tampered = json.loads(bytes(b).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        tampered = None
    if not isinstance(tampered, dict):
        # not a JSON object any more: the verifier must refuse it as a receipt
        report = verify_bundle({"receipts": [bytes(b)]}, TRUSTED)  # raw bytes, as received
        assert not report.ok
        assert "receipt[0].canonical" in _failed(report)
        return
    try:
        same = canonical_json(tampered) == body
    except ValueError:
        same = False
    assume(not same)  # e.g. "1e-7" -> "1E-7" is the same JSON value, so the same receipt
    tampered["proof"] = r["proof"]
    report = verify_bundle({"receipts": [tampered]}, TRUSTED)
    assert not report.ok
    failed = _failed(report)
    # the leaf covers the whole receipt (signature included), so inclusion always fails;
    # the signature fails unless canonicalisation itself failed first
    assert "receipt[0].canonical" in failed or {"receipt[0].inclusion", "receipt[0].signature"} <= failed


@given(st.integers(0, len(RECEIPTS) - 1), st.data())
def test_any_proof_hash_flip_is_detected(which, data):
    bundle = _bundle()
    hashes = bundle["receipts"][which]["proof"]["hashes"]
    j = data.draw(st.integers(0, len(hashes) - 1))
    hashes[j] = _flip_b64(hashes[j], data.draw(st.integers(0, 31)), data.draw(st.integers(1, 255)))
    report = verify_bundle(bundle, TRUSTED)
    assert _failed(report) == {f"receipt[{which}].inclusion"}


@given(st.integers(0, len(RECEIPTS) - 1),
       st.sampled_from(["root_hash", "signature", "tree_size", "origin", "timestamp", "key_id"]),
       st.integers(0, 63), st.integers(1, 255))
def test_any_checkpoint_tampering_is_detected(which, field, pos, mask):
    bundle = _bundle()
    cp = bundle["receipts"][which]["proof"]["checkpoint"]
    if field in ("root_hash", "signature"):
        cp[field] = _flip_b64(cp[field], pos, mask)
    elif field == "tree_size":
        cp[field] = cp[field] + (pos % 7) + 1
    elif field == "key_id":
        cp[field] = OLD.key_id if mask % 2 else "0123456789abcdef"
    else:
        s = bytearray(cp[field].encode())
        s[pos % len(s)] ^= mask
        t = bytes(s).decode("utf-8", "replace")
        assume(t != cp[field])
        cp[field] = t
    report = verify_bundle(bundle, TRUSTED)
    failed = _failed(report)
    assert f"receipt[{which}].checkpoint" in failed
    if field in ("root_hash", "tree_size"):
        assert f"receipt[{which}].inclusion" in failed
    assert not verify_checkpoint(cp, TRUSTED)


def test_checkpoint_signing_and_note_format():
    cp = CONSISTENCY["to"]
    assert verify_checkpoint(cp, TRUSTED)
    assert not verify_checkpoint(cp, [k for k in TRUSTED if k["key_id"] != NEW.key_id])
    body = checkpoint_body(cp["origin"], cp["tree_size"], cp["root_hash"], cp["timestamp"])
    assert body == f"{ORIGIN}\n19\n{cp['root_hash']}\n2026-08-02T00:00:00Z\n".encode()
    note = checkpoint_note(cp, NEW.public_key_b64)
    head, sig_line = note.split("\n\n")
    assert (head + "\n").encode() == body
    assert sig_line.startswith(f"\u2014 {ORIGIN} ") and sig_line.endswith("\n")
    blob = base64.b64decode(sig_line.split(" ")[-1])
    assert blob[:4] == hashlib.sha256(ORIGIN.encode() + b"\n\x01" + NEW.public_key_raw).digest()[:4]
    assert NEW.verify(body, base64.b64encode(blob[4:]).decode())
    for bad in ("a\nb", ""):
        with pytest.raises(ValueError):
            make_checkpoint(bad, 1, b"\0" * 32, "2026-01-01T00:00:00Z", RING)
    with pytest.raises(ValueError):
        make_checkpoint(ORIGIN, -1, b"\0" * 32, "2026-01-01T00:00:00Z", RING)
    # a checkpoint signed by the retired key after its retirement is refused
    late = make_checkpoint(ORIGIN, 1, b"\0" * 32, "2026-09-01T00:00:00Z", RING_OLD)
    early = make_checkpoint(ORIGIN, 1, b"\0" * 32, "2026-05-01T00:00:00Z", RING_OLD)
    assert verify_checkpoint(early, TRUSTED) and not verify_checkpoint(late, TRUSTED)


def test_retired_key_receipts_verify_and_key_checks():
    assert RECEIPTS[0]["key_id"] == OLD.key_id and RECEIPTS[7]["key_id"] == NEW.key_id
    assert verify_bundle({"receipts": RECEIPTS[:1]}, TRUSTED).ok
    only_new = [k for k in TRUSTED if k["key_id"] == NEW.key_id]
    failed = _failed(verify_bundle({"receipts": RECEIPTS[:1]}, only_new))
    assert failed == {"receipt[0].key", "receipt[0].signature"}              # unknown key id
    # an old-key receipt claiming to be issued after the key was retired
    r = RING_OLD.sign_receipt(dict(_receipt(0), issued_at="2026-07-01T00:00:00Z"))
    failed = _failed(verify_bundle({"receipts": [dict(r, proof=RECEIPTS[0]["proof"])]}, TRUSTED))
    assert "receipt[0].key" in failed and "receipt[0].signature" not in failed


def test_origin_and_log_index_binding():
    b = _bundle()
    b["receipts"][2]["proof"]["checkpoint"] = make_checkpoint(
        "olu/other-tenant", 13, LOG.root(13), "2026-08-01T00:00:00Z", RING)
    assert _failed(verify_bundle(b, TRUSTED)) == {"receipt[2].checkpoint"}
    assert verify_bundle(b, TRUSTED, expected_origin="olu/other-tenant").ok is False
    # a valid proof for another leaf does not prove this receipt
    b = _bundle()
    b["receipts"][2]["proof"] = json.loads(json.dumps(RECEIPTS[3]["proof"]))
    assert _failed(verify_bundle(b, TRUSTED)) == {"receipt[2].inclusion"}
    b["receipts"][2]["proof"]["leaf_index"] = 2
    assert _failed(verify_bundle(b, TRUSTED)) == {"receipt[2].inclusion"}


@given(st.sampled_from(["hash", "swap", "from_root", "to_size", "to_sig"]), st.integers(0, 31), st.integers(1, 255))
def test_consistency_tampering_is_detected(kind, pos, mask):
    b = _bundle()
    c = b["consistency"]
    if kind == "hash":
        j = pos % len(c["hashes"])
        c["hashes"][j] = _flip_b64(c["hashes"][j], pos, mask)
    elif kind == "swap":
        c["from"], c["to"] = c["to"], c["from"]
    elif kind == "from_root":
        c["from"]["root_hash"] = _flip_b64(c["from"]["root_hash"], pos, mask)
    elif kind == "to_size":
        c["to"]["tree_size"] += 1 + pos
    else:
        c["to"]["signature"] = _flip_b64(c["to"]["signature"], pos, mask)
    report = verify_bundle(b, TRUSTED)
    assert not report.ok
    assert {n for n in _failed(report)} <= {"consistency.proof", "consistency.from_checkpoint",
                                            "consistency.to_checkpoint"}


def test_consistency_detects_rewritten_history():
    # a log whose leaf 4 was replaced: the new checkpoint is validly signed, but cannot extend the old one
    store = InMemoryNodeStore()
    forked, size = MerkleLog(store), 0
    for i in range(19):
        r = (RING_OLD if i < 5 else RING).sign_receipt(_receipt(i) if i != 4 else dict(_receipt(4), epoch=9))
        size = forked.append(receipt_leaf_bytes(r), size)
    cp_new = make_checkpoint(ORIGIN, 19, forked.root(19), "2026-08-02T00:00:00Z", RING)
    hashes = [base64.b64encode(h).decode() for h in forked.consistency_proof(13, 19)]
    report = verify_bundle({"consistency": {"from": CONSISTENCY["from"], "to": cp_new, "hashes": hashes}}, TRUSTED)
    assert _failed(report) == {"consistency.proof"}


def test_empty_or_malformed_bundles_fail():
    for b in ({}, {"receipts": []}, {"receipts": "x"}, [], {"receipts": [{}]}, {"receipts": [{"signature": 1}]},
              {"consistency": {}}):
        assert not verify_bundle(b, TRUSTED).ok
    r = dict(RECEIPTS[0])
    del r["proof"]
    assert _failed(verify_bundle({"receipts": [r]}, TRUSTED)) == {"receipt[0].checkpoint", "receipt[0].inclusion"}


def test_verifier_imports_no_service_code():
    code = ("import sys, app.receipts.verify as v; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'fastapi','starlette','sqlalchemy','numpy','pydantic','app.db','scipy'} "
            "or m.startswith(('app.db','app.api','app.services','app.unlearning'))); print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "[]"


def test_cli(tmp_path, capsys):
    (tmp_path / "b.json").write_text(json.dumps(_bundle()))
    (tmp_path / "k.json").write_text(json.dumps({"keys": TRUSTED}))
    assert main([str(tmp_path / "b.json"), str(tmp_path / "k.json")]) == 0
    assert capsys.readouterr().out.rstrip().endswith("VERIFIED")
    bad = _bundle()
    bad["receipts"][0]["model_version"] = 99
    (tmp_path / "b.json").write_text(json.dumps(bad))
    assert main([str(tmp_path / "b.json"), str(tmp_path / "k.json")]) == 1
    assert "FAIL  receipt[0].signature" in capsys.readouterr().out


def test_receipt_log_index_must_match_its_position():
    # the receipt claims log index 1 but sits at position 0: the audit path is valid, the claim is not
    log, size = MerkleLog(InMemoryNodeStore()), 0
    liar = RING.sign_receipt(dict(_receipt(5), log_index=1))
    honest = RING.sign_receipt(dict(_receipt(6), log_index=1))
    for r in (liar, honest):
        size = log.append(receipt_leaf_bytes(r), size)
    cp = make_checkpoint(ORIGIN, 2, log.root(2), "2026-08-01T00:00:00Z", RING)
    ok = verify_bundle({"receipts": [dict(honest, proof=receipt_proof(log, 1, cp))]}, TRUSTED)
    assert ok.ok, str(ok)
    bad = verify_bundle({"receipts": [dict(liar, proof=receipt_proof(log, 0, cp))]}, TRUSTED)
    assert _failed(bad) == {"receipt[0].inclusion"}
    assert "log_index" in [c.detail for c in bad.checks if not c.ok][0]


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 2**60) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
    max_leaves=8)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@given(st.data(), _json)
def test_garbage_anywhere_never_raises_and_never_verifies(data, junk):
    bundle = _bundle(receipts=[json.loads(json.dumps(RECEIPTS[1]))])
    paths = [p for p in _paths(bundle) if p]
    path = data.draw(st.sampled_from(paths))
    parent = bundle
    for k in path[:-1]:
        parent = parent[k]
    assume(parent[path[-1]] != junk)
    parent[path[-1]] = junk
    keys = data.draw(st.sampled_from([TRUSTED, TRUSTED + [junk], [junk], junk]))
    report = verify_bundle(bundle, keys)  # must not raise
    if keys is TRUSTED and len(path) >= 2 and path[0] == "receipts":
        assert not report.ok, (path, junk)  # any change inside a receipt or its proof is refused
    if keys is TRUSTED and len(path) >= 2 and path[0] == "consistency":
        assert not report.ok, (path, junk)


def test_discrete_mechanism_field_is_checked():
    """Issue 14: receipts of the discrete Gaussian name their grid; the verifier checks it and the stated rho."""
    from app.receipts.verify import VerificationReport, verify_receipt

    good = {"type": "discrete_gaussian", "sigma": 2.0, "sensitivity": 0.5, "rho": 0.5**2 / (2 * 2.0**2),
            "grid": 2.0**-20, "rounding": "nearest_even"}
    cases = [(good, True), ({**good, "grid": 0.3}, False), ({**good, "grid": 0.0}, False),
             ({**good, "rho": 0.5}, True), ({**good, "rho": good["rho"] * 0.99}, False),
             ({**good, "rounding": "floor"}, False),
             ({k: v for k, v in good.items() if k != "grid"}, False)]
    for mech, ok in cases:
        report = VerificationReport()
        verify_receipt(RING.sign_receipt({**_receipt(5), "mechanism": mech}), TRUSTED, report)
        checks = {c.check: c.ok for c in report.checks}
        assert checks["receipt.mechanism"] is ok, mech
        assert checks["receipt.signature"]
    # legacy continuous receipts carry no grid and are not subject to the check
    report = VerificationReport()
    verify_receipt(RECEIPTS[5], TRUSTED, report)
    assert "receipt.mechanism" not in {c.check for c in report.checks}
