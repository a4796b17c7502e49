"""Kernel Forge engine: everything that is not UI (capture, cards, store, search, lanes, cast)."""

__version__ = "0.1.0"
