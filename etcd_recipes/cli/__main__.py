"""``python -m etcd_recipes.cli``."""

from . import main

main()
