"""Replicas and workers (section ``scale``); see bench/__init__.py."""
