"""Growth-curve families for ``benchmarks/scale.py``: one module each, ``run(ctx, sizes)``."""
