"""Correctness: the cases every backend must pass, and running N ranks."""
