"""Vendored etcd APIs that ``aetcd.rpc`` does not cover (see ``v3lock.py``). Not public."""
