"""RFC 6962 / RFC 9162 Merkle tree over a node store, plus store-free proof verification.

Hashing (RFC 6962 §2.1, unchanged in RFC 9162 §2.1.1), SHA-256 with domain separation:

* empty tree:  ``MTH({}) = SHA-256()``
* leaf:        ``SHA-256(0x00 || data)``
* inner node:  ``SHA-256(0x01 || left || right)``; the split point ``k`` of ``D[n]`` is the largest power of
  two strictly smaller than ``n``.

Storage model.  The node at ``(level, index)`` is the root of the *perfect* subtree over leaves
``[index * 2**level, (index + 1) * 2**level)``.  Level 0 holds leaf hashes.  A node is written exactly once,
when its subtree becomes complete, and never changes afterwards (the log is append-only), so the store is an
insert-only table keyed by ``(level, index)`` (per tenant in the service).  Appending a leaf writes 1 + (number
of trailing one bits of the old size) nodes, i.e. at most ``log2(n) + 1``.

The tree size is *not* kept here: the caller holds the counter (a database row updated in the same
transaction as the appended nodes) and passes it in.  Any tree hash of a prefix ``[0, size)`` and any
sub-range that the RFC recursion visits is a right-leaning fold of at most ``log2(n)`` stored perfect
subtrees, so ``root``, ``inclusion_proof`` and ``consistency_proof`` read O(log n) nodes and never rebuild the
tree.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

__all__ = [
    "HASH_SIZE",
    "EMPTY_ROOT",
    "leaf_hash",
    "node_hash",
    "NodeStore",
    "InMemoryNodeStore",
    "MerkleLog",
    "MerkleError",
    "verify_inclusion",
    "verify_consistency",
    "root_from_inclusion_proof",
    "range_nodes",
    "inclusion_ranges",
    "consistency_ranges",
]

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()


class MerkleError(ValueError):
    """Invalid arguments or an inconsistent store."""


def leaf_hash(data: bytes) -> bytes:
    """RFC 6962 leaf hash ``SHA-256(0x00 || data)``."""
    return hashlib.sha256(b"\x00" + bytes(data)).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """RFC 6962 interior node hash ``SHA-256(0x01 || left || right)``."""
    return hashlib.sha256(b"\x01" + bytes(left) + bytes(right)).digest()


@runtime_checkable
class NodeStore(Protocol):
    """Insert-only map ``(level, index) -> 32-byte hash`` of complete perfect subtrees.

    Optionally a store may also define ``get_many(coords: list[tuple[int, int]]) -> Mapping[(level, index),
    bytes]`` (missing nodes absent); proofs and roots then fetch all their nodes in one call.
    """

    def get(self, level: int, index: int) -> bytes | None: ...

    def put(self, level: int, index: int, hash: bytes) -> None: ...


class InMemoryNodeStore:
    """Dict-backed :class:`NodeStore` (tests, tools). Counts reads in ``gets``."""

    def __init__(self) -> None:
        self._nodes: dict[tuple[int, int], bytes] = {}
        self.gets = 0

    def get(self, level: int, index: int) -> bytes | None:
        self.gets += 1
        return self._nodes.get((level, index))

    def put(self, level: int, index: int, hash: bytes) -> None:
        key = (level, index)
        old = self._nodes.get(key)
        if old is not None and old != hash:
            raise MerkleError(f"node {key} already stored with a different hash")
        self._nodes[key] = bytes(hash)

    def __len__(self) -> int:
        return len(self._nodes)


def _largest_pow2_below(n: int) -> int:
    """Largest power of two strictly smaller than ``n`` (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def _check_hash(h: bytes, what: str) -> bytes:
    if not isinstance(h, (bytes, bytearray)) or len(h) != HASH_SIZE:
        raise MerkleError(f"{what} must be {HASH_SIZE} bytes")
    return bytes(h)


class MerkleLog:
    """Append-only RFC 6962 log over a :class:`NodeStore`; the caller owns the tree-size counter."""

    def __init__(self, store: NodeStore) -> None:
        self.store = store

    # -- writing -------------------------------------------------------------------------------------
    def append(self, leaf: bytes, size_before: int, *, is_hash: bool = False) -> int:
        """Append one leaf to a tree of ``size_before`` leaves; return the new size.

        ``leaf`` is the leaf *data* (hashed with the 0x00 prefix) unless ``is_hash=True``, in which case it is
        an already computed RFC 6962 leaf hash.  Writes the leaf hash at ``(0, size_before)`` and every
        perfect subtree completed by it; reads one stored left sibling per completed level.

        Appending the same leaf again at the same position is idempotent; a different leaf at an occupied
        position raises :class:`MerkleError` (a lost race on the size counter must abort the transaction).
        """
        if size_before < 0:
            raise MerkleError("size_before must be >= 0")
        h = _check_hash(leaf, "leaf hash") if is_hash else leaf_hash(leaf)
        existing = self.store.get(0, size_before)
        if existing is not None:
            if existing != h:
                raise MerkleError(f"leaf {size_before} already exists with a different hash")
            return size_before + 1
        self.store.put(0, size_before, h)
        index, level = size_before, 0
        while index & 1:  # this node is a right child: its parent's subtree is now complete
            left = self.store.get(level, index - 1)
            if left is None:
                raise MerkleError(f"missing node ({level}, {index - 1}); is size_before={size_before} right?")
            h = node_hash(left, h)
            index >>= 1
            level += 1
            self.store.put(level, index, h)
        return size_before + 1

    def append_hash(self, leaf_hash_: bytes, size_before: int) -> int:
        """Append an already computed leaf hash (see :meth:`append`)."""
        return self.append(leaf_hash_, size_before, is_hash=True)

    # -- reading -------------------------------------------------------------------------------------
    # Every read is planned first as a list of ranges, each a list of (level, index) node coordinates, then
    # fetched in one batch (``store.get_many`` if the store has it: one SQL query instead of ~2 log n).

    def _fetch(self, coords: list[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        get_many = getattr(self.store, "get_many", None)
        if get_many is not None:
            found = dict(get_many(coords))
        else:
            found = {}
            for c in coords:
                h = self.store.get(*c)
                if h is not None:
                    found[c] = h
        missing = [c for c in coords if found.get(c) is None]
        if missing:
            raise MerkleError(f"node {missing[0]} is not stored; tree smaller than claimed?")
        return found

    def _hash_ranges(self, ranges: list[tuple[int, int]]) -> list[bytes]:
        unique = list(dict.fromkeys(ranges))  # a batch of proofs shares most of its ranges: each is folded once
        plans = [range_nodes(a, b) for a, b in unique]
        nodes = self._fetch(list(dict.fromkeys(c for plan in plans for c in plan)))
        folded = {}
        for rng, plan in zip(unique, plans):
            h = nodes[plan[-1]]
            for c in reversed(plan[:-1]):
                h = node_hash(nodes[c], h)
            folded[rng] = h
        return [folded[r] for r in ranges]

    def root(self, size: int) -> bytes:
        """Root hash of the tree of the first ``size`` leaves (``SHA-256(b'')`` for size 0)."""
        if size < 0:
            raise MerkleError("size must be >= 0")
        return EMPTY_ROOT if size == 0 else self._hash_ranges([(0, size)])[0]

    def leaf_hash_at(self, index: int) -> bytes:
        return self._fetch([(0, index)])[(0, index)]

    def inclusion_proof(self, index: int, size: int) -> list[bytes]:
        """RFC 6962 audit path ``PATH(index, D[size])``, ordered from the leaf up to the root."""
        return self._hash_ranges(inclusion_ranges(index, size))

    def inclusion_proofs(self, indices: Sequence[int], size: int) -> list[list[bytes]]:
        """``inclusion_proof`` of each of ``indices`` in the tree of ``size`` leaves, their nodes fetched in one batch
        (an export page: the proofs of k leaves read at most k (log2(size) + 1) nodes, far fewer when the leaves are
        near each other, as a model's receipts are)."""
        plans = [inclusion_ranges(i, size) for i in indices]
        hashes = self._hash_ranges([r for plan in plans for r in plan])
        out, at = [], 0
        for plan in plans:
            out.append(hashes[at: at + len(plan)])
            at += len(plan)
        return out

    def consistency_proof(self, old_size: int, new_size: int) -> list[bytes]:
        """RFC 6962 ``PROOF(old_size, D[new_size])``; empty when ``old_size`` is 0 or equals ``new_size``."""
        return self._hash_ranges(consistency_ranges(old_size, new_size))


def range_nodes(start: int, end: int) -> list[tuple[int, int]]:
    """Stored nodes whose right-leaning fold is MTH(D[start:end]), largest (leftmost) first.

    Valid for the ranges the RFC recursion produces: they start at a multiple of the power of two >= their
    length, so they split into the perfect subtrees given by the binary digits of the length.
    """
    n = end - start
    if n <= 0:
        raise MerkleError("empty range")
    out, pos = [], start
    for level in range(n.bit_length() - 1, -1, -1):
        if n >> level & 1:
            if pos & ((1 << level) - 1):
                raise MerkleError(f"range [{start},{end}) is not aligned")
            out.append((level, pos >> level))
            pos += 1 << level
    return out


def inclusion_ranges(index: int, size: int) -> list[tuple[int, int]]:
    """Leaf ranges whose tree hashes form ``PATH(index, D[size])`` (leaf to root)."""
    if not 0 <= index < size:
        raise MerkleError(f"leaf index {index} not in tree of size {size}")
    ranges: list[tuple[int, int]] = []  # collected root-down
    start, end = 0, size
    while end - start > 1:
        k = _largest_pow2_below(end - start)
        if index < start + k:
            ranges.append((start + k, end))
            end = start + k
        else:
            ranges.append((start, start + k))
            start += k
    ranges.reverse()
    return ranges


def consistency_ranges(old_size: int, new_size: int) -> list[tuple[int, int]]:
    """Leaf ranges whose tree hashes form ``PROOF(old_size, D[new_size])`` (RFC 6962 §2.1.2)."""
    if not 0 <= old_size <= new_size:
        raise MerkleError(f"need 0 <= old_size <= new_size, got {old_size}, {new_size}")
    if old_size == 0 or old_size == new_size:
        return []
    ranges: list[tuple[int, int]] = []  # root-down
    m, start, end, complete = old_size, 0, new_size, True
    while m != end:  # relative old size m - start vs. range length end - start
        k = _largest_pow2_below(end - start)
        if m - start <= k:
            ranges.append((start + k, end))
            end = start + k
        else:
            ranges.append((start, start + k))
            start += k
            complete = False
    if not complete:
        ranges.append((start, end))
    ranges.reverse()
    return ranges


# -- verification without a store (RFC 9162 §2.1.3.2 and §2.1.4.2) ----------------------------------------

def _hashes_ok(proof: Sequence[bytes]) -> bool:
    return all(isinstance(p, (bytes, bytearray)) and len(p) == HASH_SIZE for p in proof)


def root_from_inclusion_proof(leaf_hash_: bytes, index: int, size: int, proof: Sequence[bytes]) -> bytes | None:
    """Root implied by an inclusion proof (RFC 9162 §2.1.3.2), or ``None`` if the proof is malformed."""
    if not (isinstance(index, int) and isinstance(size, int)) or not 0 <= index < size:
        return None
    if not _hashes_ok([leaf_hash_]) or not _hashes_ok(proof):
        return None
    fn, sn, r = index, size - 1, bytes(leaf_hash_)
    for p in proof:
        if sn == 0:
            return None
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return r if sn == 0 else None


def verify_inclusion(leaf_hash_: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> bool:
    """True iff ``proof`` shows the leaf hash at ``index`` in the tree of ``size`` leaves with ``root``."""
    r = root_from_inclusion_proof(leaf_hash_, index, size, proof)
    return r is not None and _hashes_ok([root]) and r == bytes(root)


def verify_consistency(old_size: int, new_size: int, old_root: bytes, new_root: bytes,
                       proof: Sequence[bytes]) -> bool:
    """True iff ``proof`` shows the tree (new_size, new_root) extends (old_size, old_root).

    Edge cases: ``old_size == 0`` needs an empty proof and ``old_root == SHA-256(b'')``;
    ``old_size == new_size`` needs an empty proof and equal roots; ``old_size > new_size`` is false.
    """
    if not (isinstance(old_size, int) and isinstance(new_size, int)) or not 0 <= old_size <= new_size:
        return False
    if not _hashes_ok([old_root, new_root]) or not _hashes_ok(proof):
        return False
    old_root, new_root = bytes(old_root), bytes(new_root)
    if old_size == 0:
        return len(proof) == 0 and old_root == EMPTY_ROOT
    if old_size == new_size:
        return len(proof) == 0 and old_root == new_root
    path = list(proof)
    if old_size & (old_size - 1) == 0:  # exact power of two: the old root is a node of the new tree
        path.insert(0, old_root)
    if not path:
        return False
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return fr == old_root and sr == new_root and sn == 0
