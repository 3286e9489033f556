"""The regret tables of docs/regret.md (``python -m bench.regret``); see bench/__init__.py."""
