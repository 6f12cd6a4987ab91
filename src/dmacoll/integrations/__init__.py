"""Bridges from other frameworks to dmacoll's collectives (each imports without its framework installed)."""
