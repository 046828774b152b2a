"""dflash2rt-conformance: the cross-backend conformance suite (content arrives with issue 5)."""
