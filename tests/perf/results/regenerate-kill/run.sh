#!/bin/bash
# regeneration: uninterrupted, then SIGKILL at 11/16 answers and a relaunch; prints timings and cmp.
set -u
cd /work/wt52
export PYTHONPATH=jobs PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
M=/tmp/try_spec/tiny-test-model
A="--model $M --prompts jobs/data/prompts.jsonl --max-samples 16 --max-new-tokens 24"
rm -rf /tmp/wt52-regen/a* /tmp/wt52-regen/b*
t0=$(date +%s.%N); .venv/bin/python -m eagle3.regenerate $A --out /tmp/wt52-regen/a.jsonl > /tmp/wt52-regen/a.log 2>&1; t1=$(date +%s.%N)
echo "uninterrupted: $(echo "$t1 - $t0" | bc) s; $(grep '^regenerate:' /tmp/wt52-regen/a.log)"
t0=$(date +%s.%N)
setsid .venv/bin/python -m eagle3.regenerate $A --out /tmp/wt52-regen/b.jsonl > /tmp/wt52-regen/b1.log 2>&1 &
pid=$!
until grep -q "regenerate progress: 11/16" /tmp/wt52-regen/b1.log; do sleep 0.05; done
kill -9 -- -$pid; wait $pid 2>/dev/null; t1=$(date +%s.%N)
echo "killed at 11/16 after $(echo "$t1 - $t0" | bc) s; output file exists: $(test -e /tmp/wt52-regen/b.jsonl && echo yes || echo no); journal lines: $(wc -l < /tmp/wt52-regen/b.jsonl.parts/shard-0-of-1.jsonl)"
t0=$(date +%s.%N); .venv/bin/python -m eagle3.regenerate $A --out /tmp/wt52-regen/b.jsonl > /tmp/wt52-regen/b2.log 2>&1; t1=$(date +%s.%N)
echo "relaunch: $(echo "$t1 - $t0" | bc) s; $(grep 'resume' /tmp/wt52-regen/b2.log); $(grep '^regenerate:' /tmp/wt52-regen/b2.log)"
cmp /tmp/wt52-regen/a.jsonl /tmp/wt52-regen/b.jsonl && echo "final file identical to the uninterrupted run's ($(wc -c < /tmp/wt52-regen/a.jsonl) bytes)"
