"""The runnable showcase of etcd-recipes (``make demo`` / ``python -m demo``)."""
