"""Durable per-user state: atomic JSON state files under a lock, the data directory,
settings and conversations."""
