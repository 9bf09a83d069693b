"""Loops of the model plane (ARCHITECTURE.md §3): model semantics the runtime drives."""
