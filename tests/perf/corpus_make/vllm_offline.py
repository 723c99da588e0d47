"""Offline vLLM generation over token-id prompts (the models have no tokenizer).

    python3 vllm_offline.py MODEL [KEY=VALUE ...]     # extra LLM(...) arguments, values as Python literals
"""
import ast
import sys

from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

model, extra = sys.argv[1], dict(a.split("=", 1) for a in sys.argv[2:])
kwargs = {k: ast.literal_eval(v) for k, v in extra.items()}
llm = LLM(model=model, skip_tokenizer_init=True, max_model_len=2048, enforce_eager=True, **kwargs)
prompts = [TokensPrompt(prompt_token_ids=list(range(10 + i, 10 + i + 16 * (i + 1)))) for i in range(8)]
outputs = llm.generate(prompts, SamplingParams(max_tokens=32, detokenize=False))
for i, out in enumerate(outputs):
    print(f"prompt {i}: {len(out.prompt_token_ids)} tokens -> {out.outputs[0].token_ids[:8]}...", flush=True)
print(f"generated {sum(len(o.outputs[0].token_ids) for o in outputs)} tokens for {len(outputs)} prompts", flush=True)
