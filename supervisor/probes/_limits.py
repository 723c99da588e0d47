"""What one probe pack may cost, checked when it loads.

RE2 matches in time linear in text x pattern, but the pattern factor is not small: a valid
pack with a 100,000-character literal, 5,000 named groups or ``(.*){1,1000}$`` matched at
about 60 s per MB of log (on the event loop, for every job), and a pattern nested 400 groups
deep overflowed the recursion of ``_syntax``'s literal extractor after launch.  So a pack is
refused at load time, with one line naming the entry, when it is bigger than any real pack
needs.  The built-in packs (probes/*.toml), measured, and the limits, with room to spare:

    measure                          largest built-in               limit
    pattern length (characters)        328 (vllm.shards)             4,096
    longest literal run                 78 (vllm.kv_too_small_v0)    1,000
    named groups                         7 (vllm.shards)                32
    group nesting depth                  4 (vllm.cuda_graphs)           16
    RE2 program size                 4,490 (nccl.classify1)         10,000
    RE2 fanout (log2 bucket)             4 (tqdm.bar)                    8
    entries in one pack                 53 (vllm)                      300
    program size of one pack         5,262 (nccl)                   50,000

Fanout counts the branches an instruction opens; it is what makes ``(.*){1,900}$`` (bucket
13, 64 s/MB) slow where ``ProcessGroupNCCL.{0,200}timed out`` (size 1,829, bucket 3) runs at
0.02 s/MB.  ``(.*){1,30}$`` (bucket 8) still runs at 0.1 s/MB.
"""

from __future__ import annotations

from typing import Any

from supervisor.probes._syntax import _tokens

MAX_PATTERN_CHARS = 4096
MAX_LITERAL_CHARS = 1000
MAX_NAMED_GROUPS = 32
MAX_NESTING = 16
MAX_PROGRAM_SIZE = 10_000
MAX_FANOUT_BUCKET = 8
MAX_ENTRIES = 300
MAX_PACK_PROGRAM_SIZE = 50_000


def pattern_problem(pattern: str) -> str | None:
    """What makes ``pattern`` too costly to even compile and read, or None.  Checked before RE2."""
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"regex is {len(pattern)} characters long (limit {MAX_PATTERN_CHARS})"
    depth = deepest = run = longest = 0
    for token in _tokens(pattern):  # a flat loop: safe on any nesting
        if token.kind == "open":
            depth += 1
            deepest = max(deepest, depth)
        elif token.kind == "close":
            depth -= 1
        run = run + 1 if token.kind == "lit" else 0
        longest = max(longest, run)
    if deepest > MAX_NESTING:
        return f"regex nests groups {deepest} deep (limit {MAX_NESTING})"
    if longest > MAX_LITERAL_CHARS:
        return f"regex has a literal of {longest} characters (limit {MAX_LITERAL_CHARS})"
    return None


def program_problem(compiled: Any) -> str | None:
    """What makes a compiled RE2 pattern too costly to match, or None."""
    if len(compiled.groupindex) > MAX_NAMED_GROUPS:
        return f"regex has {len(compiled.groupindex)} named groups (limit {MAX_NAMED_GROUPS})"
    if compiled.programsize > MAX_PROGRAM_SIZE:
        return (f"regex compiles to {compiled.programsize} RE2 instructions (limit {MAX_PROGRAM_SIZE}); "
                "large counted repeats such as .{0,5000} cost the most")
    bucket = _top_bucket(compiled.programfanout)
    if bucket > MAX_FANOUT_BUCKET:
        return (f"regex is too costly to match (RE2 fanout bucket {bucket}, limit {MAX_FANOUT_BUCKET}); "
                "avoid repeating a group that can match anything, as in (.*){1,100}")
    return None


def _top_bucket(histogram: list[int]) -> int:
    return max((i for i, count in enumerate(histogram) if count), default=0)
