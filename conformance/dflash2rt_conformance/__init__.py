"""dflash2rt-conformance: the cross-backend conformance suite.

A pytest plugin (``pytest --pyargs dflash2rt_conformance --dflash2rt-backend NAME``) and the
``dflash2rt conformance`` command. ``reference/`` is the float64 NumPy-only oracle; ``specs.py``
lists the declarative op specs; ``tolerances.py`` owns every tolerance; ``suites/`` holds the
levels L0 (reference self-check) to L4 (end to end) and the graph tests. Importing this package
does no work.
"""

__version__ = "0.1.0"
