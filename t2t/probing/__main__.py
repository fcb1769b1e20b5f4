"""`python -m t2t.probing`: see `t2t.probing.run`."""
from t2t import cli

cli.run_module("t2t.probing.run")
