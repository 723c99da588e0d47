"""CuPy FFTs over growing arrays until the card is full; run to make a real log."""

from __future__ import annotations

import cupy as cp

arrays = []
for i in range(1, 40):
    n = 2**30 * i // 2
    print(f"round {i}/39: allocating {n * 8 / 2**30:.1f} GiB", flush=True)
    a = cp.ones(n, dtype=cp.complex64)
    arrays.append(cp.fft.fft(a[: 2**20]))
    arrays.append(a)
print("finished all rounds")
