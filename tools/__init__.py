"""Developer tools of etcd-recipes (not shipped in the wheel)."""
