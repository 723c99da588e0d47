"""A small training script under `accelerate launch`, run to make real logs (see run_all.sh).

    accelerate launch --num_processes 1 acc_train.py done
    accelerate launch --num_processes 1 acc_train.py bad-label   # a label past the classes at step 37
"""

from __future__ import annotations

import sys

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm


def main() -> None:
    mode = sys.argv[1]
    acc = Accelerator(mixed_precision="bf16")
    torch.manual_seed(0)
    x = torch.randn(6400, 32)
    y = (x[:, 0] > 0).long()
    if mode == "bad-label":
        y[37 * 64 + 5] = 7
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dl = DataLoader(TensorDataset(x, y), batch_size=64)
    model, opt, dl = acc.prepare(model, opt, dl)
    acc.print(f"training on {acc.device} with {acc.num_processes} process(es)")
    for epoch in range(2):
        for step, (xb, yb) in enumerate(tqdm(dl, desc=f"epoch {epoch}", disable=not acc.is_local_main_process)):
            if mode == "bad-label" and yb.max() >= 2:
                raise ValueError(f"label {int(yb.max())} out of range for 2 classes at step {step}")
            loss = nn.functional.cross_entropy(model(xb), yb)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
        acc.print(f"epoch {epoch}: loss {loss.item():.4f}")
    acc.wait_for_everyone()
    acc.save(acc.unwrap_model(model).state_dict(), "/tmp/acc_model.pt")
    acc.print("Saved model to /tmp/acc_model.pt")


if __name__ == "__main__":
    main()
