"""Builders of the reference models (random weights, real per-layer shapes, nothing downloaded)."""
