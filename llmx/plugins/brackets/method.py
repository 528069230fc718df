"""The brackets preference task: build preference data from the model's own samples (``analyze``), and measure a
model on held-out prompts (``eval``): the rate of preferred completions and the KL drift from the reference."""

from __future__ import annotations

import json

import torch

from llmx.core import atomic
from llmx.core.context import RunContext
from llmx.plugins.brackets import task
from llmx.plugins.brackets.config import BracketsDataParams, BracketsEvalParams


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def build(ctx: RunContext, p: BracketsDataParams) -> dict:
    model, tok = ctx.model, ctx.tokenizer
    out: dict = {}
    for split, n, name in (("train", p.prompts, "train"), ("validation", p.heldout_prompts, "heldout")):
        plist = task.prompts(split, n, ctx.config.seed)
        samples = task.sample(model, tok, plist, p.samples, p.max_new_tokens, p.temperature, ctx.config.seed,
                              ctx.progress)
        paired, unpaired, good = [], [], 0
        for prompt, completions in zip(plist, samples, strict=True):
            labels = [task.judge(prompt, c) for c in completions]
            good += sum(labels)
            unpaired += [{"prompt": prompt, "completion": c, "label": lab} for c, lab in zip(completions, labels,
                                                                                                strict=True) if c]
            chosen = next((c for c, lab in zip(completions, labels, strict=True) if lab), None)
            rejected = next((c for c, lab in zip(completions, labels, strict=True) if not lab and c), None)
            if chosen and rejected:
                paired.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
        atomic.write_text(ctx.artifact(f"{name}_paired.jsonl"), _jsonl(paired))
        atomic.write_text(ctx.artifact(f"{name}_unpaired.jsonl"), _jsonl(unpaired))
        out.update({f"{name}_pairs": len(paired), f"{name}_unpaired": len(unpaired),
                    f"{name}_preferred_rate": good / max(len(plist) * p.samples, 1)})
    out["data_dir"] = str(ctx.artifact("train_paired.jsonl").parent)
    return out


@torch.no_grad()
def evaluate(ctx: RunContext, p: BracketsEvalParams) -> dict:
    from llmx.core import models
    from llmx.core.train.align.batch import collate, encode, forward

    model, tok = ctx.model, ctx.tokenizer
    reference, _ = models.load(p.reference or ctx.config.model, dtype=ctx.config.dtype, device=ctx.device)
    plist = task.prompts("validation", p.prompts, ctx.config.seed)
    samples = task.sample(model, tok, plist, p.samples, p.max_new_tokens, p.temperature, ctx.config.seed + 1,
                          ctx.progress)
    good = total = 0
    kl_seq, n_tok = 0.0, 0.0
    for prompt, completions in zip(plist, samples, strict=True):
        good += sum(task.judge(prompt, c) for c in completions)
        total += len(completions)
        items = [encode(tok, prompt, c, 512, eos=not c) for c in completions]  # EOS only where it was sampled
        t = collate(items, tok.pad_token_id, next(model.parameters()).device)
        ratio = (forward(model, t)[0] - forward(reference, t)[0]) * t.response_mask
        kl_seq += float(ratio.sum())
        n_tok += float(t.response_mask.sum())
    return {"preferred_rate": good / max(total, 1), "kl_from_reference": kl_seq / max(total, 1),
            "kl_per_token": kl_seq / max(n_tok, 1), "samples": total}
