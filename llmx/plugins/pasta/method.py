"""``analyze --method pasta-annotate``: Pasta-Lang rows (train.jsonl, validation.jsonl) under the run model's
tokenizer, equipped with the six tag tokens (a copy: the run's tokenizer is left as it was)."""

from __future__ import annotations

import copy
import statistics
from typing import Any

from llmx.core import atomic
from llmx.core.context import RunContext
from llmx.plugins.pasta import annotate as A
from llmx.plugins.pasta import lang
from llmx.plugins.pasta.config import AnnotateParams


def annotate(ctx: RunContext, p: AnnotateParams) -> dict[str, Any]:
    tok = copy.deepcopy(ctx.tokenizer)
    lang.equip(tok)

    def tokenize(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    opts = A.Options(**p.model_dump())
    rows, report = A.build(tokenize, opts)
    for split in ("train", "validation"):
        atomic.write_jsonl(ctx.artifact(f"{split}.jsonl"), [r for r in rows if r["split"] == split])
    out = report.as_dict()
    out.update({f"skipped_{k}": v for k, v in out.pop("skipped").items()})
    lengths = sorted(len(tokenize(r["prompt"] + r["response"])) for r in rows)
    if lengths:
        out.update(row_tokens_median=statistics.median(lengths), row_tokens_p90=lengths[int(0.9 * (len(lengths) - 1))],
                   row_tokens_max=lengths[-1], chunks_mean=statistics.fmean(r["chunks"] for r in rows))
    out["data_dir"] = str(ctx.artifact("train.jsonl").parent)
    ctx.log.info("pasta-annotate: %d train / %d validation rows", out["rows_train"], out["rows_validation"])
    return out
