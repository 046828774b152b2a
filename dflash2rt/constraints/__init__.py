"""Constraint hooks (structured output): the per-request contract, the built-in token
automaton (from a regex or a token set), its device tables and the host's walk of it."""

from .automaton import Constraint, TokenAutomaton

__all__ = ["Constraint", "TokenAutomaton"]
