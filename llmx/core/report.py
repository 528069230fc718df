"""What ``llmx report`` reads from run folders: one row per run and stage with its metrics, the headline metrics a
reader looks for first, and the loss curves training stages left in ``metrics.jsonl``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmx.core import runs
from llmx.errors import UsageError

# The figures people compare, most telling first: a stage shows the first few it has.
KEY_METRICS = (
    "perplexity", "kl_to_full", "heldout_pref_accuracy", "heldout_loss", "val_nll_after", "bits", "bits_per_byte",
    "kv_memory_fraction", "quantized_bytes_vs_fp16", "stored_weight_bytes", "top1_agreement", "final_loss",
    "decode_tokens_per_s", "peak_rss_bytes", "ratio", "params_after", "score_mass_kept",
)


@dataclass
class StageRow:
    run: str
    status: str
    index: int
    method: str
    stage: str
    seconds: float | None
    metrics: dict[str, Any]
    folder: Path
    model: str = "?"
    curve: list[dict[str, Any]] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    detail: str = ""  # the params that tell it from other stages of the same method in the report (``distinguish``)

    @property
    def label(self) -> str:
        return f"{self.index}:{self.method}" + (f" {self.detail}" if self.detail else "")

    def key_metrics(self, limit: int = 4) -> dict[str, Any]:
        chosen = [k for k in KEY_METRICS if _scalar(self.metrics.get(k))][:limit]
        if not chosen:
            chosen = [k for k, v in self.metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)][:3]
        return {k: self.metrics[k] for k in chosen}


def _scalar(v: Any) -> bool:
    return isinstance(v, (int, float, str)) and not isinstance(v, bool)


def run_folders(paths: list[str]) -> list[Path]:
    """Run folders given directly or as folders holding them (a path that is neither is a usage error)."""
    folders: list[Path] = []
    for p in map(Path, paths):
        if (p / runs.CONFIG).is_file():
            folders.append(p)
        elif p.is_dir() and (inner := sorted(d for d in p.iterdir() if (d / runs.CONFIG).is_file())):
            folders.extend(inner)
        elif not p.exists():
            raise UsageError(f"{p}: does not exist")
        else:
            runs.read(p)  # raises the "not a run folder" error
    for root in dict.fromkeys(f.parent for f in folders):
        runs.sweep(root)
    return folders


def rows(paths: list[str]) -> list[StageRow]:
    import yaml

    out = []
    for folder in run_folders(paths):
        data = runs.read(folder)
        status = data["meta"].get("status", "?")
        config = yaml.safe_load((folder / runs.CONFIG).read_text()) or {}
        model = str(config.get("model") or "?")
        pipeline = config.get("pipeline") or []
        stages = data["metrics"].get("stages", [])
        if not stages:
            out.append(StageRow(folder.name, status, -1, "-", "-", None, {}, folder, model))
        for s in stages:
            curve_file = folder / "artifacts" / f"{s['index']}_{s['method']}" / "metrics.jsonl"
            curve = runs.records(curve_file) if curve_file.is_file() else []
            entry = pipeline[s["index"]] if s["index"] < len(pipeline) and isinstance(pipeline[s["index"]], dict) else {}
            out.append(StageRow(folder.name, status, s["index"], s["method"], s["stage"], s.get("seconds"),
                                s["metrics"], folder, model, curve, dict(entry.get("params") or {})))
    return distinguish(out)


def distinguish(rows: list[StageRow]) -> list[StageRow]:
    """Label the stages of one method by the params whose values differ among them (``quamba2 recipe=naive``,
    ``rtn bits=w2a16 group_size=32``), so that no two arms read as the bare method name."""
    by_method: dict[str, list[StageRow]] = {}
    for r in rows:
        by_method.setdefault(r.method, []).append(r)
    for group in by_method.values():
        keys = sorted({k for r in group for k in r.params})
        differ = [k for k in keys if len({repr(r.params.get(k)) for r in group}) > 1]
        for r in group:
            r.detail = " ".join(f"{k}={_short(r.params.get(k))}" for k in differ)
    return rows


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 24 else text[:21] + "..."


def short_run(name: str) -> str:
    """``20261201T120653208074Z_quantize_c394ac62`` -> ``quantize_c394ac62 (12:06)``."""
    stamp, _, rest = name.partition("_")
    return f"{rest} ({stamp[9:11]}:{stamp[11:13]})" if len(stamp) >= 13 and stamp[8:9] == "T" else name
