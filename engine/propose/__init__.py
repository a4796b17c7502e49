"""Proposers: where candidate kernels come from (LLM providers, the builtin templates, replay)."""
