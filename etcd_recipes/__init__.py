"""etcd-recipes: asyncio-native distributed coordination recipes over etcd v3."""
