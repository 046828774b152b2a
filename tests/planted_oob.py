"""A planted out-of-bounds write, never run by the product: the device check's memcheck section
(and tests/test_memcheck.py on a machine with a GPU) run it under compute-sanitizer, which must
report it, or a clean memcheck elsewhere proves nothing. Exits 0 after the launch whether or not
the write was caught (the sanitizer's log is the evidence)."""

import sys

import torch
import triton
import triton.language as tl

PAST = 4096          # elements beyond the end: outside the allocation whatever its rounding


@triton.jit
def _write_past_end(out_ptr, n, PAST_END: tl.constexpr, BLOCK: tl.constexpr):
    offs = n + PAST_END + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, 1.0)           # no mask: every lane writes out of bounds


def main() -> int:
    if not torch.cuda.is_available():
        print("planted_oob: no CUDA device", file=sys.stderr)
        return 2
    x = torch.zeros(1000, device="cuda")
    _write_past_end[(1,)](x, x.numel(), PAST_END=PAST, BLOCK=128)
    try:
        torch.cuda.synchronize()
    except RuntimeError as exc:             # the sanitizer stops the kernel: an error here
        print(f"planted_oob: launch failed as expected under the sanitizer: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
