"""Dual-key Gumbel-max watermarking: keys, keyed values, watermarked draws and the detector."""
