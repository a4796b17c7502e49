"""The builtin offline proposer: kernel templates per op family (the default without an API key)."""

from engine.propose.builtin.proposer import BuiltinProposer, all_templates

__all__ = ["BuiltinProposer", "all_templates"]
