"""A tiny random-init Llama with a word-level tokenizer, written as a Hugging Face model folder (no
download) for the older-vLLM and SGLang start-up runs of other_runs.sh.

    python tiny_model_dir.py DIR [--v4-tokenizer-class]

transformers 5 names the tokenizer class "TokenizersBackend", which the 4.x releases cannot load;
--v4-tokenizer-class writes "PreTrainedTokenizerFast" instead, as transformers 4 would have.
"""
import json
import os
import sys

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

WORDS = ["the", "a", "model", "learns", "to", "read", "logs", "and", "find", "where", "each", "job", "failed", "or",
         "finished"]
vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>", *WORDS])}
tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                               unk_token="<unk>")
torch.manual_seed(0)
# vocab 256 (more rows than tokens) keeps the embedding a round size; 3 shards give a loading bar.
config = LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                     bos_token_id=1, eos_token_id=2, pad_token_id=0, torch_dtype="bfloat16")
LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(sys.argv[1], max_shard_size="2MB")
fast.save_pretrained(sys.argv[1])
# transformers 5 writes "dtype" and "rope_parameters"; the 4.x releases that older vLLM and SGLang pin read
# "torch_dtype" and "rope_theta", so both spellings go in.
path = os.path.join(sys.argv[1], "config.json")
with open(path) as f:
    saved = json.load(f)
saved.update(torch_dtype="bfloat16", rope_theta=10000.0)
with open(path, "w") as f:
    json.dump(saved, f, indent=2)
if "--v4-tokenizer-class" in sys.argv:
    path = os.path.join(sys.argv[1], "tokenizer_config.json")
    with open(path) as f:
        saved = json.load(f)
    saved["tokenizer_class"] = "PreTrainedTokenizerFast"
    with open(path, "w") as f:
        json.dump(saved, f, indent=2)
print("wrote", sys.argv[1], flush=True)
