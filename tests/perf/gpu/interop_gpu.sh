#!/usr/bin/env bash
# Issue 18 on a GPU (one H200 is enough): `eagle3.extract --format speculators` through the vLLM backend on
# the 6.7B random Llama (big_model.py), then our trainer on one GPU reading that speculators-layout output.
# Figures: extraction tokens/s, training steps/s (and tokens/s); written to $OUT/interop.md for RESULTS.md.
# Run from the repo root on the GPU machine, after the vLLM wheels were copied (as for run_gpu.sh):
#   OUT=/some/dir bash tests/perf/gpu/interop_gpu.sh
# The speculators layout is a `datasets` directory: when the job python lacks `datasets`, it is installed
# from $INTEROP_WHEELS (default .vllm/interop; fill it on a networked machine with
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#       -d .vllm/interop datasets==5.1.0 dill==0.4.1 multiprocess==0.70.19 ).
# Knobs: N samples (256), MAXLEN tokens per sample (2048), STEPS training steps (200), BATCH (4).
set -uo pipefail
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TOKENIZERS_PARALLELISM=false
REPO=$(pwd)
OUT=${OUT:-/tmp/interop-out}
W=${WORK:-/tmp/interop}
N=${N:-256} MAXLEN=${MAXLEN:-2048} STEPS=${STEPS:-200} BATCH=${BATCH:-4}
INTEROP_WHEELS=${INTEROP_WHEELS:-$REPO/.vllm/interop}
JOBPY=$(command -v python3)
MODEL=/tmp/models/big-llama
mkdir -p "$OUT" "$W"
say() { echo "=== $(date +%T) $*"; }

say "vLLM"
[ -d /tmp/site/vllm ] || bash "$REPO/.vllm/part6/vllm-install.sh" || { echo "vLLM install failed"; exit 1; }
export PYTHONPATH=$REPO/jobs:/tmp/site:/tmp/site-interop
if ! $JOBPY -c "import datasets" 2>/dev/null; then
  say "datasets from $INTEROP_WHEELS"
  # --no-deps: the machine's image has pyarrow, pandas, xxhash and fsspec; the folder holds the rest
  # (datasets, dill, multiprocess).
  $JOBPY -m pip install -q --no-index --no-deps --target /tmp/site-interop "$INTEROP_WHEELS"/*.whl \
    || { echo "cannot install datasets: fill $INTEROP_WHEELS (see the header)"; exit 1; }
fi

say "6.7B random Llama"
$JOBPY "$REPO/tests/perf/gpu/big_model.py" "$MODEL" 2>&1 | tail -2

say "prompt set: $N token-id records of 256..$MAXLEN tokens (no tokenizer needed)"
$JOBPY - "$W/prompts.jsonl" "$N" "$MAXLEN" <<'PY'
import json, random, sys
path, n, maxlen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(18)
with open(path, "w") as f:
    for _ in range(n):
        t = rng.randint(256, maxlen)
        f.write(json.dumps({"token_ids": [1] + [rng.randrange(3, 32000) for _ in range(t - 1)]}) + "\n")
PY

say "A: extract --format speculators --backend vllm"
rm -rf "$W/hs"
t0=$(date +%s.%N)
$JOBPY -m eagle3.extract --backend vllm --model "$MODEL" --prompts "$W/prompts.jsonl" --out "$W/hs" \
  --format speculators --max-seq-len "$MAXLEN" --device cuda > "$OUT/extract.log" 2>&1
rc=$?; t1=$(date +%s.%N)
tail -3 "$OUT/extract.log"
[ $rc -eq 0 ] || { echo "extract failed ($rc)"; exit 1; }
ls "$W/hs" | head; ls "$W/hs/hidden_states" | wc -l

say "B: our trainer on one GPU, reading the speculators layout"
rm -rf "$W/draft"
$JOBPY -m eagle3.train --data "$W/hs" --out "$W/draft" --device cuda --max-steps "$STEPS" --batch-size "$BATCH" \
  --draft-vocab 32000 --log-every 10 --save-every 100 2>&1 | $JOBPY "$REPO/tests/perf/_stamp.py" stdin "$OUT/train.stamped"
cut -f2- "$OUT/train.stamped" > "$OUT/train.log"
tail -3 "$OUT/train.log"

$JOBPY - "$OUT" "$t0" "$t1" "$W/hs/manifest.json" "$STEPS" "$BATCH" <<'PY'
import json, re, sys
out, t0, t1, manifest, steps, batch = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
m = json.load(open(manifest))
prog = [l for l in open(f"{out}/extract.log") if l.startswith("extract progress: ")]
loop_tps = float(re.search(r"([\d.]+) tok/s", prog[-1]).group(1)) if prog else float("nan")
rows = [l.rstrip("\n").split("\t", 1) for l in open(f"{out}/train.stamped")]
pts = [(float(t), int(mm.group(1)), float(mm.group(2))) for t, l in rows
       if (mm := re.match(r"train step (\d+)/\d+ .*tok/s=([\d.]+)", l))]
(ta, sa, _), (tb, sb, _) = pts[1], pts[-1]  # from the second line on: the first includes warm-up
steps_s = (sb - sa) / (tb - ta)
tok_s = sum(p[2] for p in pts[2:]) / max(len(pts) - 2, 1)
acc = [l for t, l in rows if l.startswith("train step ")][-1]
text = f"""### EAGLE-3 interop on one H200 (issue 18)

6.7B random Llama (hidden 4096, 32 layers, bf16), {m['num_samples']} token-id samples, {m['total_tokens']} tokens
(256..{max(m['seq_lens'])} per sample), layer ids {m['layer_ids']}.

| stage | figure |
|---|---|
| `eagle3.extract --backend vllm --format speculators` | {loop_tps:.0f} tok/s in the extraction loop; {m['total_tokens'] / (t1 - t0):.0f} tok/s over the whole run ({t1 - t0:.0f} s, model load included) |
| `eagle3.train --device cuda` on that output (batch {batch}, bf16 autocast) | {steps_s:.2f} steps/s, {tok_s:.0f} tok/s ({steps} steps) |

Last progress line: `{acc}`
Output layout: `{m.get('output_format')}` ({', '.join(m['files'].values())}).
"""
open(f"{out}/interop.md", "w").write(text)
print(text)
PY
