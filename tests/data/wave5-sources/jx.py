"""A small JAX job on one GPU, run to make real logs (see run_all.sh).

    python jx.py done    # 300 steps of SGD on a linear model, 'step N/300 loss X' every 50
    python jx.py oom     # at step 120, a jnp.ones far past the card
    python jx.py shape   # at step 1, a jitted matmul of mismatched shapes
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp


def main() -> None:
    mode = sys.argv[1]
    print(f"devices: {jax.devices()}", flush=True)
    key = jax.random.PRNGKey(0)
    w = jnp.zeros((128, 1))
    x = jax.random.normal(key, (1024, 128))
    y = x @ jnp.ones((128, 1))

    @jax.jit
    def step(w, x, y):  # noqa: ANN001, ANN202
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        return w - 0.01 * grad, loss

    total = 300
    for i in range(1, total + 1):
        if mode == "shape" and i == 1:
            x = x[:, :100]
        if mode == "oom" and i == 120:
            big = jnp.ones((200 * 2**30 // 4,), dtype=jnp.float32)
            big.block_until_ready()
        w, loss = step(w, x, y)
        if i % 50 == 0 or i == 1:
            print(f"step {i}/{total} loss {float(loss):.5f}", flush=True)
        time.sleep(0.005)
    print("Training complete!", flush=True)


if __name__ == "__main__":
    main()
