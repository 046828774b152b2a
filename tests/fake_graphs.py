"""A graph adapter for the CPU: capture runs the step body once, and a replay runs it again over
the same static buffers (what a device graph does, without one)."""

from __future__ import annotations


class Rerun:
    """A graph adapter whose graph runs the captured function again."""

    name = "rerun"

    def new_pool(self):
        return None

    def capture(self, fn, pool):
        fn()

        class Graph:
            def replay(self):
                fn()
        return Graph()
