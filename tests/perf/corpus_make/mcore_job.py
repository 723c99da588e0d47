"""megatron-core's simple GPT training loop (examples/run_simple_mcore_train_loop.py of Megatron-LM) run on
CPU over gloo under torchrun, for the probe corpus.  Modes:

    train      GPTModel (local layer spec, tensor parallel over the ranks) trained for a few iterations
               with the pipeline schedule's forward_backward_func, then a distributed checkpoint saved
    cuda-seed  the example's own start, model_parallel_cuda_manual_seed(), on a machine without a GPU
    tp-heads   a TransformerConfig whose attention heads do not divide by the tensor-parallel size

    torchrun --nproc_per_node 2 mcore_job.py MODE
"""

from __future__ import annotations

import os
import sys
from functools import partial

import torch
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.pipeline_parallel.schedules import get_forward_backward_func
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer.transformer_config import TransformerConfig

SEQ, VOCAB, MICRO = 64, 128, 8


def init(tp: int) -> None:
    torch.distributed.init_process_group(backend="gloo")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=1)


def model(heads: int) -> GPTModel:
    config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=heads, use_cpu_initialization=True,
                               pipeline_dtype=torch.float32)
    return GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=VOCAB,
                    max_sequence_length=SEQ)


def batches():
    gen = torch.Generator().manual_seed(0)
    while True:
        tokens = torch.randint(0, VOCAB, (MICRO, SEQ + 1), generator=gen)
        yield {"tokens": tokens[:, :-1], "labels": tokens[:, 1:],
               "position_ids": torch.arange(SEQ).expand(MICRO, SEQ),
               "attention_mask": torch.ones(MICRO, 1, SEQ, SEQ, dtype=torch.bool).tril().logical_not(),
               "loss_mask": torch.ones(MICRO, SEQ)}


def forward_step(data, gpt):
    batch = next(data)

    def loss_func(loss_mask, output):
        loss = torch.sum(output.float().view(-1) * loss_mask.view(-1)) / loss_mask.sum()
        return loss, {"lm loss": loss}

    out = gpt(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])
    return out, partial(loss_func, batch["loss_mask"])


def train(iterations: int) -> None:
    torch.manual_seed(123)
    gpt = model(heads=4)
    optim = torch.optim.Adam(gpt.parameters(), lr=1e-3)
    step = get_forward_backward_func()
    data = batches()
    for iteration in range(iterations):
        optim.zero_grad()
        losses = step(forward_step_func=forward_step, data_iterator=data, model=gpt, num_microbatches=1,
                      seq_length=SEQ, micro_batch_size=MICRO, decoder_seq_length=SEQ, forward_only=False)
        optim.step()
        print(f"Iteration {iteration}: Losses reduced: {losses}", flush=True)
    ckpt = os.environ.get("CKPT_DIR", "/tmp/mcore-corpus/ckpt")
    os.makedirs(ckpt, exist_ok=True)
    dist_checkpointing.save(sharded_state_dict=gpt.sharded_state_dict(prefix=""), checkpoint_dir=ckpt)
    print("Saved the distributed checkpoint to", ckpt, flush=True)


def main(mode: str) -> None:
    world = int(os.environ["WORLD_SIZE"])
    init(tp=world)
    if mode == "cuda-seed":
        model_parallel_cuda_manual_seed(123)
        train(5)
    elif mode == "tp-heads":
        model(heads=3)
    else:
        train(int(os.environ.get("ITERATIONS", "20")))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
