"""Test and demo helpers: tiny random checkpoints made offline (no hub)."""
