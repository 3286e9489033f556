"""SISA: exact sharded, sliced unlearning (Bourtoule et al., "Machine Unlearning", IEEE S&P 2021), one pass of
projected OGD per shard.

* **Shards.**  The stream is split into S shards, each an independent model learned by the retrain family's OGD
  (projected, eta_j = min(1/(mu j), 2/(beta+mu)), from theta = 0) on its own records, on its own clock j (the
  record's position in its shard).  The record at global step g goes to shard (g - 1) mod S: a public,
  data-independent rule that balances the shards exactly.  (The issue asked for the record's commitment; the
  engine never sees record ids -- the commitments stay in the service -- and the step is just as independent of
  the data.  Both give every record a shard fixed at learning, which is what exactness needs.)
* **Slices.**  Each shard's records are cut into slices of ``slice_length`` = ceil(max_records / (S R)) records
  (R = ``slices``; the retained-record cap ``max_records`` is set for every model that keeps data): the shard's
  model is kept at every slice boundary (the checkpoints, secret state).
* **Forget** (SISA §IV): only the record's shard is recomputed, from the checkpoint before the record's slice,
  over the shard's retained records from that slice on, skipping the forgotten ones and keeping the clock (a record
  keeps its position j, pitfall P7).  The checkpoints before that slice never saw the record, and the ones after
  it are recomputed, so what remains is exactly the state of a run on the masked stream (the forgotten steps are
  skip symbols): certificate mechanism "exact", sigma = rho = 0; the certificate names the shard and the records
  replayed.  Work: at most ceil(N / S) records read and replayed per shard touched (about half on average
  with many slices), against N for the ``retrain`` family.
* **Prediction** aggregates the S shard models (SISA §IV-C): the mean of their outputs -- the class-1
  probability (logistic), the K class probabilities (softmax) or the value (squared, huber) -- and the label or
  class of that mean.  The published parameters are the S shard models, row-major (S x (d + 1), or S x K x (d + 1)).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from ..contract.certificate import Certificate
from ..contract.errors import SpecError
from ..contract.spec import ModelSpec
from ..contract.unlearner import RetainedData
from ..maths import work_budget as wb
from ..maths.losses import Loss
from ..mechanism.noise import NoiseSource
from .retrain import CHUNK_SIZE, ExactOGD, check_forget_steps, ogd_run

# Defaults measured with ``python -m bench --sections scale_accuracy`` (docs/accuracy.md, "SISA defaults").
DEFAULT_SHARDS = 8  # the fewest shards of the default rule (default_shards): a model of up to 16 384 records
SHARDS_PER_SQRT = 16  # default S = ceil(sqrt(max_records) / 16): a shard of about 16 sqrt(N) records
DEFAULT_SLICES = 4
MAX_SHARDS = 1024
MAX_SLICES = 1024
# slice length of a model without a retained-record cap (an engine used outside the service, which always sets one)
UNCAPPED_SLICE_LENGTH = 1024


class SISA(ExactOGD):
    algorithm = "sisa"
    OWN_HYPERPARAMETERS = ("shards", "slices")
    guarantee_words = (
        "After the deletion the shard that held the record is recomputed without it from the checkpoint before the "
        "record's slice: what the model publishes is exactly what it would have published had the record never "
        "been learned."
    )

    def __init__(self, spec: ModelSpec, noise: NoiseSource | None = None):
        super().__init__(spec, noise)
        hp = self.start_ogd(spec)
        self.shards = int(hp["shards"])
        self.slice_length = self.slice_length_of(spec.hyperparameters.get("max_records"), self.shards,
                                                 int(hp["slices"]))
        p = spec.n_params
        self.thetas = np.zeros((self.shards, p))
        # checkpoints[s][r - 1]: shard s's model after its first r * slice_length positions (the start of slice r)
        self.checkpoints: list[list[np.ndarray]] = [[] for _ in range(self.shards)]
        self.deleted = np.zeros(0, dtype=np.int64)  # forgotten global steps, sorted (never read again)

    @staticmethod
    def default_shards(max_records: Any) -> int:
        """The default S for a retained-record cap N: clamp(ceil(sqrt(N) / 16), 8, MAX_SHARDS) (8 without a cap).

        A forget replays about half of one shard, N / (2S) records, against N for ``retrain``: the share 1/(2S)
        falls as 8 / sqrt(N) (1e6: S = 63, 1/126), while each shard still learns 16 sqrt(N) records (1e6: about
        16 000), so the averaged shard models stay close to one model on the whole stream (accuracy at 1e6:
        docs/performance.md, "Engine cost at scale").  Up to N = 16 384 it is the fixed default 8."""
        if max_records is None:
            return DEFAULT_SHARDS
        return int(min(MAX_SHARDS, max(DEFAULT_SHARDS, math.ceil(math.sqrt(int(max_records)) / SHARDS_PER_SQRT))))

    @staticmethod
    def slice_length_of(max_records: Any, shards: int, slices: int) -> int:
        if max_records is None:
            return UNCAPPED_SLICE_LENGTH
        return max(1, math.ceil(int(max_records) / (shards * slices)))

    @classmethod
    def normalize_hyperparameters(cls, spec: ModelSpec) -> dict[str, Any]:
        # sees the limit hyperparameters (marked below): the default shards follow max_records; ExactOGD's own
        # normalisation (through its wrapper) checks the limits and puts them back
        hp = super().normalize_hyperparameters(spec)
        shards = cls.default_shards(hp.get("max_records"))
        for key, default, top in (("shards", shards, MAX_SHARDS), ("slices", DEFAULT_SLICES, MAX_SLICES)):
            v = hp.setdefault(key, default)
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= int(v) <= top:
                raise SpecError(f"{key} must be an integer in [1, {top}]", fields=(f"hyperparameters.{key}",))
            hp[key] = int(v)
        return hp

    normalize_hyperparameters.__func__._limits = True  # type: ignore[attr-defined]

    @classmethod
    def cost(cls, spec: ModelSpec, batch: int) -> wb.Cost:
        """Learn: one OGD step per example.  Forget: read and replay one shard, at most ceil(N / S) records for
        N = max_records (each further record of the request may sit in another shard, and a request replays each
        shard at most once: at most every shard, S ceil(N / S) records).  Retrain: every shard.  Memory: the
        S (R + 1) shard models of the state, and a chunk of records."""
        hp = spec.hyperparameters
        p, N = spec.n_params, int(hp.get("max_records") or batch)
        S, R = int(hp.get("shards", DEFAULT_SHARDS)), int(hp.get("slices", DEFAULT_SLICES))
        shard = math.ceil(N / S)
        # one shard read (its records are chunked together: app/db/retained.py, retained_groups) and replayed by the
        # compiled exact loop, its slice checkpoints kept; the forgotten record looked up first
        replay = (wb.read(shard, p, wb.small_chunk_records(p)) - wb.STORE + wb.QUERY + 1.5 * wb.exact_ogd(shard, p)
                  + (R + 1) * wb.CALL)
        check = wb.read_random(1, p) - wb.STORE
        everything = wb.STORE + S * replay
        learn = 2.0 * wb.exact_ogd(batch, p) + min(batch, S) * 2 * wb.CALL  # per shard: its rows (a strided copy),
        # its slice checkpoints
        return wb.Cost(learn=learn, forget=wb.STORE + replay + check, forget_each=replay + check, retrain=everything,
                       forget_most=everything + S * check,  # every shard once, and each one's record looked up
                       array_bytes=wb.F64 * max(p * S * (R + 1), (p + 1) * min(N, CHUNK_SIZE) * 2),
                       learn_fields=("dim",), forget_fields=("hyperparameters.max_records", "hyperparameters.shards",
                                                             "dim"),
                       memory_fields=("hyperparameters.shards", "hyperparameters.slices", "dim"))

    # ---- where a step lives --------------------------------------------------------------------------------------
    def shard_of(self, step):
        """The shard of a global step (an int, or an int64 array of steps)."""
        return (step - 1) % self.shards

    def retained_groups(self, steps: np.ndarray) -> np.ndarray:
        """The retained store keeps each shard's records together: a forget reads one shard's (issue 36 item 2)."""
        return self.shard_of(np.asarray(steps, dtype=np.int64))

    def position(self, step):
        """The step's 1-based position j in its shard: its clock there (eta_j); an int or an int64 array."""
        return (step - 1) // self.shards + 1

    def shard_size(self, shard: int, t: int | None = None) -> int:
        """Positions of ``shard`` taken after ``t`` global steps (forgotten ones included: the clock is kept)."""
        t = self.t if t is None else t
        return 0 if t <= shard else (t - shard - 1) // self.shards + 1

    def _step_at(self, shard: int, positions: np.ndarray) -> np.ndarray:
        return shard + 1 + (positions - 1) * self.shards

    # ---- state -------------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        p = self.spec.n_params
        depth = max((len(c) for c in self.checkpoints), default=0)
        ck = np.zeros((self.shards, depth, p))
        for s, cs in enumerate(self.checkpoints):
            if cs:
                ck[s, : len(cs)] = cs
        return {"thetas": self.thetas.copy(), "checkpoints": ck, "deleted": self.deleted.copy(), "t": self.t,
                "n_deletions": self.n_deletions, "epoch": self.epoch}

    def load_state(self, state: Mapping[str, Any]) -> None:
        p = self.spec.n_params
        thetas = np.asarray(state["thetas"], dtype=np.float64)
        ck = np.asarray(state["checkpoints"], dtype=np.float64)
        if thetas.shape != (self.shards, p) or ck.ndim != 3 or ck.shape[0] != self.shards or ck.shape[2] != p:
            raise ValueError("stored shard models do not match the model's shards and dimension")
        self.t = int(state["t"])
        self.thetas = thetas.copy()
        self.checkpoints = [[ck[s, r].copy() for r in range(self.shard_size(s) // self.slice_length)]
                            for s in range(self.shards)]
        self.deleted = np.asarray(state["deleted"], dtype=np.int64).copy()
        self.n_deletions = int(state["n_deletions"])
        self.epoch = int(state["epoch"])

    @property
    def step(self) -> int:
        return self.t

    def published(self) -> np.ndarray:
        return self.thetas.reshape(-1).copy()

    # ---- the shard replay ----------------------------------------------------------------------------------------
    def _advance(self, shard: int, theta: np.ndarray, positions: np.ndarray, X: np.ndarray, y: np.ndarray,
                 upto: int) -> np.ndarray:
        """OGD of ``shard`` from ``theta`` over the examples at ``positions`` (ascending, all <= ``upto``), keeping
        a checkpoint at every slice boundary crossed on the way to position ``upto`` (a boundary after skipped
        positions is a checkpoint too: the masked stream's state there)."""
        L = self.slice_length
        cks = self.checkpoints[shard]
        start = len(cks) * L  # positions up to here are covered by the checkpoints kept
        k = 0
        for boundary in range((start // L + 1) * L, upto + 1, L):
            end = int(np.searchsorted(positions, boundary, side="right"))
            if end > k:
                theta = ogd_run(self.loss, self.schedule, self.spec.domain_radius, theta, X[k:end], y[k:end],
                                positions[k:end])
            k = end
            cks.append(theta.copy())
        if k < len(positions):
            theta = ogd_run(self.loss, self.schedule, self.spec.domain_radius, theta, X[k:], y[k:], positions[k:])
        return theta

    def _replay_shard(self, shard: int, from_slice: int, retained: RetainedData, exclude: np.ndarray) -> int:
        """Recompute ``shard`` from the checkpoint at the start of slice ``from_slice`` (0: theta = 0) over its
        retained records from there on, minus ``exclude``; the number of records replayed."""
        L, n = self.slice_length, self.shard_size(shard)
        del self.checkpoints[shard][from_slice:]
        theta = self.checkpoints[shard][from_slice - 1].copy() if from_slice else np.zeros(self.spec.n_params)
        positions = np.arange(from_slice * L + 1, n + 1, dtype=np.int64)
        steps = self._step_at(shard, positions)
        keep = ~np.isin(steps, exclude)
        positions, steps = positions[keep], steps[keep]
        replayed = 0
        # read in chunks; the checkpoints of the boundaries inside each chunk are kept as OGD passes them
        for a in range(0, max(len(steps), 1), self.chunk_size):
            part_pos, part_steps = positions[a : a + self.chunk_size], steps[a : a + self.chunk_size]
            last = a + self.chunk_size >= len(steps)
            upto = n if last else int(part_pos[-1])
            if len(part_steps):
                X, y = retained.get(part_steps.tolist())
                X, y = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)
            else:
                X, y = np.zeros((0, self.spec.dim)), np.zeros(0)
            theta = self._advance(shard, theta, part_pos, X, y, upto)
            replayed += len(part_steps)
        self.thetas[shard] = theta
        return replayed

    # ---- the contract ----------------------------------------------------------------------------------------------
    def learn(self, X: np.ndarray, y: np.ndarray, retained: RetainedData | None = None) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        steps = np.arange(self.t + 1, self.t + 1 + len(X), dtype=np.int64)
        t_after = self.t + len(X)
        for shard in range(self.shards):
            first = (shard - self.t) % self.shards  # the batch's rows of this shard: every S-th from here
            if first >= len(X):
                continue
            rows = slice(first, None, self.shards)
            self.thetas[shard] = self._advance(shard, self.thetas[shard], self.position(steps[rows]), X[rows],
                                               y[rows], self.shard_size(shard, t_after))
        self.t = t_after
        return steps

    def forget(self, steps: Sequence[int], retained: RetainedData | None = None) -> list[Certificate]:
        steps = check_forget_steps(steps, self.t, retained, self.algorithm)
        if not steps:
            return []
        exclude = np.union1d(self.deleted, np.asarray(steps, dtype=np.int64))
        by_shard: dict[int, list[int]] = {}
        for u in steps:
            by_shard.setdefault(self.shard_of(u), []).append(u)
        work: dict[int, tuple[int, int]] = {}
        for shard, victims in sorted(by_shard.items()):
            from_slice = min((self.position(u) - 1) // self.slice_length for u in victims)
            work[shard] = (from_slice, self._replay_shard(shard, from_slice, retained, exclude))
        self.deleted = exclude
        certs = []
        for u in steps:
            shard = self.shard_of(u)
            from_slice, replayed = work[shard]
            self.n_deletions += 1
            certs.append(Certificate(learned_step=u, forgotten_step=self.t, deletion_index=self.n_deletions,
                                     mechanism="exact", sigma=0.0, sensitivity=0.0, rho=0.0,
                                     details={"shard": float(shard), "from_slice": float(from_slice),
                                              "records_replayed": float(replayed)}))
        return certs

    def retrain(self, retained: RetainedData) -> None:
        """Every shard recomputed from theta = 0 over the records it holds (a new ledger epoch)."""
        for shard in range(self.shards):
            self._replay_shard(shard, 0, retained, self.deleted)
        self.epoch += 1

    # ---- prediction: the mean of the shard models' outputs -------------------------------------------------------
    @classmethod
    def published_shape(cls, spec: ModelSpec) -> tuple[int, ...]:
        shards = int(spec.hyperparameters.get("shards", DEFAULT_SHARDS))
        return (shards,) + super().published_shape(spec)

    @classmethod
    def published_ensemble(cls, spec: ModelSpec) -> str | None:
        return "mean_output"

    @classmethod
    def predict_published(cls, spec: ModelSpec, loss: Loss, published: np.ndarray,
                          X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        members = published.reshape(cls.published_shape(spec)[0], -1)
        mean = None
        for theta in members:
            _, out = super().predict_published(spec, loss, theta, X)
            mean = out if mean is None else mean + out
        mean = mean / len(members)
        return loss.predict_output(mean), mean
