"""A ``@triton.jit`` kernel for tests/test_triton_compiles.py (Triton reads a kernel's source
from its file). Shaped like Model Runner V2's sampling kernels: a masked load, a reduction, a
store, one ``constexpr`` block size."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def log_softmax_row(out_ptr, logits_ptr, vocab_size, BLOCK_SIZE: tl.constexpr):
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < vocab_size
    logits = tl.load(logits_ptr + offsets, mask=mask, other=float("-inf")).to(tl.float32)
    shifted = logits - tl.max(logits)
    lse = tl.log(tl.sum(tl.where(mask, tl.exp(shifted), 0.0)))
    tl.store(out_ptr + offsets, shifted - lse, mask=mask)
