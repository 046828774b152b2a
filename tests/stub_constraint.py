"""Stand-in constraints for tests of code that only passes them along: ``Hook`` (a constraint
hook that allows everything) and ``Pattern`` (one built from a regex it remembers)."""

from __future__ import annotations

from dflash2rt.errors import InvalidInputError


class Hook:
    """A constraint hook of one's own."""

    def initial(self):
        return 0

    def allowed(self, state):
        return None

    def advance(self, state, token):
        return state


class Pattern(Hook):
    """A stand-in constraint that remembers the regex it was built from; "(" does not
    compile."""

    def __init__(self, pattern: str) -> None:
        if pattern == "(":
            raise InvalidInputError("the regex does not compile: missing )")
        self.pattern = pattern
