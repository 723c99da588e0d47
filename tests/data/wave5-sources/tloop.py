"""A hand-written PyTorch loop (on the GPU if there is one) in several ways of ending, run to make real logs (see run_all.sh).

    python tloop.py done           # 5 epochs, 'epoch N/5 step M/100 loss X', then '=== Training Complete ==='
    python tloop.py oom-epoch      # the batch doubles each epoch until the card is full (epoch 3 or so)
    python tloop.py resume-chain   # resuming from a missing checkpoint: FileNotFoundError, re-raised from
    python tloop.py cleanup-chain  # an error while handling another (a KeyError in the except block)
    python tloop.py config-exit    # raise SystemExit with a message when the config names no dataset
    python tloop.py long           # 2000 steps, for the signal runs; 'iter N/2000' every 20
    python tloop.py ce-assert      # a class index past the logits on the GPU at step 12
    python tloop.py percent        # progress as 'Progress: N% (i/total)' then nothing: the process is killed
"""

from __future__ import annotations

import json
import sys
import time

import torch
from torch import nn


DEV = "cuda" if torch.cuda.is_available() else "cpu"


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 10)).to(DEV)


def train(steps_per_epoch: int, epochs: int, batch: int, grow: bool = False, fmt: str = "epoch") -> nn.Module:
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    total = steps_per_epoch * epochs
    for epoch in range(1, epochs + 1):
        for step in range(1, steps_per_epoch + 1):
            x = torch.randn(batch, 512, device=DEV)
            y = torch.randint(0, 10, (batch,), device=DEV)
            loss = nn.functional.cross_entropy(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            i = (epoch - 1) * steps_per_epoch + step
            if fmt == "epoch" and step % 25 == 0:
                print(f"epoch {epoch}/{epochs} step {step}/{steps_per_epoch} loss {loss.item():.4f}", flush=True)
            elif fmt == "iter" and i % 20 == 0:
                print(f"iter {i}/{total} | loss {loss.item():.4f} | {time.strftime('%H:%M:%S')}", flush=True)
            elif fmt == "percent" and i % (total // 20) == 0:
                print(f"Progress: {100 * i // total}% ({i}/{total})", flush=True)
            if fmt != "epoch":
                time.sleep(0.05)
        if grow:
            batch *= 64
            print(f"epoch {epoch} done, batch size now {batch}", flush=True)
    return m


def main() -> None:
    mode = sys.argv[1]
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0) if DEV == 'cuda' else 'cpu'}", flush=True)
    if mode == "done":
        m = train(100, 5, 256)
        torch.save(m.state_dict(), "/tmp/tloop.pt")
        print("=== Training Complete ===", flush=True)
    elif mode == "oom-epoch":
        train(100, 10, 4096, grow=True)
    elif mode == "resume-chain":
        path = "/tmp/runs/exp7/checkpoint-1200/state.pt"
        print(f"resuming from {path}", flush=True)
        try:
            torch.load(path)
        except FileNotFoundError as e:
            raise RuntimeError(f"cannot resume: checkpoint {path} is missing") from e
    elif mode == "cleanup-chain":
        state = {"step": 0}
        try:
            train(50, 1, 256)
            raise ConnectionError("metrics server at 127.0.0.1:9 refused the connection")
        except ConnectionError:
            print(json.dumps(state), flush=True)
            print(state["last_checkpoint"])
    elif mode == "config-exit":
        cfg = {"model": "tiny", "lr": 0.01}
        print(f"config: {cfg}", flush=True)
        if "dataset" not in cfg:
            raise SystemExit("error: config has no 'dataset' entry; nothing to train on")
    elif mode == "long":
        train(2000, 1, 256, fmt="iter")
    elif mode == "percent":
        train(2000, 1, 256, fmt="percent")
    elif mode == "ce-assert":
        m = model()
        for step in range(1, 30):
            x = torch.randn(64, 512, device=DEV)
            y = torch.randint(0, 10 if step < 12 else 11, (64,), device=DEV)
            if step >= 12:
                y[0] = 10
            loss = nn.functional.cross_entropy(m(x), y)
            print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
