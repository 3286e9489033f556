"""Every family's hyperparameter table (contract/knobs.py): the knobs, their types, defaults, ranges and words, the
losses the family serves and its rules across fields.  The service checks a new model's hyperparameters against its
family's table (``check_knobs``) and serves the JSON Schema made from it (GET /v1/algorithms, the OpenAPI
document); the family's ``normalize_hyperparameters`` fills in the defaults and checks what depends on the spec.
tests/test_hyperparameter_schema.py keeps the two in step: every family's normalised defaults, and a random
sample of accepted specs, validate against the schema, and schema-valid hyperparameters are accepted.

A family that gains a knob adds it here (the test fails until it does)."""
from __future__ import annotations

from ..contract.knobs import HUBER_DELTA, LIMIT_KNOBS, Knob, KnobTable, Rule
from .active import VARIANTS as ACTIVE_VARIANTS
from .descent_to_delete_variants import SELECTIONS, VARIANTS as D2D_VARIANTS
from .dp_tree import GROUP_PRIVACY, MAX_HORIZON
from .exact_ridge import DEFAULT_GRID_BITS, DELETION_FEATURES as RIDGE_DELETION_FEATURES, GRID_BITS, L2_SELECTION
from .ridge_private import MAX_RELEASE_HORIZON, PRIVATE_GRID_BITS, PUBLICATIONS
from .memory_pair_calibration import DELETION_FEATURES as MP_DELETION_FEATURES, REMOVALS, STEPS as MP_STEPS
from .passive_calibration import ALLOCATIONS, SCHEDULES as PASSIVE_SCHEDULES
from .retained_descent import DEFAULT_MAX_GD_STEPS, SCHEDULES as DESCENT_SCHEDULES
from .rewind_calibration import CALIBRATIONS, LEARN_POLICIES, REGIMES, VARIANTS as REWIND_VARIANTS
from .second_order import DEFAULT_GD_TOLERANCE, SOLVERS
from .sisa import DEFAULT_SLICES, MAX_SHARDS, MAX_SLICES

ALL_LOSSES = ("logistic", "squared", "huber", "softmax")
L2_RULE = Rule("needs l2 > 0 (strong convexity mu = l2)", ("l2",))


# ---- passive OLU and the families built on it (000/001 Alg. 1; passive_calibration.py) --------------------------
def _passive_knobs(*, default_schedule: str, default_capped: bool, noise: bool, restart: bool) -> tuple[Knob, ...]:
    ks = [Knob("schedule", "choice", "The OGD step-size schedule: strongly_convex_capped eta_t = min(1/(mu t), "
                                     "2/(beta + mu)), every record deletable; strongly_convex eta_t = 1/(mu t) (the first "
                                     "restart_prefix steps restart the model when forgotten); convex_constant a "
                                     "constant eta; regularized_convex OGD on f + (lambda/2)||z||^2 with lambda from "
                                     "horizon and max_deletions (000 Thm 3.4); adaptive AdaGrad-norm steps.",
               default=default_schedule, choices=PASSIVE_SCHEDULES)]
    if noise:
        ks += [Knob("allocation", "choice", "How the privacy budget is spent over deletions: omega_series (any number "
                                            "of deletions, the i-th charged rho (omega-1)/(omega i^omega)), uniform "
                                            "(max_deletions deletions, rho/k each; a forget beyond restarts the model) "
                                            "or group (the noise is topped up to what the group of records forgotten "
                                            "so far needs; docs/passive_group_allocation.md).",
                    default="omega_series", choices=ALLOCATIONS),
               Knob("omega", "number", "The omega series' exponent: larger spends more of the budget on the first "
                                       "deletions.", default_note="1.2 (1.5 with schedule adaptive)", minimum=1.0,
                    exclusive_minimum=True, only_when=(("allocation", ("omega_series",)),))]
    if restart:
        need_k: tuple = ()
    elif noise:
        need_k = (("allocation", ("uniform",)), ("schedule", ("regularized_convex",)))
    else:
        need_k = (("schedule", ("regularized_convex",)),)
    ks += [Knob("max_deletions", "integer", "The number of deletions k the model is calibrated for: the uniform "
                                            "allocation's capacity, and regularized_convex's lambda = sqrt(log T + "
                                            "2k)/sqrt(T)." + (" The restart rule (000 Alg. 3) uses it too." if restart
                                                              else ""),
                minimum=1, required=restart, required_when=need_k),
           Knob("eta", "number", "The constant step size; at most 2/beta (non-expansive steps, 001 Cor. 1), beta the "
                                 "loss's smoothness from the declared bounds.", default_note="1/beta", minimum=0.0,
                exclusive_minimum=True, nullable=True, only_when=(("schedule", ("convex_constant",)),)),
           Knob("horizon", "integer", "The stream length T regularized_convex calibrates lambda for (000 Thm 3.4).",
                minimum=2, only_when=(("schedule", ("regularized_convex",)),),
                required_when=(("schedule", ("regularized_convex",)),)),
           Knob("capped", "boolean", "Cap the step at 2/(beta + mu) (regularized_convex) or 2/beta (adaptive), so "
                                     "that every record is deletable; false is the paper's schedule.",
                default=default_capped, only_when=(("schedule", ("regularized_convex", "adaptive")),)),
           Knob("p0", "number", "AdaGrad-norm's initial accumulator p(0) (001 Thm 4).", default_note="L^2", minimum=0.0,
                exclusive_minimum=True, nullable=True, only_when=(("schedule", ("adaptive",)),)),
           HUBER_DELTA]
    return tuple(ks)


_PASSIVE_RULES = (
    Rule("schedules strongly_convex_capped and strongly_convex need l2 > 0 (mu = l2)", ("l2", "hyperparameters.schedule")),
    Rule("eta <= 2/beta, beta the loss's smoothness from the declared bounds", ("hyperparameters.eta",)),
    Rule("with capped = false and schedule adaptive, p0 >= beta^2 D^2/4", ("hyperparameters.p0",)),
    Rule("allocation uniform needs max_deletions", ("hyperparameters.max_deletions",)),
)

PASSIVE = KnobTable(_passive_knobs(default_schedule="strongly_convex_capped", default_capped=True, noise=True,
                                   restart=False) + LIMIT_KNOBS, ALL_LOSSES, _PASSIVE_RULES)
RESTART = KnobTable(
    _passive_knobs(default_schedule="regularized_convex", default_capped=False, noise=True, restart=True)
    + (Knob("c", "number", "The restart rule's constant (000 Alg. 3, the paper's unspecified constant): larger c "
                           "restarts less often, with more noise.", default=1.0, minimum=0.0, exclusive_minimum=True),)
    + LIMIT_KNOBS, ALL_LOSSES, _PASSIVE_RULES)
DISCARD = KnobTable(_passive_knobs(default_schedule="strongly_convex_capped", default_capped=True, noise=False,
                                   restart=False) + LIMIT_KNOBS, ALL_LOSSES, _PASSIVE_RULES[:2])


# ---- the families that descend on retained data (000 Alg. 2; 001 Alg. 3) -----------------------------------------
_DESCENT = (
    Knob("schedule", "choice", "The OGD schedule between deletions: eta_t = min(1/(mu t), 2/(beta + mu)).",
         default=DESCENT_SCHEDULES[0], choices=DESCENT_SCHEDULES),
    Knob("omega", "number", "The omega series' exponent (the i-th deletion is charged rho (omega-1)/(omega i^omega)).",
         default=1.2, minimum=1.0, exclusive_minimum=True),
    Knob("max_gd_steps", "integer", "The most gradient-descent passes over the retained data one deletion may run.",
         default=DEFAULT_MAX_GD_STEPS, minimum=0, maximum=1_000_000),
)
ACTIVE = KnobTable((Knob("variant", "choice", "two_phase: descend on the retained data's average, then noise (keeps "
                                              "the exact retrain's accuracy, docs/accuracy.md); single: 000 Alg. 2's "
                                              "descent on one anchor example.", default="two_phase",
                         choices=ACTIVE_VARIANTS),) + _DESCENT + (HUBER_DELTA,) + LIMIT_KNOBS, ALL_LOSSES, (L2_RULE,))
SECOND_ORDER = KnobTable(_DESCENT + (
    Knob("gd_tolerance", "number", "The warm-started descent stops when its gradient norm is below this fraction of "
                                   "the Newton step's bound.", default=DEFAULT_GD_TOLERANCE, minimum=0.0, maximum=1.0,
         exclusive_minimum=True),
    Knob("solver", "choice", "The Newton system's solve: direct (dense LAPACK), cg (conjugate gradient) or auto "
                             "(direct while the p x p system is small).", default="auto", choices=SOLVERS),
) + LIMIT_KNOBS, ("logistic", "squared", "softmax"), (L2_RULE,),
    loss_note="the Newton removal step needs a loss with a Lipschitz Hessian (huber has none)")


# ---- exact families on OGD (retrain, sisa) ---------------------------------------------------------------------
_EXACT_SCHEDULE = Knob("schedule", "choice", "The OGD schedule: eta_t = min(1/(mu t), 2/(beta + mu)).",
                       default="strongly_convex_capped", choices=("strongly_convex_capped",))
RETRAIN = KnobTable((_EXACT_SCHEDULE, HUBER_DELTA) + LIMIT_KNOBS, ALL_LOSSES, (L2_RULE,))
SISA = KnobTable((_EXACT_SCHEDULE, HUBER_DELTA,
                  Knob("shards", "integer", "S independent shard models; a forget replays one shard.",
                       default_note="ceil(sqrt(max_records) / 16) within [8, 1024]; 8 without max_records",
                       minimum=1, maximum=MAX_SHARDS),
                  Knob("slices", "integer", "Checkpoints per shard over max_records: a forget replays from the "
                                            "record's slice.", default=DEFAULT_SLICES, minimum=1, maximum=MAX_SLICES))
                 + LIMIT_KNOBS, ALL_LOSSES, (L2_RULE,))


# ---- exact_ridge (Cao & Yang 2015) --------------------------------------------------------------------------------
EXACT_RIDGE = KnobTable((
    Knob("deletion_features", "choice", "client: the model keeps no data and the client resends a forgotten record's "
                                        "x (or features) and y in the unlearn's examples; retained: the service keeps "
                                        "the records sealed and forgets by id.", default="client",
         choices=RIDGE_DELETION_FEATURES),
    Knob("publication", "choice", "exact: the published weights are solved from the exact sums (an observer of two "
                                  "versions reads a forgotten record off them; docs/receipts.md); private: every "
                                  "release is solved from the sums plus binary-tree discrete Gaussian noise, "
                                  "(epsilon, delta)-DP over release_horizon releases, charged at creation.",
         default="exact", choices=PUBLICATIONS),
    Knob("release_horizon", "integer", "The releases a private model will publish (the privacy cost is charged for "
                                       "them at creation); past it a learn is refused, forgets still answer.",
         minimum=1, maximum=MAX_RELEASE_HORIZON, only_when=(("publication", ("private",)),),
         required_when=(("publication", ("private",)),)),
    Knob("release_every", "integer", "A private model releases new weights every this many write requests.",
         default=1, minimum=1, maximum=MAX_RELEASE_HORIZON, only_when=(("publication", ("private",)),)),
    Knob("grid_bits", "integer", "Bits of the public fixed-point grid the integer sums are kept on.",
         default_note=f"{DEFAULT_GRID_BITS} ({PRIVATE_GRID_BITS} with publication private)",
         minimum=GRID_BITS[0], maximum=GRID_BITS[1]),
    Knob("l2_selection", "choice", "fixed: the penalty is l2; gcv: chosen by generalised cross-validation from the "
                                   "integer sums alone over l2 10^(j/4), j = 0..32 (still exact after forgets; it "
                                   "minimises squared error, not accuracy).", default="fixed", choices=L2_SELECTION),
) + LIMIT_KNOBS, ("squared",), (Rule("needs l2 > 0 (the ridge penalty)", ("l2",)),
                                Rule("l2_selection gcv needs publication exact",
                                     ("hyperparameters.l2_selection",))),
    loss_note="least squares: ridge regression, or least-squares classification with n_classes or classes")


# ---- descent-to-delete (002) -------------------------------------------------------------------------------------
D2D = KnobTable((
    Knob("variant", "choice", "002's algorithms: secret (Alg. 1, published and secret state), perfect (the whole state "
                              "indistinguishable), regularized_strong / regularized_weak (convex losses through "
                              "regularisation), distributed (Alg. 4 with reservoir sampling).", default="secret",
         choices=D2D_VARIANTS),
    Knob("iterations", "integer", "Gradient-descent iterations per update.",
         default_note="secret: from the loss's condition number; perfect: I_min of Thm 3.2; distributed 2; "
                      "regularized 25", minimum=1),
    Knob("xi", "number", "The regularized_weak and distributed variants' xi (Remark 3.6; Thm 4.5: [1, 4/3]).",
         default=1.0, minimum=1.0),
    Knob("beta", "number", "The accuracy failure probability of the bounds.", default=0.05, minimum=0.0,
         maximum=1.0, exclusive_minimum=True, exclusive_maximum=True),
    Knob("selection", "choice", "The distributed variant's choice among its models (other variants: min_loss).",
         default="min_loss", choices=SELECTIONS),
    Knob("regularization", "number", "The regularized variants' regularisation strength.",
         default_note="from the variant's theorem", minimum=0.0, exclusive_minimum=True, nullable=True,
         only_when=(("variant", ("regularized_strong", "regularized_weak")),)),
    Knob("retrain_when_cheaper", "boolean", "Retrain exactly instead when that is cheaper than the descent.",
         default=True),
    Knob("chunk_size", "integer", "Records per chunk of the retained data a pass streams.", default=4096, minimum=1),
    HUBER_DELTA,
) + LIMIT_KNOBS, ALL_LOSSES, (
    Rule("variants secret, perfect and distributed need l2 > 0", ("l2", "hyperparameters.variant")),
    Rule("distributed needs xi in [1, 4/3]", ("hyperparameters.xi",)),
    Rule("selection other than min_loss is for variant distributed only", ("hyperparameters.selection",)),
    Rule("perfect needs iterations >= I_min (Thm 3.2)", ("hyperparameters.iterations",)),
))


# ---- rewind / descend (004) --------------------------------------------------------------------------------------
REWIND = KnobTable((
    Knob("variant", "choice", "rewind (R2D: rewind to a secret checkpoint K steps back and re-run) or descend "
                              "(SGD-D2D: K more steps from the final iterate; strongly convex only).",
         default="rewind", choices=REWIND_VARIANTS),
    Knob("projected", "boolean", "Projected SGD (PSGD-R2D) or not.", default_note="true for rewind, false for descend"),
    Knob("regime", "choice", "Which of 004's bounds certifies the model.",
         default_note="strongly_convex when l2 > 0, else convex", choices=REGIMES),
    Knob("T", "integer", "SGD steps of a training.", default=1000, minimum=1),
    Knob("K", "integer", "Steps re-run (rewind) or added (descend) at a deletion.", default_note="max(1, T // 4)",
         minimum=0, nullable=True),
    Knob("sigma_target", "number", "Choose K at training time as the fewest steps that reach this noise scale "
                                   "(rewind only; instead of K).", minimum=0.0, exclusive_minimum=True, nullable=True),
    Knob("batch_size", "integer", "Minibatch size b.", default=32, minimum=1),
    Knob("eta", "number", "The SGD step size; at most the regime's limit.", default_note="the regime's largest step",
         minimum=0.0, exclusive_minimum=True),
    Knob("m_max", "integer", "Deletions per training before a retrain is required.", default=10, minimum=1),
    Knob("initial_size", "integer", "Examples held before the first training.", default=256, minimum=2),
    Knob("learn_policy", "choice", "queue: later examples wait for the next retrain; retrain: every learn retrains.",
         default="queue", choices=LEARN_POLICIES),
    Knob("calibration", "choice", "The Gaussian mechanism's calibration: analytic, or classical (epsilon < 1).",
         default="analytic", choices=CALIBRATIONS),
    HUBER_DELTA,
) + LIMIT_KNOBS, ALL_LOSSES, (
    Rule("give either K or sigma_target, not both", ("hyperparameters.K", "hyperparameters.sigma_target")),
    Rule("rewind needs K <= T", ("hyperparameters.K", "hyperparameters.T")),
    Rule("descend is unprojected and strongly convex only; regime strongly_convex needs l2 > 0",
         ("hyperparameters.projected", "hyperparameters.regime", "hyperparameters.variant", "l2")),
    Rule("sigma_target is for variant rewind only", ("hyperparameters.sigma_target",)),
    Rule("eta <= the regime's step-size limit; nonconvex needs (1 + eta L)^T finite",
         ("hyperparameters.eta", "hyperparameters.T")),
    Rule("calibration classical needs epsilon < 1", ("hyperparameters.calibration", "privacy.epsilon")),
))


# ---- the memory pair (003) ---------------------------------------------------------------------------------------
MEMORY_PAIR = KnobTable((
    Knob("memory", "integer", "Curvature pairs the online L-BFGS keeps.", default=10, minimum=1, maximum=10_000),
    Knob("initial_curvature", "number", "m0 of the initial matrix M0 = m0 I (\"shanno_phua\" is refused: measured "
                                        "under-noised, docs/memory_pair.md).", default=1e-3, minimum=0.0,
         maximum=1.0, exclusive_minimum=True,
         refused=(("shanno_phua", "with it the corrected model was measured up to 1.25 Delta away from the replay "
                                  "without the record (bench/memory_pair/memory_pair_replay.py), so its certificate "
                                  "would be false"),)),
    Knob("burn_in", "integer", "Plain gradient steps before the quasi-Newton steps; \"auto\" = ceil(beta/lambda), the "
                               "least that is certified.", default="auto", choices=("auto",), minimum=0,
         maximum=10**9),
    Knob("step", "choice", "The step-size rule.", default="strongly_convex", choices=MP_STEPS),
    Knob("capacity", "integer", "Deletions the zCDP odometer certifies (m).", default=32, minimum=1, maximum=10_000),
    Knob("deletion_features", "choice", "retained: the service keeps the records sealed; client: the client resends "
                                        "a forgotten record's features.", default="retained",
         choices=MP_DELETION_FEATURES),
    Knob("inference_gate", "boolean", "Refuse predictions while the model's accuracy guarantee does not hold yet.",
         default=False),
    Knob("gamma", "number", "The inference gate's accuracy target.", default=0.5, minimum=0.0, exclusive_minimum=True),
    Knob("delta_b", "number", "The gate's failure probability.", default=0.05, minimum=0.0, maximum=1.0,
         exclusive_minimum=True, exclusive_maximum=True),
    Knob("removal", "choice", "loo: the leave-one-out removal step; full: the full-batch one.", default="loo",
         choices=REMOVALS),
    HUBER_DELTA,
) + LIMIT_KNOBS, ("logistic", "squared", "huber"), (
    L2_RULE,
    Rule("burn_in, when an integer, >= ceil(beta/lambda) (smaller was measured under-noised)",
         ("hyperparameters.burn_in",)),
), loss_note="its deletion certificate is measured, not proven, and only for the scalar-score losses")


# ---- the online DP tree baseline (Guha Thakurta & Smith 2013) ---------------------------------------------------
DP_TREE = KnobTable((
    Knob("horizon", "integer", "The stream length T the whole budget is charged for at creation.", minimum=1,
         maximum=MAX_HORIZON, required=True),
    Knob("max_deletions", "integer", "Records the model is private for (group privacy over k); the forget beyond "
                                     "restarts it.", minimum=1, required=True),
    Knob("lambda", "number", "FTRL's regularisation.", default_note="sqrt(2 T L (L + sigma sqrt((d+1) levels))) / R",
         minimum=0.0, exclusive_minimum=True, nullable=True),
    Knob("group_privacy", "choice", "proposition_1: the papers' group privacy of RDP; gaussian_group: the tighter "
                                    "derived one.", default="proposition_1", choices=GROUP_PRIVACY),
    Knob("variant", "choice", "convex (strongly_convex is withdrawn at creation; models created with it still load).",
         default="convex", choices=("convex",)),
    HUBER_DELTA,
) + LIMIT_KNOBS, ALL_LOSSES, (Rule("max_deletions <= horizon", ("hyperparameters.max_deletions",)),))


TABLES: dict[str, KnobTable] = {
    "passive_olu": PASSIVE, "passive_olu_restart": RESTART, "discard_and_restart": DISCARD, "active_olu": ACTIVE,
    "second_order_olu": SECOND_ORDER, "retrain": RETRAIN, "sisa": SISA, "exact_ridge": EXACT_RIDGE,
    "descent_to_delete": D2D, "rewind_to_delete": REWIND, "memory_pair": MEMORY_PAIR, "online_dp_tree": DP_TREE,
}
