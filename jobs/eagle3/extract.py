"""EAGLE-3 hidden-state extraction: ``PYTHONPATH=jobs python -m eagle3.extract [options]``.

With no options it builds the embedded tiny model (once, into ``--cache-dir``), reads the shipped
prompt set and writes, into ``--out``:

* ``hs_{i}.safetensors`` per sample i: ``hidden_states`` bf16 ``[seq_len, n_layers, hidden]`` (the
  layer ids in ascending order, vLLM numbering), ``token_ids`` int64 ``[seq_len]``, ``loss_mask``
  uint8 ``[seq_len]``; written to a temporary name and renamed, so it exists only when complete;
* ``manifest.json``: model, layer ids, the model's layer count, hidden size, dtype, sample count,
  per-sample seq_len, status; rewritten (atomically) at start and at the end;
* ``token_freq.safetensors``: ``token_freq`` (counts over loss-masked tokens) and
  ``token_freq_all`` (over all tokens), int64 ``[vocab]``, for the draft vocabulary;
* ``prepared.safetensors``: the tokenised set (``token_ids``, ``loss_mask`` concatenated,
  ``offsets`` [N+1]).

A sample is finished iff its ``hs_{i}.safetensors`` exists and is complete; a relaunch skips
finished samples and never rewrites them. A relaunch with other settings (model, prompts,
max-seq-len or layer ids) into the same ``--out`` is refused.

Lines for the supervisor's probes (each flushed):
``extract phase: {model_init|extracting|verify}``, the weight loader's own bar (transformers:
``Loading weights``; vLLM: ``Loading safetensors checkpoint shards``),
``extract progress: {done}/{total} samples, {tok_s:.1f} tok/s`` after each batch,
``extract done: {n} samples, {tokens} tokens in {secs:.1f}s`` at the end; with ``--disk-budget``,
``extract paused: ...`` every ``--wait-report-s`` during each wait and ``extract resumed after ...`` at its end
(eagle3.budget). A full disk gives
``extract error: disk full writing {path}: free space and relaunch; finished samples are kept``
and exit code 75; NaN or Inf in a captured batch gives ``extract error: non-finite hidden states in
sample {i} at layer {k}: ...`` and exit code 65 (eagle3.finite); samples that failed for good (vLLM backend) give
``extract incomplete: ...`` and exit code 3. Other errors raise (a Python traceback).
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import _io, budget, draft_export, finite, formats, shards, staging
from . import data as data_mod
from .tiny_model import DEFAULT_PROMPTS

EXIT_INCOMPLETE = 3
EXIT_DISK_FULL = 75  # EX_TEMPFAIL: relaunching after freeing space continues the run
EXIT_CONFIG = 78  # EX_CONFIG: a layout that cannot be written as asked (one line says why)
EXIT_NONFINITE = 65  # EX_DATAERR: the model computed NaN or Inf; a relaunch would compute it again
FORMAT = "eagle3-hidden-states/1"
OUT_ROOT = Path(__file__).resolve().parents[2] / "out"  # the repository's out/ (git-ignored)


class OutputMismatch(RuntimeError):
    """--out holds an extraction made with other settings."""


class OutputBusy(RuntimeError):
    """Another extract process is writing to --out."""


class VerifyFailed(RuntimeError):
    """Stored hidden states differ from a transformers recomputation beyond the tolerance."""


def say(line: str) -> None:
    print(line, flush=True)


def default_layer_ids(num_layers: int) -> list[int]:
    """``2, L//2, L-3, L`` (vLLM numbering), de-duplicated, in range, ascending."""
    return sorted({k for k in (2, num_layers // 2, num_layers - 3, num_layers) if 0 <= k <= num_layers})


def parse_layer_ids(text: str | None, num_layers: int) -> list[int]:
    if not text:
        return default_layer_ids(num_layers)
    try:
        ids = [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise ValueError(f"--layer-ids must be comma-separated integers, got {text!r}") from None
    bad = [k for k in ids if not 0 <= k <= num_layers]
    if not ids or bad:
        raise ValueError(f"--layer-ids {text!r}: ids must lie in 0..{num_layers} (the model has {num_layers} layers)")
    if len(set(ids)) != len(ids):
        raise ValueError(f"--layer-ids {text!r}: repeated id")
    return sorted(ids)


def read_model_config(model_dir: str) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        what = "does not exist" if not Path(model_dir).exists() else "has no config.json"
        raise FileNotFoundError(f"--model {model_dir} {what}: a local model directory is needed (this job never "
                                "downloads); leave --model out for the embedded tiny model") from None


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    return cfg if "num_hidden_layers" in cfg else (cfg.get("text_config") or cfg)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m eagle3.extract",
                                 description="EAGLE-3 hidden-state extraction (hf or vllm backend).")
    ap.add_argument("--model", help="local model directory (default, or empty: the embedded tiny model, "
                                    "built once into --cache-dir)")
    ap.add_argument("--cache-dir", default=str(OUT_ROOT / "models"),
                    help="where the embedded tiny model is built (default %(default)s)")
    ap.add_argument("--prompts", default=str(DEFAULT_PROMPTS), help="JSONL prompt set (default: the shipped one)")
    ap.add_argument("--out", default=str(OUT_ROOT / "extract"), help="output directory (default %(default)s)")
    ap.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    ap.add_argument("--format", choices=[f.value for f in formats.Format], default=formats.Format.SUPERVISE.value,
                    help="output layout: supervise (ours), speculators (0.9) or specforge (0.2); see eagle3.formats")
    ap.add_argument("--layer-ids", help="comma-separated vLLM layer ids (default 2,L//2,L-3,L)")
    ap.add_argument("--max-seq-len", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, help="samples per batch (default: hf 4, vllm 128)")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="hf backend and --verify")
    ap.add_argument("--dtype", choices=("auto", "bfloat16", "float16", "float32"), default="auto",
                    help="hf compute dtype (default: the checkpoint's); output is always bf16")
    ap.add_argument("--max-samples", type=int, help="only the first N records of the prompt set")
    ap.add_argument("--verify", type=int, default=0, metavar="N",
                    help="recompute N finished samples with the hf backend and report per-layer errors")
    ap.add_argument("--verify-tol", type=float, default=0.05,
                    help="largest mean relative error --verify accepts (default %(default)s)")
    ap.add_argument("--trust-remote-code", action="store_true")
    ap.add_argument("--shard", type=int, default=0, help="this shard's index, 0..N-1 (eagle3.shards)")
    ap.add_argument("--num-shards", type=int, default=1,
                    help="N > 1: extract only this shard's batches (batch k when k %% N == --shard); then `gather`")
    ap.add_argument("--disk-budget", default="", metavar="SIZE",
                    help="pause while the sample files training has not consumed yet would pass SIZE (e.g. 2GiB, "
                         "500MB; empty: no budget); for a pipeline with `eagle3.train --order stream` (eagle3.budget)")
    ap.add_argument("--wait-report-s", default=str(budget.REPORT_S), metavar="S",
                    help="while paused on --disk-budget, say so every S seconds (default %(default)s; keep it under "
                         "the supervisor's stall floor and silence_s)")
    g = ap.add_argument_group("vllm backend")
    g.add_argument("--tensor-parallel-size", type=int, default=1)
    g.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    g.add_argument("--no-enforce-eager", dest="enforce_eager", action="store_false",
                   help="let vLLM compile and capture CUDA graphs (slower start-up)")
    g.add_argument("--file-timeout", type=float, default=120.0,
                   help="seconds to wait for a request's hidden-states file (default %(default)s)")
    g.add_argument("--max-consecutive-failures", type=int, default=8)
    g.add_argument("--force", action="store_true",
                   help="try what is known not to work on this vLLM (e.g. DeepSeek final layer)")
    args = ap.parse_args(argv)
    if args.batch_size is None:
        args.batch_size = 4 if args.backend == "hf" else 128
    if args.batch_size < 1 or args.max_seq_len < 1 or (args.max_samples is not None and args.max_samples < 1):
        ap.error("--batch-size, --max-seq-len and --max-samples must be positive")
    args.format = formats.Format(args.format)
    try:
        shards.check_args(args.shard, args.num_shards)
    except ValueError as e:
        ap.error(str(e))
    if args.num_shards > 1 and args.format is not formats.Format.SUPERVISE:
        ap.error("--num-shards writes --format supervise only; convert the gathered output with eagle3.export")
    try:
        args.disk_budget = budget.parse_size(args.disk_budget) if args.disk_budget.strip() else None
        args.wait_report_s = budget.parse_report_s(args.wait_report_s)
    except ValueError as e:
        ap.error(str(e))
    if args.disk_budget is not None:
        # Training consumes hs_{i}.safetensors in index order from one directory, and deletes what it consumed.
        if args.num_shards > 1:
            ap.error("--disk-budget works with one extraction process (no --num-shards): training consumes the "
                     "samples in index order, which shards write out of order")
        if args.format is not formats.Format.SUPERVISE:
            ap.error("--disk-budget writes --format supervise only (the files `eagle3.train --order stream` reads)")
        if args.verify:
            ap.error("--disk-budget cannot --verify: the samples it would recompute are deleted once consumed")
    if args.verify and args.format is formats.Format.SPECFORGE:
        ap.error("--verify compares the stored pre-norm layers, which --format specforge does not keep: "
                 "extract in another format and verify there (eagle3.export converts it afterwards)")
    return args


class Job:
    """The output directory and the bookkeeping the backends report to."""

    def __init__(self, out: Path, samples: list[data_mod.Sample], layer_ids: list[int], num_layers: int,
                 hidden: int, batch_size: int, writer: formats.Writer | None = None,
                 part: list[int] | None = None):
        self.out = out
        self.writer = writer or formats.Writer(out, layer_ids, num_layers, hidden)
        self.samples = samples  # indexed by global record index, whatever part this run extracts
        self.part = part if part is not None else [s.index for s in samples]  # a shard's part (eagle3.shards)
        self.total = len(self.part)
        self.layer_ids = layer_ids
        self.num_layers = num_layers
        self.hidden = hidden
        self.batch_size = batch_size
        self.done: set[int] = set()
        self.tokens_run = 0
        self.samples_run = 0
        self.t_loop: float | None = None
        self.budget: budget.Budget | None = None  # set with --disk-budget

    def path(self, i: int) -> Path:
        return self.writer.path(i)

    def scan(self) -> set[int]:
        """Finished samples: their file exists and is complete with the expected shapes."""
        # Samples training consumed under a disk budget are finished too: their files are gone for good.
        through = budget.Ledger.read(self.out).through
        self.done = {i for i in self.part if i < through or self.writer.complete(i, self.samples[i].seq_len)}
        return self.done

    def wait_for_room(self, batch: Sequence[int]) -> None:
        """Under --disk-budget, return once ``batch`` may be written (eagle3.budget); at once otherwise."""
        todo = [i for i in batch if i not in self.done]
        if self.budget is not None and todo:
            self.budget.wait_for_room(todo, [self.samples[i].seq_len for i in todo], lambda: self.done, self.path)

    def is_done(self, i: int) -> bool:
        return i in self.done

    def write_sample(self, i: int, hidden_states: Any) -> None:
        import torch

        s = self.samples[i]
        want = (s.seq_len, len(self.layer_ids), self.hidden)
        if tuple(hidden_states.shape) != want:
            raise RuntimeError(f"sample {i}: hidden_states shape {tuple(hidden_states.shape)}, expected {want}")
        if i in self.done:
            raise RuntimeError(f"sample {i} is finished already and is never rewritten")
        self.writer.write(i, formats.SampleData(hidden_states.to(torch.bfloat16),
                                                torch.tensor(s.token_ids, dtype=torch.int64),
                                                torch.tensor(s.loss_mask, dtype=torch.uint8)))
        self.done.add(i)

    def place_sample(self, i: int, path: Path, header: dict[str, Any]) -> str | None:
        """Rename the complete file ``path`` into place as sample ``i`` if it is in the output's layout
        (:meth:`formats.Writer.adopt`); how it went, or None when it must be rewritten (write_sample)."""
        if i in self.done:
            raise RuntimeError(f"sample {i} is finished already and is never rewritten")
        how = self.writer.adopt(i, path, header, move=True)
        if how is not None:
            self.done.add(i)
        return how

    def batch_finished(self, written: int, tokens: int, seconds: float) -> None:
        if self.t_loop is None:
            self.t_loop = time.monotonic() - seconds
        self.tokens_run += tokens
        self.samples_run += written
        elapsed = max(time.monotonic() - self.t_loop, 1e-9)
        say(f"extract progress: {len(self.done)}/{self.total} samples, {self.tokens_run / elapsed:.1f} tok/s")


def _lock_out(out: Path, name: str = ".extract.lock") -> int:
    fd = os.open(out / name, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise OutputBusy(f"another extract process (pid {holder}) is writing to {out}; "
                         "stop it before relaunching") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _lock_name(args: argparse.Namespace) -> str:
    return shards.partial(".extract", args.shard, args.num_shards, ".lock") if args.num_shards > 1 else ".extract.lock"


def model_digest(model_dir: str) -> str:
    """sha256 of the model's config.json (and of the tiny model's build marker, which names its seed)."""
    h = hashlib.sha256((Path(model_dir) / "config.json").read_bytes())
    marker = Path(model_dir) / "tiny_model.json"
    if marker.is_file():
        h.update(json.loads(marker.read_text()).get("fingerprint", "").encode())
    return h.hexdigest()


def _manifest(args: argparse.Namespace, model_dir: str, cfg: dict[str, Any], job: Job, fingerprint: dict[str, Any],
              status: str, failed: Sequence[int] = (), verify: dict[str, Any] | None = None) -> dict[str, Any]:
    tc = text_config(cfg)
    m = {
        "format": FORMAT,
        "output_format": job.writer.fmt.value,
        "status": status,
        "model": str(Path(model_dir).resolve()),
        "model_type": cfg.get("model_type"),
        "backend": args.backend,
        "layer_ids": job.layer_ids,
        "num_hidden_layers": job.num_layers,
        "n_layers_stored": len(job.layer_ids),
        "hidden_size": job.hidden,
        "vocab_size": tc.get("vocab_size"),
        "dtype": "bfloat16",
        "prompts": str(Path(args.prompts).resolve()),
        "max_seq_len": args.max_seq_len,
        "num_samples": job.total,
        "finished": len(job.done),
        "failed": sorted(failed),
        "seq_lens": [s.seq_len for s in job.samples],
        "total_tokens": sum(s.seq_len for s in job.samples),
        "truncated": [s.index for s in job.samples if s.truncated],
        "files": {**job.writer.files(), "prepared": "prepared.safetensors"},
        "loss_mask": "plain prompts and token_ids records: all ones; chats: assistant content tokens "
                     "plus the end-of-turn token right after each",
        "fingerprint": fingerprint,
    }
    if job.writer.fmt is formats.Format.SPECFORGE:  # its draft config names them in SGLang's numbering
        m["sglang_aux_layer_ids"] = draft_export.renumber(job.layer_ids[:-1], "vllm", "sglang")
    if verify is not None:
        m["verify"] = verify
    if args.disk_budget is not None:
        m["disk_budget"] = args.disk_budget
        m["consumed_through"] = budget.Ledger.read(job.out).through
        if job.budget is not None:
            m["peak_unconsumed_bytes"] = job.budget.peak
    if args.num_shards > 1:  # the set's size, and this shard's part of it (gather merges the parts)
        m["num_samples"] = len(job.samples)
        m["shard"] = {"index": args.shard, "num_shards": args.num_shards, "samples": job.total,
                      "batch_size": args.batch_size}
    return m


def _check_fingerprint(out: Path, fingerprint: dict[str, Any], fmt: formats.Format) -> None:
    try:
        old = json.loads((out / "manifest.json").read_text())
    except FileNotFoundError:
        if any(out.glob("hs_*.safetensors")) or any(out.glob("hidden_states/hs_*")) or any(out.glob("rows_*")):
            raise OutputMismatch(f"{out} holds hs_*.safetensors files but no manifest.json: "
                                 "use an empty --out (they may come from other settings)") from None
        return
    except ValueError as e:
        raise OutputMismatch(f"{out}/manifest.json is unreadable ({e}): use a new --out") from None
    prev = old.get("fingerprint") or {}
    diff = [k for k in fingerprint if prev.get(k) != fingerprint[k]]
    if old.get("output_format", formats.Format.SUPERVISE.value) != fmt.value:  # older manifests: ours
        diff.append("output_format")
    if diff:
        raise OutputMismatch(f"{out} holds an extraction made with other settings (differs in: {', '.join(diff)}); "
                             "use a new --out, or remove the old output to redo it")


def verify_samples(job: Job, hf: Any, n: int, tol: float) -> dict[str, Any]:
    """Recompute ``n`` finished samples with ``hf`` and compare with the stored files."""
    from safetensors.torch import load_file

    say("extract phase: verify")
    done = sorted(job.done)
    if not done or n <= 0:
        return {"samples": [], "worst_max_abs": None, "worst_rel": None}
    n = min(n, len(done))
    picks = sorted({done[round(j * (len(done) - 1) / max(n - 1, 1))] for j in range(n)})
    worst_abs = worst_rel = 0.0
    for i in picks:
        stored = load_file(str(job.path(i)))
        if stored["token_ids"].tolist() != job.samples[i].token_ids:
            raise VerifyFailed(f"sample {i}: stored token_ids differ from the prepared data")
        ref = hf.compute([job.samples[i].token_ids], job.layer_ids, job.num_layers)[0].float()
        got = stored["hidden_states"].float()
        for j, k in enumerate(job.layer_ids):
            d = (got[:, j] - ref[:, j]).abs()
            max_abs = float(d.max())
            rel = float(d.mean() / ref[:, j].abs().mean().clamp_min(1e-12))
            worst_abs, worst_rel = max(worst_abs, max_abs), max(worst_rel, rel)
            say(f"extract verify: sample {i} layer {k}: max_abs {max_abs:.4g}, rel {rel:.4g}")
    say(f"extract verify: {len(picks)} samples, worst max_abs {worst_abs:.4g}, worst rel {worst_rel:.4g} "
        f"(tolerance {tol:g})")
    result = {"samples": picks, "worst_max_abs": worst_abs, "worst_rel": worst_rel, "tolerance": tol}
    if worst_rel > tol:
        raise VerifyFailed(f"stored hidden states differ from transformers: worst mean relative error "
                           f"{worst_rel:.4g} > {tol:g}")
    return result


def run(args: argparse.Namespace, t_start: float, vllm_api: Any = None) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Shards share --out: each holds its own lock (their files never overlap).
    lock_fd = _lock_out(out, _lock_name(args))
    try:
        return _run_locked(args, out, t_start, vllm_api)
    finally:
        os.close(lock_fd)


def _run_locked(args: argparse.Namespace, out: Path, t_start: float, vllm_api: Any) -> int:
    removed = formats.Writer(out, [], 0, 0).clean()
    if removed:
        say(f"extract resume: removed {len(removed)} unfinished temporary file(s)")

    # Everything that can be checked is checked before the (possibly long) model load.
    if not args.model:
        from .tiny_model import build, default_model_dir

        model_dir = str(build(default_model_dir(args.cache_dir)))
    else:
        model_dir = args.model
    cfg = read_model_config(model_dir)
    tc = text_config(cfg)
    num_layers, hidden = int(tc["num_hidden_layers"]), int(tc["hidden_size"])
    layer_ids = parse_layer_ids(args.layer_ids, num_layers)

    warnings: list[str] = []
    if args.backend == "vllm":
        from . import vllm_backend

        version = getattr(vllm_api, "__version__", None) or vllm_backend.installed_vllm_version()
        if version is None:
            raise ModuleNotFoundError("--backend vllm: vLLM is not installed in this interpreter "
                                      f"({sys.executable})")
        w = vllm_backend.check_vllm(cfg, layer_ids, num_layers, version, force=args.force)
        if w:
            say(f"extract warning: {w}")

    records = data_mod.load_records(args.prompts, args.max_samples)
    tokenizer = None
    if data_mod.needs_tokenizer(records):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=args.trust_remote_code,
                                                  local_files_only=True)
    samples = data_mod.prepare(records, tokenizer, args.max_seq_len, warn=warnings.append)
    for w in warnings:
        say(f"extract warning: {w}")
    vocab = max([int(tc.get("vocab_size") or 0), len(tokenizer) if tokenizer is not None else 0,
                 1 + max(max(s.token_ids) for s in samples)])
    if args.backend == "vllm":
        max_pos = tc.get("max_position_embeddings")
        longest = max(s.seq_len for s in samples)
        if max_pos and longest + 1 > int(max_pos):
            raise ValueError(f"the longest sample has {longest} tokens and vLLM needs one more position, but the "
                             f"model has {max_pos}: lower --max-seq-len to {int(max_pos) - 1}")

    fingerprint = {
        "data_sha256": data_mod.data_digest(samples),
        "layer_ids": layer_ids,
        "model_sha256": model_digest(model_dir),
    }
    sharded = args.num_shards > 1
    if sharded:
        refused = shards.check_partials(out, fingerprint, args.num_shards, args.batch_size)
        if refused:
            raise OutputMismatch(refused)
        if (out / "manifest.json").exists():  # gathered before: the same settings only
            _check_fingerprint(out, fingerprint, args.format)
    else:
        _check_fingerprint(out, fingerprint, args.format)

    writer = formats.make_writer(args.format, out, layer_ids, num_layers, hidden, model_dir)
    writer.masks_elsewhere = True  # prepared.safetensors (a shard: its partial, gather's) holds every loss mask
    part = shards.select([s.index for s in samples], args.shard, args.num_shards, args.batch_size)
    job = Job(out, samples, layer_ids, num_layers, hidden, args.batch_size, writer, part)
    if args.disk_budget is not None:
        job.budget = budget.Budget(out, args.disk_budget, 2 * len(layer_ids) * hidden + 9, say, args.wait_report_s)
    masked, every = data_mod.token_frequencies([samples[i] for i in part], vocab)
    manifest_path = out / "manifest.json"
    if sharded:  # the files describing the whole set are `gather`'s to write
        _io.atomic_save_safetensors({"token_freq": masked, "token_freq_all": every},
                                    out / shards.partial("token_freq", args.shard, args.num_shards, ".safetensors"))
        _io.atomic_save_safetensors(data_mod.packed(samples),  # the whole set's: gather takes it
                                    out / shards.partial("prepared", args.shard, args.num_shards, ".safetensors"))
        manifest_path = out / shards.partial("manifest", args.shard, args.num_shards, ".json")
    else:
        _io.atomic_save_safetensors({"token_freq": masked, "token_freq_all": every}, out / "token_freq.safetensors")
        _io.atomic_save_safetensors(data_mod.packed(samples), out / "prepared.safetensors")
        writer.write_dataset([s.token_ids for s in samples], [s.loss_mask for s in samples], masked)
    job.scan()
    _io.atomic_write_json(_manifest(args, model_dir, cfg, job, fingerprint, "running"), manifest_path)
    todo = [i for i in part if i not in job.done]
    if job.done:
        say(f"extract resume: {len(job.done)}/{job.total} samples already finished")

    failed: list[int] = []
    hf = None
    if todo:
        if args.backend == "hf":
            from .hf_backend import HFBackend

            pad = (tokenizer.pad_token_id if tokenizer is not None else None) or tc.get("pad_token_id") or 0
            hf = backend = HFBackend(model_dir, device=args.device, dtype=args.dtype,
                                     trust_remote_code=args.trust_remote_code, pad_token_id=int(pad))
            backend.load()
            say("extract phase: extracting")
            failed = backend.run(job, todo)
        else:
            failed = _run_vllm(args, out, model_dir, job, todo, vllm_api)

    verify = None
    if args.verify:
        if hf is None:
            from .hf_backend import HFBackend

            hf = HFBackend(model_dir, device=args.device, dtype=args.dtype, trust_remote_code=args.trust_remote_code)
        verify = verify_samples(job, hf, args.verify, args.verify_tol)

    status = "complete" if len(job.done) == job.total else "incomplete"
    _io.atomic_write_json(_manifest(args, model_dir, cfg, job, fingerprint, status, failed, verify), manifest_path)
    tokens = sum(job.samples[i].seq_len for i in job.done)
    say(f"extract done: {len(job.done)} samples, {tokens} tokens in {time.monotonic() - t_start:.1f}s")
    if status != "complete":
        missing = [i for i in part if i not in job.done]
        say(f"extract incomplete: {len(missing)} of {job.total} samples failed ({_short(missing)}); "
            "relaunch to retry them")
        return EXIT_INCOMPLETE
    return 0


def _run_vllm(args: argparse.Namespace, out: Path, model_dir: str, job: Job, todo: list[int],
              vllm_api: Any) -> list[int]:
    """The vLLM backend over ``todo``, staging into this launch's own directory (eagle3.staging)."""
    from .vllm_backend import VllmBackend

    root = out / ".staging"
    others = [p for p in out.glob(".extract*.lock") if p.name != _lock_name(args)]
    removed = staging.sweep(root, others)
    if removed:
        say(f"extract resume: removed {removed} staged entr{'y' if removed == 1 else 'ies'} of ended launches")
    stage = staging.Staging.claim(root, args.shard, args.num_shards)
    finished = False
    try:
        backend = VllmBackend(
            model_dir, stage.path, api=vllm_api,
            max_model_len=max(s.seq_len for s in job.samples) + 1,
            gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=args.enforce_eager,
            tensor_parallel_size=args.tensor_parallel_size, trust_remote_code=args.trust_remote_code,
            file_timeout_s=args.file_timeout, max_consecutive_failures=args.max_consecutive_failures,
            log=say)
        backend.load(job.layer_ids)
        say("extract phase: extracting")
        failed = backend.run(job, todo)
        backend.close()
        finished = True
        return failed
    finally:
        # After a clean end the engine is down and every file was taken; after an error the engine may still
        # be writing until this process exits, so the directory is left for the next launch's sweep.
        stage.release(remove=finished)


def _short(ids: Sequence[int], n: int = 10) -> str:
    s = ", ".join(map(str, ids[:n]))
    return s + (f", ... ({len(ids) - n} more)" if len(ids) > n else "")


def main(argv: Sequence[str] | None = None, *, vllm_api: Any = None) -> int:
    """CLI entry. ``vllm_api`` replaces the vLLM module (LLM, SamplingParams, TokensPrompt) in tests."""
    t_start = time.monotonic()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["gather"]:
        return shards.gather_main(argv[1:])
    args = parse_args(argv)
    say("extract phase: model_init")
    try:
        return run(args, t_start, vllm_api)
    except formats.FormatError as e:
        say(f"extract error: {e}")
        return EXIT_CONFIG
    except finite.NonFinite as e:
        say(f"extract error: {e}")
        return EXIT_NONFINITE
    except OSError as e:
        if isinstance(e, _io.DiskFull) or e.errno in (errno.ENOSPC, errno.EDQUOT):
            path = getattr(e, "path", None) or e.filename or args.out
            say(f"extract error: disk full writing {path}: free space and relaunch; finished samples are kept")
            return EXIT_DISK_FULL
        raise


if __name__ == "__main__":
    sys.exit(main())
