"""``python -m bench.regret``: the regret tables (bench/regret/regret.py's ``main``; its docstring has the options)."""
from .regret import main

main()
