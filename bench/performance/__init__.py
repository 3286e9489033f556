"""Throughput, latency, memory, cost (the default sections and the one-off probes); see bench/__init__.py."""
