"""Benchmarks that measure side by side in one run: target-only, speculative, and transformers."""
