"""Compatibility namespace so the HyperParallel import lines work on CPU."""
