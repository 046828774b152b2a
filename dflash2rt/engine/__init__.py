"""The decode engine: prefill, then draft → select → verify → accept → commit per step."""
