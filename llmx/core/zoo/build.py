"""Building one zoo entry: tokenizer, token streams, pre-training with the shared loop, held-out figures, and an
atomic write of the folder with its manifest."""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import time
from pathlib import Path

from llmx.core import atomic, manifest
from llmx.core.zoo.cache import INFO
from llmx.core.zoo.corpus import Corpus, special_ids, tokenizer_fingerprint
from llmx.core.zoo.request import ZOO_VERSION, RefRequest
from llmx.errors import UsageError

log = logging.getLogger("llmx.zoo")


def build(req: RefRequest, corp: Corpus, tok, target: Path, show_progress: bool | None = None) -> Path:
    """Train the reference model for ``req`` on ``corp`` and store it atomically at ``target``. ``tok`` is a named
    model's tokenizer, or None to train a BPE on the corpus."""
    import torch

    from llmx.core.models import quiet_transformers

    show = True if show_progress is None else show_progress
    log.info("building %s (%s preset, seed %s) into %s", req.ref_name or req.arch, req.preset, req.seed, target)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # several times faster than 2 for models this small
    try:
        if req.arch == "llava":
            from llmx.core.zoo import llava

            model, proc, figures = llava.build(req, corp, tok, show)
            tok = proc.tokenizer
        else:
            model, tok, figures = _causal(req, corp, tok, show)
            proc = tok
        info = {
            "name": req.ref_name, "arch": req.arch, "preset": req.preset, "seed": req.seed, "steps": req.steps,
            "options": req.options(), "preset_spec": req.spec.as_dict(),
            "corpus": {"source": corp.source, "fingerprint": corp.fingerprint, "train_tokens": figures.pop("train_tokens"),
                       "val_tokens": figures.pop("val_tokens"), "train_chars": sum(map(len, corp.train))},
            "tokenizer": {"source": req.tokenizer or "bpe trained on the corpus",
                          "fingerprint": tokenizer_fingerprint(tok)},
            "params": sum(p.numel() for p in model.parameters()), "vocab": len(tok), **figures,
            "zoo_version": ZOO_VERSION, "torch": torch.__version__, "environment": environment(),
            "built_by": {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "pid": os.getpid()},
        }
    finally:
        torch.set_num_threads(threads)
    quiet_transformers()
    with atomic.folder(target) as tmp:
        model.save_pretrained(tmp)
        proc.save_pretrained(tmp)
        (tmp / INFO).write_text(json.dumps(info, indent=2) + "\n")
        manifest.write(tmp)
    return target


def _causal(req: RefRequest, corp: Corpus, tok, show: bool):
    """A causal LM pre-trained on the corpus, its tokenizer and its held-out figures."""
    import torch
    from transformers import AutoModelForCausalLM

    from llmx.core.data import join_documents
    from llmx.core.eval.lm import bits_per_byte, sequence_nll, unigram_nll
    from llmx.core.models.archs import config
    from llmx.core.progress import clock, note, track
    from llmx.core.tokenizer import train_bpe
    from llmx.core.zoo.train import pretrain

    spec = req.spec
    tok = tok if tok is not None else train_bpe(corp.train, spec.vocab)
    train_ids, val_ids = join_documents(tok, corp.train), join_documents(tok, corp.validation)
    for split, ids in (("train", train_ids), ("validation", val_ids)):
        if len(ids) <= spec.seq_len + 1:
            raise UsageError(f"data '{corp.source}': its {split} split has {len(ids)} tokens, too few for one "
                             f"window of {spec.seq_len}; give more text or a smaller --seq-len")
    torch.manual_seed(req.seed)
    model = AutoModelForCausalLM.from_config(config(req.arch, len(tok), spec.hidden, spec.layers,
                                                    max_positions=max(1024, 2 * spec.seq_len), heads=spec.heads,
                                                    kv_heads=spec.kv_heads, special_ids=special_ids(tok)))
    scored = val_ids[: 40_000 if spec.corpus_chars is None else 8_000]
    if show:  # after the checks (a bad input is one line), timed on the machine at hand
        seconds = estimate_seconds(step_seconds(model, train_ids, spec), spec, req.max_steps, len(scored))
        note(f"building {req.ref_name or req.arch} ({req.preset} preset), once: it is cached after; "
             f"{req.max_steps} steps of {spec.batch}x{spec.seq_len} tokens, about {clock(seconds)} here "
             "(timed on a few steps, one CPU thread; early stopping may end it sooner)")
    result = pretrain(model, train_ids, val_ids, spec, req.seed, req.max_steps,
                      progress=lambda r, **kw: track(r, enabled=show, **kw))
    total, count = sequence_nll(model, scored, spec.seq_len, spec.seq_len // 2, batch_size=16)
    figures = {"train_tokens": len(train_ids), "val_tokens": len(val_ids),
               "steps_run": result.steps, "best_step": result.best_step,
               "weights_step": weights_step(result, spec.patience),
               "train_seconds": round(result.seconds, 1),
               "tokens_seen": result.steps * spec.batch * spec.seq_len, "best_val_nll": result.best_eval,
               "val_perplexity": math.exp(total / count), "val_tokens_scored": count,
               "val_bits_per_byte": bits_per_byte(total, tok, scored),
               "unigram_perplexity": math.exp(unigram_nll(train_ids, scored, len(tok)))}
    return model, tok, figures


def weights_step(result, patience: int | None) -> int:
    """The step whose weights ship: early stopping restores the best state; with no patience the last step stays."""
    return result.best_step if patience is not None else result.steps


def environment() -> dict:
    """What the bits of a build depend on beyond its key, recorded rather than keyed (an upgrade would otherwise
    rebuild every entry): the same key, versions and CPU kernels give the same bytes in any process, since training
    runs on one thread whatever the caller's thread count (tested at one and two threads)."""
    import platform

    import tokenizers
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "machine": platform.machine(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


WARMUP_STEPS = 3  # the first is not timed: it allocates


def step_seconds(model, train_ids, spec, steps: int = WARMUP_STEPS) -> float:
    """Seconds of one training step (forward and backward on a ``spec.batch`` x ``spec.seq_len`` batch) on this
    machine, now: timed on a copy of ``model``, under a forked RNG, so that the build's bits do not change. The
    fastest of the timed steps (the others met a busier machine or a cold cache)."""
    import copy

    import torch

    probe = copy.deepcopy(model)
    span = max(1, len(train_ids) - spec.seq_len - 1)
    x = torch.stack([train_ids[(i * 7919) % span:(i * 7919) % span + spec.seq_len] for i in range(spec.batch)])
    times = []
    with torch.random.fork_rng(devices=[]):
        for _ in range(max(2, steps)):
            t0 = time.perf_counter()
            probe(input_ids=x, labels=x).loss.backward()
            probe.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])  # the first step allocates


def estimate_seconds(step: float, spec, steps: int, scored_tokens: int) -> float:
    """A build's remaining time from one measured step: the steps, the held-out evaluations (forward only: about a
    third of a step per batch of windows) and the final scoring of ``scored_tokens`` at half-window strides. At
    least one second: a build is never "about 0s"."""
    forward_window = step / 3 / spec.batch
    evals = (steps // spec.eval_every + 1) * spec.eval_windows if spec.eval_every else 0
    scoring = 2 * scored_tokens / spec.seq_len
    return max(1.0, steps * step + (evals + scoring) * forward_window)
