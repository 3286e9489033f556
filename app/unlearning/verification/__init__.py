"""The coupled-replay verification harness: replays a forget against retraining with shared randomness
(ARCHITECTURE.md §5)."""
