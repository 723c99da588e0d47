"""Load drafts made by ``eagle3.train`` into vLLM as EAGLE-3 speculators and measure their acceptance.

    PYTHONPATH=jobs python tests/perf/eagle3_vllm_acceptance.py TARGET_DIR DATA_DIR DRAFT_DIR [DRAFT_DIR ...]

GPU hosts with vLLM (>= 0.18) only. For each draft directory it starts vLLM's offline engine on the
target (token-id prompts, no tokenizer) with ``speculative_config={"method": "eagle3", "model":
DRAFT_DIR, "num_speculative_tokens": K}``, generates greedily from the first prompts of the
extraction in ``DATA_DIR`` (``prepared.safetensors``), and prints vLLM's own speculative-decoding
counters: drafts, draft tokens, accepted tokens, the acceptance rate per position, and the share of
generated tokens equal to a run without speculation.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import traceback


def metrics(llm) -> dict:
    out = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            out[m.name.split(":", 1)[1]] = getattr(m, "values", None) or getattr(m, "value", None)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target")
    ap.add_argument("data")
    ap.add_argument("drafts", nargs="+")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("-k", type=int, default=3, help="num_speculative_tokens")
    args = ap.parse_args()

    import torch
    from safetensors.torch import load_file
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prep = load_file(f"{args.data}/prepared.safetensors")
    ids, offs = prep["token_ids"], prep["offsets"].tolist()
    prompts = [ids[offs[i]:min(offs[i + 1], offs[i] + args.prompt_len)].tolist()
               for i in range(min(args.prompts, len(offs) - 1))]
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
    common = {"model": args.target, "skip_tokenizer_init": True, "enforce_eager": True,
              "gpu_memory_utilization": 0.3, "max_model_len": 1024, "disable_log_stats": False}

    def run(spec: dict | None):
        llm = LLM(**common, **({"speculative_config": spec} if spec else {}))
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
        toks = [list(o.outputs[0].token_ids) for o in outs]
        m = metrics(llm)
        del llm
        gc.collect()
        torch.cuda.empty_cache()
        return toks, m

    plain, _ = run(None)
    results = {}
    for d in args.drafts:
        try:
            toks, m = run({"method": "eagle3", "model": d, "num_speculative_tokens": args.k})
        except Exception:  # noqa: BLE001 - report and go on with the next draft
            print(f"EAGLE3 {d}: failed\n{traceback.format_exc()}", flush=True)
            continue
        same = sum(a == b for x, y in zip(toks, plain, strict=False) for a, b in zip(x, y, strict=False)) / max(sum(map(len, plain)), 1)
        drafted = m.get("spec_decode_num_draft_tokens") or 0
        accepted = m.get("spec_decode_num_accepted_tokens") or 0
        per_pos = m.get("spec_decode_num_accepted_tokens_per_pos")
        n_drafts = m.get("spec_decode_num_drafts") or 0
        r = {"drafts": n_drafts, "draft_tokens": drafted, "accepted": accepted,
             "acceptance": accepted / drafted if drafted else None,
             "acceptance_per_pos": [a / n_drafts for a in per_pos] if per_pos and n_drafts else per_pos,
             "mean_accepted_length": 1 + accepted / n_drafts if n_drafts else None,
             "same_tokens_as_plain": same}
        results[d] = r
        print(f"EAGLE3 {d}: {json.dumps(r)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
