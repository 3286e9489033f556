"""RFC 6962 Merkle log: store-backed trees against an independent recursive reference, published vectors,
negative cases for the store-free verifiers, and the O(log n) read bound."""
from __future__ import annotations

import hashlib
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.receipts.merkle import (EMPTY_ROOT, InMemoryNodeStore, MerkleError, MerkleLog, leaf_hash, node_hash,
                                 root_from_inclusion_proof, verify_consistency, verify_inclusion)


# -- independent reference: the RFC 6962 §2.1 definitions, literally ----------------------------------------

def _sha(b: bytes) -> bytes:
    return hashlib.sha256(b).digest()


def _k(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def MTH(D: list[bytes]) -> bytes:
    n = len(D)
    if n == 0:
        return _sha(b"")
    if n == 1:
        return _sha(b"\x00" + D[0])
    k = _k(n)
    return _sha(b"\x01" + MTH(D[:k]) + MTH(D[k:]))


def PATH(m: int, D: list[bytes]) -> list[bytes]:
    n = len(D)
    if n == 1:
        return []
    k = _k(n)
    if m < k:
        return PATH(m, D[:k]) + [MTH(D[k:])]
    return PATH(m - k, D[k:]) + [MTH(D[:k])]


def SUBPROOF(m: int, D: list[bytes], b: bool) -> list[bytes]:
    n = len(D)
    if m == n:
        return [] if b else [MTH(D)]
    k = _k(n)
    if m <= k:
        return SUBPROOF(m, D[:k], b) + [MTH(D[k:])]
    return SUBPROOF(m - k, D[k:], False) + [MTH(D[:k])]


def PROOF(m: int, D: list[bytes]) -> list[bytes]:
    return SUBPROOF(m, D, True)


def _data(i: int) -> bytes:
    return f"leaf-{i}".encode() * (i % 3 + 1)


N_MAX = 64
DATA = [_data(i) for i in range(N_MAX)]


@pytest.fixture(scope="module")
def log64():
    store = InMemoryNodeStore()
    log = MerkleLog(store)
    size = 0
    for d in DATA:
        size = log.append(d, size)
    return log


# -- published vectors (certificate-transparency reference leaves) --------------------------------------------

CT_LEAVES = [bytes.fromhex(h) for h in
             ["", "00", "10", "2021", "3031", "40414243", "5051525354555657", "606162636465666768696a6b6c6d6e6f"]]
CT_ROOTS = ["e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
            "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
            "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
            "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
            "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
            "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"]
CT_INCLUSION = {(0, 8): ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
                         "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                         "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"],
                (5, 8): ["bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
                         "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
                         "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]}
CT_CONSISTENCY = {(1, 8): CT_INCLUSION[(0, 8)],
                  (6, 8): ["0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
                           "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
                           "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"],
                  (2, 5): ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                           "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"]}


def test_published_ct_vectors():
    log, size = MerkleLog(InMemoryNodeStore()), 0
    assert log.root(0).hex() == CT_ROOTS[0] == EMPTY_ROOT.hex()
    for n, d in enumerate(CT_LEAVES, start=1):
        size = log.append(d, size)
        assert log.root(n).hex() == CT_ROOTS[n]
        assert MTH(CT_LEAVES[:n]).hex() == CT_ROOTS[n]  # the reference agrees too
    for (i, n), want in CT_INCLUSION.items():
        assert [h.hex() for h in log.inclusion_proof(i, n)] == want
    for (m, n), want in CT_CONSISTENCY.items():
        assert [h.hex() for h in log.consistency_proof(m, n)] == want


def test_domain_separation():
    assert leaf_hash(b"x") == _sha(b"\x00x")
    assert node_hash(b"a" * 32, b"b" * 32) == _sha(b"\x01" + b"a" * 32 + b"b" * 32)
    # a one-leaf tree's root is the leaf hash, never SHA-256(data)
    log = MerkleLog(InMemoryNodeStore())
    log.append(b"x", 0)
    assert log.root(1) == leaf_hash(b"x") != _sha(b"x")


# -- exhaustive comparison with the reference, sizes 1..64 -----------------------------------------------------

def test_roots_every_size(log64):
    for n in range(N_MAX + 1):
        assert log64.root(n) == MTH(DATA[:n]), n


def test_inclusion_every_size_every_index(log64):
    for n in range(1, N_MAX + 1):
        root = MTH(DATA[:n])
        for i in range(n):
            proof = log64.inclusion_proof(i, n)
            assert proof == PATH(i, DATA[:n]), (i, n)
            assert verify_inclusion(leaf_hash(DATA[i]), i, n, proof, root)
            assert root_from_inclusion_proof(leaf_hash(DATA[i]), i, n, proof) == root


def test_consistency_every_size_every_old_size(log64):
    roots = [MTH(DATA[:n]) for n in range(N_MAX + 1)]
    for n in range(1, N_MAX + 1):
        for m in range(0, n + 1):
            proof = log64.consistency_proof(m, n)
            want = [] if m in (0, n) else PROOF(m, DATA[:n])
            assert proof == want, (m, n)
            assert verify_consistency(m, n, roots[m], roots[n], proof), (m, n)


def _flip(h: bytes, pos: int = 0, mask: int = 1) -> bytes:
    b = bytearray(h)
    b[pos % len(b)] ^= mask
    return bytes(b)


def test_inclusion_rejects_every_single_tampering(log64):
    for n in range(1, 33):
        root = MTH(DATA[:n])
        for i in range(n):
            lh, proof = leaf_hash(DATA[i]), log64.inclusion_proof(i, n)
            assert not verify_inclusion(_flip(lh), i, n, proof, root)
            assert not verify_inclusion(lh, i, n, proof, _flip(root, 31))
            for j in range(len(proof)):
                bad = list(proof)
                bad[j] = _flip(bad[j], j, 0x80)
                assert not verify_inclusion(lh, i, n, bad, root)
            assert not verify_inclusion(lh, i, n, proof + [root], root)         # extra element
            if proof:
                assert not verify_inclusion(lh, i, n, proof[:-1], root)        # truncated
            for i2 in range(n + 2):                                             # other positions
                if i2 != i:
                    assert not verify_inclusion(lh, i2, n, proof, root), (i, i2, n)
            # (other tree sizes are not rejected in general: e.g. leaf 0 has the same audit-path shape in
            # trees of 3 and 4 leaves.  The size is authenticated by the signed checkpoint, not the path.)


def test_consistency_rejects_tampering(log64):
    roots = [MTH(DATA[:n]) for n in range(N_MAX + 1)]
    for n in range(1, 33):
        for m in range(1, n + 1):
            proof = log64.consistency_proof(m, n)
            assert not verify_consistency(m, n, _flip(roots[m]), roots[n], proof)
            assert not verify_consistency(m, n, roots[m], _flip(roots[n]), proof)
            for j in range(len(proof)):
                bad = list(proof)
                bad[j] = _flip(bad[j], 7, 0x10)
                assert not verify_consistency(m, n, roots[m], roots[n], bad), (m, n, j)
            assert not verify_consistency(m, n, roots[m], roots[n], proof + [roots[n]])
            if m < n:
                assert not verify_consistency(m, n, roots[m], roots[n], proof[:-1])
                assert not verify_consistency(n, m, roots[n], roots[m], proof)     # reversed
                if m + 1 < n:
                    assert not verify_consistency(m + 1, n, roots[m + 1], roots[n], proof) or \
                        proof == log64.consistency_proof(m + 1, n)


def test_consistency_detects_a_forked_log():
    a, b = MerkleLog(InMemoryNodeStore()), MerkleLog(InMemoryNodeStore())
    sa = sb = 0
    for i in range(20):
        sa = a.append(DATA[i], sa)
        sb = b.append(DATA[i] if i != 5 else b"rewritten", sb)
    for m in range(6, 20):
        # b's history differs at leaf 5: no proof from a's old root to b's new root may verify
        assert not verify_consistency(m, 20, a.root(m), b.root(20), b.consistency_proof(m, 20))
        assert not verify_consistency(m, 20, a.root(m), b.root(20), a.consistency_proof(m, 20))
    for m in range(1, 6):  # before the fork the logs agree
        assert a.root(m) == b.root(m)
        assert verify_consistency(m, 20, a.root(m), b.root(20), b.consistency_proof(m, 20))


def test_edge_cases():
    assert verify_consistency(0, 0, EMPTY_ROOT, EMPTY_ROOT, [])
    assert verify_consistency(0, 5, EMPTY_ROOT, MTH(DATA[:5]), [])
    assert not verify_consistency(0, 5, MTH(DATA[:1]), MTH(DATA[:5]), [])
    assert not verify_consistency(0, 5, EMPTY_ROOT, MTH(DATA[:5]), [EMPTY_ROOT])
    assert verify_consistency(5, 5, MTH(DATA[:5]), MTH(DATA[:5]), [])
    assert not verify_consistency(5, 5, MTH(DATA[:5]), MTH(DATA[:4]), [])
    assert not verify_consistency(5, 5, MTH(DATA[:5]), MTH(DATA[:5]), [MTH(DATA[:5])])
    assert not verify_inclusion(leaf_hash(DATA[0]), 0, 0, [], EMPTY_ROOT)
    assert not verify_inclusion(leaf_hash(DATA[0]), -1, 3, [], EMPTY_ROOT)
    assert verify_inclusion(leaf_hash(DATA[0]), 0, 1, [], leaf_hash(DATA[0]))
    assert not verify_inclusion(b"short", 0, 1, [], b"short")
    assert not verify_inclusion(leaf_hash(DATA[0]), 0, 2, [b"x" * 31], leaf_hash(DATA[0]))


def test_log_argument_errors_and_idempotent_append():
    store = InMemoryNodeStore()
    log = MerkleLog(store)
    size = 0
    for d in DATA[:5]:
        size = log.append(d, size)
    n_nodes = len(store)
    assert log.append(DATA[4], 4) == 5 and len(store) == n_nodes       # retried append: no change
    with pytest.raises(MerkleError):
        log.append(b"other", 4)                                          # lost race on the counter
    with pytest.raises(MerkleError):
        log.append(b"gap", 7)                                            # size_before beyond the log
    with pytest.raises(MerkleError):
        log.inclusion_proof(5, 5)
    with pytest.raises(MerkleError):
        log.root(6)                                                      # more leaves than stored
    with pytest.raises(MerkleError):
        log.consistency_proof(4, 3)
    assert log.append_hash(leaf_hash(DATA[5]), 5) == 6
    assert log.root(6) == MTH(DATA[:6])


def test_store_holds_exactly_the_complete_perfect_subtrees(log64):
    store = log64.store
    for level in range(8):
        for index in range(N_MAX + 1):
            complete = (index + 1) << level <= N_MAX
            assert (store._nodes.get((level, index)) is not None) == complete, (level, index)
            if complete:
                lo = index << level
                assert store._nodes[(level, index)] == MTH(DATA[lo:lo + (1 << level)])


@given(st.integers(1, 200), st.data())
def test_random_sizes_against_reference(n, data):
    leaves = [f"r{i}".encode() for i in range(n)]
    log, size = MerkleLog(InMemoryNodeStore()), 0
    for d in leaves:
        size = log.append(d, size)
    i = data.draw(st.integers(0, n - 1))
    m = data.draw(st.integers(0, n))
    assert log.root(n) == MTH(leaves)
    assert log.inclusion_proof(i, n) == PATH(i, leaves)
    assert log.consistency_proof(m, n) == ([] if m in (0, n) else PROOF(m, leaves))


# -- O(log n) store reads --------------------------------------------------------------------------------------

def test_reads_are_logarithmic_at_2_16_plus_3():
    n = (1 << 16) + 3
    store = InMemoryNodeStore()
    log = MerkleLog(store)
    size = 0
    max_append_reads = 0
    for i in range(n):
        before = store.gets
        size = log.append(i.to_bytes(4, "big"), size)
        max_append_reads = max(max_append_reads, store.gets - before)
    lg = math.log2(n)
    assert max_append_reads <= lg + 2
    assert len(store) < 2 * n                                   # O(n) nodes in total, not O(n log n)
    root = log.root(n)
    indices = [0, 1, 2, n // 2, (1 << 16) - 1, 1 << 16, n - 2, n - 1, 12345, 54321]
    for i in indices:
        before = store.gets
        proof = log.inclusion_proof(i, n)
        reads = store.gets - before
        assert reads <= 2 * lg, (i, reads)
        assert verify_inclusion(leaf_hash(i.to_bytes(4, "big")), i, n, proof, root)
    for m in [1, 3, 1 << 15, (1 << 16) - 1, 1 << 16, (1 << 16) + 1, n - 1, 40000]:
        before = store.gets
        proof = log.consistency_proof(m, n)
        reads = store.gets - before
        assert reads <= 2 * lg, (m, reads)
        before = store.gets
        old_root = log.root(m)
        assert store.gets - before <= lg + 1
        assert verify_consistency(m, n, old_root, root, proof)
    # and a size that is all ones in binary (worst case for root): 2^16 - 1
    before = store.gets
    log.root((1 << 16) - 1)
    assert store.gets - before == 16


class _BatchStore(InMemoryNodeStore):
    def __init__(self):
        super().__init__()
        self.batches: list[int] = []

    def get_many(self, coords):
        self.batches.append(len(coords))
        return {c: self._nodes[c] for c in coords if c in self._nodes}


def test_batched_store_fetches_each_proof_in_one_call(log64):
    store = _BatchStore()
    store._nodes = dict(log64.store._nodes)
    log = MerkleLog(store)
    for n in range(1, N_MAX + 1):
        for i in range(0, n, 5):
            store.batches.clear()
            assert log.inclusion_proof(i, n) == PATH(i, DATA[:n])
            assert len(store.batches) == 1 and store.gets == 0
        for m in range(1, n, 3):
            store.batches.clear()
            assert log.consistency_proof(m, n) == PROOF(m, DATA[:n])
            assert len(store.batches) == 1
        assert log.root(n) == MTH(DATA[:n])
    with pytest.raises(MerkleError):
        log.inclusion_proof(3, N_MAX + 1)  # a node is missing: the tree is smaller than claimed
