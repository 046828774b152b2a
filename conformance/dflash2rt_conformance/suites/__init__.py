"""The conformance tests, one module per level (collected by ``pytest --pyargs dflash2rt_conformance``)."""
