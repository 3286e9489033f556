"""Offline verifier for receipt bundles.  No service dependency: only ``hashlib``, ``json``, ``cryptography``
and ``rfc8785`` (through the sibling modules ``canonical``, ``keys``, ``merkle`` and ``checkpoint``).

Bundle format (JSON)::

    {
      "receipts": [                      # receipt objects as served by GET /v1/receipts/{id}
        {... receipt members ..., "key_id": "...", "signature": "<base64>",
         "proof": {"leaf_index": 7, "tree_size": 12, "hashes": ["<base64>", ...],   # leaf to root
                   "checkpoint": {origin, tree_size, root_hash, timestamp, key_id, signature}}}
      ],
      "erasures": [                      # optional: erasure receipts of deleted models
        {"receipt": {... kind "model_erasure" ..., "proof": {...}},
         "commitments": ["<64 hex>", ...] | null}                                   # the erased records' commitments
      ],
      "consistency": {                   # optional: proves the log only grew between two checkpoints
        "from": {checkpoint}, "to": {checkpoint}, "hashes": ["<base64>", ...]
      }
    }

A receipt may also be given as its JSON *text*; the text is then parsed strictly (duplicate member names,
NaN/Infinity rejected).

What is checked, per receipt ``i`` (check names ``receipt[i].<check>``):

* ``canonical``: the receipt has an RFC 8785 canonical form, and re-serialising the parsed canonical form
  gives the same bytes (so every verifier derives the same signed bytes and leaf from this receipt).
* ``mechanism`` (receipts of the ``discrete_gaussian`` mechanism only): the grid is a positive power of two, the
  rounding is named (``nearest_even``) and rho >= sensitivity^2 / (2 sigma^2) (app/unlearning/mechanism/release.py).
* ``key``: ``key_id`` is a trusted key and, if the receipt has ``issued_at``, the key was valid then.
* ``signature``: Ed25519 over the canonical JSON without ``signature`` and ``proof``.
* ``checkpoint``: the checkpoint is signed by a trusted key valid at its timestamp and has the expected origin
  (``expected_origin``, else ``olu/<tenant_id>`` when the receipt names a tenant).
* ``inclusion``: leaf = ``SHA-256(0x00 || canonical JSON with signature, without proof)``;
  ``proof.leaf_index`` equals the receipt's ``log_index``; ``proof.tree_size`` equals the checkpoint's; the
  audit path leads to the checkpoint's root (RFC 9162 §2.1.3.2).

For a receipt whose ``kind`` is ``model_erasure`` (a deleted model), also ``erasure``: the terms of an exact
forget (mechanism ``exact`` with sigma = sensitivity = rho = 0, guarantee ``exact`` with epsilon = delta = 0), a
non-negative ``records.erased`` no larger than ``records_learned - records_forgotten_before``, and a 64-hex
``records.commitments_sha256``.  For each entry ``erasures[i]`` (checks ``erasure[i].*``) the same checks as a
receipt, and, when ``commitments`` is given, ``records``: they are distinct 64-hex commitments, their number is
``records.erased`` and ``erased_records_sha256`` of them (SHA-256 over the sorted 32-byte commitments,
concatenated) is ``records.commitments_sha256``.

And for ``consistency``: both checkpoints verify, share the origin, and the proof verifies (RFC 9162 §2.1.4.2).

Usage: ``python -m app.receipts.verify bundle.json keys.json`` (keys.json = the ``GET /v1/keys`` answer or a
list of its entries); exit status 0 iff every check passed.
"""
from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .canonical import (CanonicalJSONError, canonical_json, erased_records_sha256, receipt_leaf_bytes,
                        receipt_signing_bytes)
from .checkpoint import checkpoint_problems, tenant_origin
from .keys import PublicKeyEntry, b64decode_strict, parse_utc, verify_with_public_keys
from .merkle import HASH_SIZE, leaf_hash, verify_consistency, verify_inclusion

__all__ = ["Check", "VerificationReport", "verify_bundle", "verify_receipt", "main"]


class Check(NamedTuple):
    check: str
    ok: bool
    detail: str


@dataclass
class VerificationReport:
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True iff there was at least one check and all passed."""
        return bool(self.checks) and all(c.ok for c in self.checks)

    def add(self, check: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(check, bool(ok), detail))
        return bool(ok)

    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def __str__(self) -> str:
        lines = [f"{'PASS' if c.ok else 'FAIL'}  {c.check}: {c.detail}" for c in self.checks]
        lines.append("VERIFIED" if self.ok else "NOT VERIFIED")
        return "\n".join(lines)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _pairs_no_dupes(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate member {k!r}")
        out[k] = v
    return out


def _strict_loads(text: str | bytes) -> Any:
    return json.loads(text, object_pairs_hook=_pairs_no_dupes, parse_constant=_reject_constant)


def _decode_hashes(hashes: Any) -> list[bytes]:
    if not isinstance(hashes, list):
        raise ValueError("hashes must be a list")
    out = [b64decode_strict(h) for h in hashes]
    if any(len(h) != HASH_SIZE for h in out):
        raise ValueError("every hash must be 32 bytes")
    return out


def _key_id_of(entry: Any) -> Any:
    if isinstance(entry, PublicKeyEntry):
        return entry.key_id
    return entry.get("key_id") if isinstance(entry, Mapping) else None


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _discrete_mechanism_problem(mech: Mapping[str, Any]) -> str | None:
    """What is wrong with a discrete_gaussian mechanism field (app/unlearning/mechanism/release.py), or None: the grid is a
    positive power of two, the rounding is named, and the stated rho covers sensitivity^2 / (2 sigma^2) (CKS20 Thm 14)."""
    grid, sigma, sens, rho = (mech.get(k) for k in ("grid", "sigma", "sensitivity", "rho"))
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
               for v in (grid, sigma, sens, rho)):
        return "grid, sigma, sensitivity and rho must be finite numbers"
    if not (grid > 0 and math.frexp(grid)[0] == 0.5):
        return f"grid {grid!r} is not a positive power of two"
    if mech.get("rounding") != "nearest_even":
        return f"unknown rounding {mech.get('rounding')!r}"
    # the charge must cover the mechanism: rho >= sensitivity^2 / (2 sigma^2) (sigma is rounded up for the sampler,
    # so the stated rho may exceed it by a few parts in 10^9)
    if not (sigma > 0 and sens >= 0 and rho >= sens * sens / (2.0 * sigma * sigma) * (1.0 - 1e-12)):
        return "rho is below sensitivity^2 / (2 sigma^2)"
    return None


def verify_receipt(receipt: Any, trusted_public_keys: Sequence[Mapping[str, Any] | PublicKeyEntry],
                   report: VerificationReport, name: str = "receipt",
                   expected_origin: str | None = None) -> None:
    """Append the checks of one receipt (with its ``proof``) to ``report``."""
    # canonical form
    try:
        if isinstance(receipt, (str, bytes)):
            receipt = _strict_loads(receipt)
        if not isinstance(receipt, Mapping):
            raise ValueError("receipt is not a JSON object")
        body = {k: v for k, v in receipt.items() if k != "proof"}
        canon = canonical_json(body)
        if canonical_json(_strict_loads(canon)) != canon:
            raise ValueError("canonical form is not stable under re-serialisation")
        signed = receipt_signing_bytes(receipt)
        leaf = receipt_leaf_bytes(receipt)
    except (CanonicalJSONError, ValueError) as exc:
        report.add(f"{name}.canonical", False, str(exc))
        return
    report.add(f"{name}.canonical", True, f"{len(signed)} signed bytes")
    if receipt.get("kind") == ERASURE:
        problems = erasure_problems(receipt)
        report.add(f"{name}.erasure", not problems, "; ".join(problems) or
                   f"exact erasure of {receipt['records']['erased']} records of model {receipt.get('model_id')}")
    mech = receipt.get("mechanism")
    if isinstance(mech, Mapping) and mech.get("type") == "discrete_gaussian":
        problem = _discrete_mechanism_problem(mech)
        report.add(f"{name}.mechanism", problem is None, problem or f"discrete_gaussian on grid {mech['grid']!r}")

    # key and signature
    key_id, sig, issued = receipt.get("key_id"), receipt.get("signature"), receipt.get("issued_at")
    known = [e for e in trusted_public_keys if _key_id_of(e) == key_id]
    if not isinstance(key_id, str) or not known:
        report.add(f"{name}.key", False, f"key_id {key_id!r} is not a trusted key")
        report.add(f"{name}.signature", False, "no trusted key to verify with")
    else:
        at = None
        if isinstance(issued, str):
            try:
                parse_utc(issued)
                at = issued
            except ValueError:
                pass
        # validity window: verify with the time first, then without, to tell the two failures apart
        in_window = verify_with_public_keys(known, key_id, signed, sig, at=at) if isinstance(sig, str) else False
        sig_ok = verify_with_public_keys(known, key_id, signed, sig) if isinstance(sig, str) else False
        report.add(f"{name}.key", in_window or not sig_ok,
                   f"trusted key {key_id}" + ("" if in_window or not sig_ok else f" not valid at {issued}"))
        report.add(f"{name}.signature", sig_ok, "Ed25519 signature valid" if sig_ok else "bad signature")

    # checkpoint
    proof = receipt.get("proof")
    if not isinstance(proof, Mapping):
        report.add(f"{name}.checkpoint", False, "receipt has no proof")
        report.add(f"{name}.inclusion", False, "receipt has no proof")
        return
    cp = proof.get("checkpoint")
    problems = checkpoint_problems(cp, trusted_public_keys)
    origin = expected_origin
    if origin is None and isinstance(receipt.get("tenant_id"), str):
        origin = tenant_origin(receipt["tenant_id"])
    if not problems and origin is not None and cp["origin"] != origin:
        problems = [f"origin {cp['origin']!r} is not the expected {origin!r}"]
    report.add(f"{name}.checkpoint", not problems, "; ".join(problems) or f"signed by {cp['key_id']}")

    # inclusion
    try:
        idx, size = proof.get("leaf_index"), proof.get("tree_size")
        if not (_int(idx) and _int(size)):
            raise ValueError("leaf_index and tree_size must be integers")
        if "log_index" in receipt and receipt["log_index"] != idx:
            raise ValueError(f"proof.leaf_index {idx} != receipt log_index {receipt['log_index']!r}")
        if not isinstance(cp, Mapping) or cp.get("tree_size") != size:
            raise ValueError("proof.tree_size differs from the checkpoint's tree_size")
        root = b64decode_strict(cp.get("root_hash"))
        hashes = _decode_hashes(proof.get("hashes"))
        ok = verify_inclusion(leaf_hash(leaf), idx, size, hashes, root)
        report.add(f"{name}.inclusion", ok,
                   f"leaf {idx} in tree of size {size}" if ok else "audit path does not lead to the root")
    except (ValueError, TypeError) as exc:
        report.add(f"{name}.inclusion", False, str(exc))


ERASURE = "model_erasure"
_HEX = frozenset("0123456789abcdef")


def _hex64(v: Any) -> bool:
    return isinstance(v, str) and len(v) == 64 and set(v) <= _HEX


def _zero(v: Any) -> bool:
    return (_int(v) or isinstance(v, float)) and v == 0


def erasure_problems(receipt: Mapping[str, Any]) -> list[str]:
    """Why an erasure receipt's terms are not those of an exact erasure (empty list = they are)."""
    out = []
    mech, guarantee, records = receipt.get("mechanism"), receipt.get("guarantee"), receipt.get("records")
    if not (isinstance(mech, Mapping) and mech.get("type") == "exact"
            and all(_zero(mech.get(k)) for k in ("sigma", "sensitivity", "rho"))):
        out.append("mechanism is not exact with sigma = sensitivity = rho = 0")
    if not (isinstance(guarantee, Mapping) and guarantee.get("definition") == "exact"
            and _zero(guarantee.get("epsilon")) and _zero(guarantee.get("delta"))):
        out.append("guarantee is not exact with epsilon = delta = 0")
    if not (isinstance(records, Mapping) and _int(records.get("erased")) and records["erased"] >= 0
            and _hex64(records.get("commitments_sha256"))):
        out.append("records must give erased (an integer >= 0) and commitments_sha256 (64 hex digits)")
    else:
        learned, before = receipt.get("records_learned"), receipt.get("records_forgotten_before")
        if not (_int(learned) and _int(before) and 0 <= before <= learned):
            out.append("records_learned and records_forgotten_before must be integers, 0 <= forgotten <= learned")
        elif records["erased"] > learned - before:
            out.append(f"{records['erased']} records erased but only {learned - before} were held")
    if not isinstance(receipt.get("model_id"), str):
        out.append("the receipt names no model")
    return out


def _verify_erasure(entry: Any, keys: Sequence[Any], report: VerificationReport, name: str,
                    expected_origin: str | None) -> None:
    if not isinstance(entry, Mapping) or "receipt" not in entry:
        report.add(name, False, "an erasure entry is {receipt, commitments}")
        return
    receipt = entry["receipt"]
    if isinstance(receipt, (str, bytes)):
        try:
            receipt = _strict_loads(receipt)
        except ValueError:
            pass  # verify_receipt reports it
    if not (isinstance(receipt, Mapping) and receipt.get("kind") == ERASURE):
        report.add(f"{name}.erasure", False, f"the receipt's kind is not {ERASURE!r}")
    verify_receipt(receipt, keys, report, name, expected_origin)
    commits = entry.get("commitments")
    if commits is None or not isinstance(receipt, Mapping):
        return
    records = receipt.get("records") if isinstance(receipt.get("records"), Mapping) else {}
    if not (isinstance(commits, list) and all(_hex64(c) for c in commits)):
        report.add(f"{name}.records", False, "commitments must be a list of 64-hex strings")
    elif len(set(commits)) != len(commits):
        report.add(f"{name}.records", False, "commitments repeat")
    elif records.get("erased") != len(commits):
        report.add(f"{name}.records", False, f"{len(commits)} commitments, receipt says {records.get('erased')!r}")
    else:
        ok = erased_records_sha256(commits) == records.get("commitments_sha256")
        report.add(f"{name}.records", ok, f"{len(commits)} commitments hash to commitments_sha256" if ok else
                   "SHA-256 of the sorted commitments differs from the receipt's commitments_sha256")


def _verify_consistency(c: Any, keys: Sequence[Any], report: VerificationReport,
                        expected_origin: str | None) -> None:
    if not isinstance(c, Mapping):
        report.add("consistency", False, "consistency is not an object")
        return
    a, b = c.get("from"), c.get("to")
    for label, cp in (("from", a), ("to", b)):
        probs = checkpoint_problems(cp, keys)
        if not probs and expected_origin is not None and cp["origin"] != expected_origin:
            probs = [f"origin {cp['origin']!r} is not the expected {expected_origin!r}"]
        report.add(f"consistency.{label}_checkpoint", not probs, "; ".join(probs) or "signature valid")
    try:
        if not (isinstance(a, Mapping) and isinstance(b, Mapping)):
            raise ValueError("missing checkpoints")
        if a.get("origin") != b.get("origin"):
            raise ValueError("checkpoints are from different logs (origins differ)")
        m, n = a.get("tree_size"), b.get("tree_size")
        if not (_int(m) and _int(n)):
            raise ValueError("tree sizes must be integers")
        ok = verify_consistency(m, n, b64decode_strict(a.get("root_hash")), b64decode_strict(b.get("root_hash")),
                                _decode_hashes(c.get("hashes")))
        report.add("consistency.proof", ok, f"tree {n} extends tree {m}" if ok else "consistency proof invalid")
    except (ValueError, TypeError) as exc:
        report.add("consistency.proof", False, str(exc))


def verify_bundle(bundle: Mapping[str, Any], trusted_public_keys: Sequence[Mapping[str, Any] | PublicKeyEntry],
                  *, expected_origin: str | None = None) -> VerificationReport:
    """Verify every receipt and the optional consistency proof of ``bundle``; never raises on bad input."""
    report = VerificationReport()
    if isinstance(trusted_public_keys, Mapping):  # a GET /v1/keys answer
        trusted_public_keys = trusted_public_keys.get("keys", [])
    keys = list(trusted_public_keys) if isinstance(trusted_public_keys, (list, tuple)) else []
    if not isinstance(bundle, Mapping):
        report.add("bundle", False, "bundle is not an object")
        return report
    receipts, erasures = bundle.get("receipts", []), bundle.get("erasures", [])
    if not isinstance(erasures, list):
        report.add("bundle", False, "erasures is not a list")
        return report
    if not isinstance(receipts, list) or (not receipts and not erasures and "consistency" not in bundle):
        report.add("bundle", False, "bundle has no receipts and no consistency proof")
        return report
    for i, r in enumerate(receipts):
        verify_receipt(r, keys, report, f"receipt[{i}]", expected_origin)
    for i, e in enumerate(erasures):
        _verify_erasure(e, keys, report, f"erasure[{i}]", expected_origin)
    if "consistency" in bundle:
        _verify_consistency(bundle["consistency"], keys, report, expected_origin)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2:
        print("usage: python -m app.receipts.verify BUNDLE.json KEYS.json", file=sys.stderr)
        return 2
    with open(argv[0], "rb") as f:
        bundle = _strict_loads(f.read())
    with open(argv[1], "rb") as f:
        keys = _strict_loads(f.read())
    report = verify_bundle(bundle, keys)
    print(report)
    return 0 if report.ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
