"""The memory pair measurements (docs/memory_pair_regret_results.md, docs/memory_pair_replay_results.md)."""
