"""A small PyTorch Lightning job (on one GPU where there is one), run to make real logs (see run_all.sh).

    python lit.py done         # 3 epochs, fit ends on max_epochs
    python lit.py oom          # a CUDA allocation far past the card in training_step at batch 40 of epoch 1
    python lit.py devices      # Trainer(devices=4) on a one-GPU machine
    python lit.py val-keyerror # validation_step reads a key the batch lacks (sanity check)
    python lit.py long         # 200 epochs, for a Ctrl-C part-way
"""

from __future__ import annotations

import sys

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(pl.LightningModule):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        x, y = batch
        if self.mode == "oom" and self.current_epoch == 1 and batch_idx == 40:
            torch.empty(400 * 2**30, dtype=torch.uint8, device=self.device)
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        if self.mode == "val-keyerror":
            batch = {"inputs": batch[0]}
            return self.net(batch["input_ids"])
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), prog_bar=True)
        return None

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def loaders() -> tuple[DataLoader, DataLoader]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 64, generator=g)
    y = x[:, :1] * 2 + 1
    return (DataLoader(TensorDataset(x[:3584], y[:3584]), batch_size=32, shuffle=True),
            DataLoader(TensorDataset(x[3584:], y[3584:]), batch_size=64))


def main() -> None:
    mode = sys.argv[1]
    pl.seed_everything(0)
    accelerator = "gpu" if mode == "devices" or torch.cuda.is_available() else "cpu"
    devices = 4 if mode == "devices" else 1
    trainer = pl.Trainer(accelerator=accelerator, devices=devices, max_epochs=200 if mode == "long" else 3, enable_checkpointing=True,
                         default_root_dir="/tmp/lit-" + mode)
    train, val = loaders()
    trainer.fit(Regressor(mode), train, val)


if __name__ == "__main__":
    main()
