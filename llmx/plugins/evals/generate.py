"""Sample completions for a prompt; they land in metrics.json and in ``samples.txt``."""

from __future__ import annotations

import torch

from llmx.core import atomic
from llmx.core.context import RunContext
from llmx.plugins.evals.config import GenerateParams


@torch.inference_mode()
def run(ctx: RunContext, p: GenerateParams) -> dict:
    model, tok = ctx.model, ctx.tokenizer
    device = next(model.parameters()).device
    enc = tok(p.prompt, return_tensors="pt", add_special_tokens=False).to(device)
    sampling = {"do_sample": True, "temperature": p.temperature, "top_p": p.top_p} if p.temperature > 0 else \
        {"do_sample": False}
    out = model.generate(**enc, max_new_tokens=p.max_new_tokens, num_return_sequences=p.samples,
                         pad_token_id=tok.pad_token_id, **sampling)
    texts = [tok.decode(row[enc["input_ids"].shape[1]:], skip_special_tokens=True) for row in out]
    atomic.write_text(ctx.artifact("samples.txt"), "\n\n----\n\n".join(p.prompt + t for t in texts) + "\n")
    return {"samples": texts, "new_tokens": int(out.shape[1] - enc["input_ids"].shape[1])}
