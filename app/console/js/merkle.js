// RFC 6962 / RFC 9162 Merkle proofs, verified without a store: app/receipts/merkle.py (verify_inclusion,
// verify_consistency, root_from_inclusion_proof), line for line. Sizes and indices are BigInts, so that the
// bit arithmetic stays exact beyond 2^31.
import { bytesEqual, concat, sha256 } from './crypto.js';

export const HASH_SIZE = 32;

const LEAF = new Uint8Array([0]);
const NODE = new Uint8Array([1]);
let emptyRoot = null;

export async function emptyTreeRoot() {
  if (!emptyRoot) emptyRoot = await sha256(new Uint8Array(0));
  return emptyRoot;
}

// SHA-256(0x00 || data)
export function leafHash(data) {
  return sha256(concat(LEAF, data));
}

// SHA-256(0x01 || left || right)
export function nodeHash(left, right) {
  return sha256(concat(NODE, left, right));
}

function hashesOk(list) {
  return list.every((h) => h instanceof Uint8Array && h.length === HASH_SIZE);
}

function isBig(v) {
  return typeof v === 'bigint';
}

// the root implied by an inclusion proof (RFC 9162 §2.1.3.2), or null if the proof is malformed
export async function rootFromInclusionProof(leaf, index, size, proof) {
  if (!(isBig(index) && isBig(size)) || !(index >= 0n && index < size)) return null;
  if (!hashesOk([leaf]) || !hashesOk(proof)) return null;
  let fn = index;
  let sn = size - 1n;
  let r = leaf;
  for (const p of proof) {
    if (sn === 0n) return null;
    if ((fn & 1n) === 1n || fn === sn) {
      r = await nodeHash(p, r);
      if ((fn & 1n) === 0n) {
        while (fn !== 0n && (fn & 1n) === 0n) {
          fn >>= 1n;
          sn >>= 1n;
        }
      }
    } else {
      r = await nodeHash(r, p);
    }
    fn >>= 1n;
    sn >>= 1n;
  }
  return sn === 0n ? r : null;
}

export async function verifyInclusion(leaf, index, size, proof, root) {
  const r = await rootFromInclusionProof(leaf, index, size, proof);
  return r !== null && hashesOk([root]) && bytesEqual(r, root);
}

// true iff proof shows that the tree (newSize, newRoot) extends (oldSize, oldRoot) (RFC 9162 §2.1.4.2)
export async function verifyConsistency(oldSize, newSize, oldRoot, newRoot, proof) {
  if (!(isBig(oldSize) && isBig(newSize)) || !(oldSize >= 0n && oldSize <= newSize)) return false;
  if (!hashesOk([oldRoot, newRoot]) || !hashesOk(proof)) return false;
  if (oldSize === 0n) return proof.length === 0 && bytesEqual(oldRoot, await emptyTreeRoot());
  if (oldSize === newSize) return proof.length === 0 && bytesEqual(oldRoot, newRoot);
  const path = proof.slice();
  if ((oldSize & (oldSize - 1n)) === 0n) path.unshift(oldRoot);  // a power of two: the old root is a node
  if (path.length === 0) return false;
  let fn = oldSize - 1n;
  let sn = newSize - 1n;
  while ((fn & 1n) === 1n) {
    fn >>= 1n;
    sn >>= 1n;
  }
  let fr = path[0];
  let sr = path[0];
  for (const c of path.slice(1)) {
    if (sn === 0n) return false;
    if ((fn & 1n) === 1n || fn === sn) {
      fr = await nodeHash(c, fr);
      sr = await nodeHash(c, sr);
      if ((fn & 1n) === 0n) {
        while (fn !== 0n && (fn & 1n) === 0n) {
          fn >>= 1n;
          sn >>= 1n;
        }
      }
    } else {
      sr = await nodeHash(sr, c);
    }
    fn >>= 1n;
    sn >>= 1n;
  }
  return bytesEqual(fr, oldRoot) && bytesEqual(sr, newRoot) && sn === 0n;
}
