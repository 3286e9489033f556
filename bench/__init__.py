"""The benchmarks: ``python -m bench --sections ...`` (bench/__main__.py; nothing here is asserted by the tests).

Rooms, one package per section family; the shared helpers once in bench/common.py (timing, synthetic streams,
specs, number formats, ports).  The packages' ``__init__`` files hold a docstring only (no re-exports: a module
is imported from where it lives); no file is over 500 lines and the import graph has no circle
(tests/test_bench_layout.py, tests/test_layering.py).  ``python -m bench --render bench/results/results.json`` and
``python -m bench.regret --render bench/results/regret_last.pkl`` rewrite the generated docs from a saved run.

- bench/accuracy/: held-out accuracy before and after forgetting (section ``accuracy``), the same at 1e5 records
  with membership inference (``scale_accuracy``), the attack itself (membership.py) and the passive group
  allocation study (``python -m bench.accuracy.passive_group_allocation``).
- bench/performance/: engine throughput, HTTP ingest and latency, forget vs retrain, memory, noise, profiles,
  exact replay, JetStream ingest, cold start, tenant fairness, and the one-off cost probes run as modules
  (api_overhead, latency_probe, d2d_cost, rewind_cost, second_order_solve, write_path, profile_summary).
- bench/scale/: replicas and workers (section ``scale``).
- bench/regret/: the regret tables of docs/regret.md (``python -m bench.regret``).
- bench/memory_pair/: the memory pair's regret and replay-gap measurements (docs/memory_pair_*_results.md).
"""
