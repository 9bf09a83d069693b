"""Loops of the model plane (docs/architecture.md §2): model semantics the runtime drives."""
