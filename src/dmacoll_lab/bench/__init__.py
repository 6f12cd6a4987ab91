"""Benchmarks: timing helpers, provenance, sweeps."""
