"""A Triton kernel with a shape error in its body, compiled at first launch; run to make a real log."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def scale(x_ptr, out_ptr, n, BLOCK: tl.constexpr):  # noqa: ANN001, ANN201, N803
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    y = tl.reshape(x, (BLOCK, 3))
    tl.store(out_ptr + offs, y, mask=offs < n)


def main() -> None:
    x = torch.randn(4096, device="cuda")
    out = torch.empty_like(x)
    print("launching scale kernel", flush=True)
    scale[(4,)](x, out, x.numel(), BLOCK=1024)
    torch.cuda.synchronize()
    print("done")


if __name__ == "__main__":
    main()
