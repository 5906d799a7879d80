"""The first-use kernel of the bare GPU check: a ``@triton.jit`` kernel (Triton reads a kernel's
source from its file) a serving step launches, as Model Runner V2 launches its logprobs kernel;
its first launch compiles it."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def scale_rows(out_ptr, in_ptr, n_cols, scale, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_cols
    values = tl.load(in_ptr + row * n_cols + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + offsets, values * scale, mask=mask)


def launch(x):
    """``scale_rows`` over ``x`` (2-D, on the device): no host synchronisation."""
    import torch

    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(x.shape[1])
    scale_rows[(x.shape[0],)](out, x, x.shape[1], 0.5, BLOCK_SIZE=block)
    return out
