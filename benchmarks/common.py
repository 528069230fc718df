"""Helpers for the benchmark scripts: run llmx pipelines in-process and write result files."""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from llmx.core.machine import CPU_FLAGS, cpu_model, machine  # noqa: F401  (the benchmarks import them from here)

RESULTS = Path(os.environ.get("LLMX_BENCH_RESULTS") or Path(__file__).resolve().parent / "results")
MIN_SEEDS = 3  # fewer runs of a random method cannot call it ahead


def _eval_defaults() -> dict[str, int]:
    """`llmx eval --method perplexity`'s defaults, read from its config: one set for the CLI and the benchmarks."""
    from llmx.core.config import DataConfig
    from llmx.plugins.evals.config import PerplexityParams

    seq = DataConfig.model_fields["seq_len"].default
    return {"seq_len": seq, "stride": seq // 2, "max_tokens": PerplexityParams.model_fields["max_tokens"].default}


EVAL = _eval_defaults()


def perplexity(source: str | None = None, **params: Any) -> dict[str, Any]:
    """The perplexity stage every benchmark evaluates with: the CLI's defaults (16k held-out tokens in windows of
    128, the small and bench presets' training context, stride 64) unless a script states otherwise."""
    return {"method": "perplexity", "params": {**EVAL, **({"source": source} if source else {}), **params}}


def add_target_args(ap, models: list[str], seeds: list[int] | None = None) -> None:
    """``--model/--models``, ``--data`` with its split, and ``--keep-ref`` (and ``--seeds``): the same comparison
    on another corpus and model with one command."""
    ap.add_argument("--models", "--model", nargs="+", default=models, dest="models", metavar="MODEL",
                    help="ref:ARCH-PRESET (trained on --data when that is not stdlib), a model folder or a hub id.")
    ap.add_argument("--data", default="stdlib", help="Calibration and evaluation text: stdlib, pydoc, a .txt/.jsonl "
                    "file or hf:NAME (default: stdlib).")
    ap.add_argument("--text-split", default="auto", help="How a local --data file splits (data.text_split).")
    ap.add_argument("--validation-percent", type=int, default=10, help="Its held-out share (data.validation_percent).")
    ap.add_argument("--keep-ref", action="store_true", help="Use ref: models as built on stdlib even with --data.")
    ap.set_defaults(default_models=models)
    if seeds is not None:
        ap.add_argument("--seeds", nargs="+", type=int, default=seeds, help="Seeds of the random parts (calibration "
                        "windows, initialisation, data order): a row per seed and their spread.")


def data_config(args) -> dict[str, Any]:
    """The run's ``data`` section for ``--data`` and its split."""
    return {"source": args.data, "text_split": args.text_split, "validation_percent": args.validation_percent}


def splitting(args):
    from llmx.core.data import TextSplit

    return TextSplit(args.text_split, args.validation_percent)


def targets(args) -> list[tuple[str, str]]:
    """``(label, model)`` per ``--models`` entry. A built-in ``ref:ARCH[-PRESET]`` with ``--data`` other than stdlib
    is that preset trained on the data with the same split (built once, cached by the zoo); anything else is used
    as given."""
    from dataclasses import replace

    from llmx.core import zoo
    from llmx.core.zoo.request import parse_builtin

    out = []
    for model in args.models:
        req = parse_builtin(model.removeprefix("ref:")) if model.startswith("ref:") else None
        if req is None or args.data == "stdlib" or args.keep_ref:
            out.append((model, model))
            continue
        path, _ = zoo.provide(replace(req, data=args.data, text_split=args.text_split,
                                      validation_percent=args.validation_percent), show_progress=True)
        out.append((f"{model}@{data_label(args.data)}", str(path)))
    return out


def data_label(data: str) -> str:
    """A short name for a corpus in labels and file names: a file's stem, else the source itself."""
    path = Path(data).expanduser()
    return path.stem if path.is_file() else data.replace(":", "_").replace("/", "_")


def result_name(base: str, args, names_model: bool = False) -> str:
    """The result file's name: ``base``, then the models when they are not the script's defaults (unless ``base``
    already names its model), ``_on_<data>`` for other data and ``_keepref``, so a rerun never overwrites the
    repository's results."""
    if not names_model and args.models != args.default_models:
        base += "_" + "_".join(file_label(m) for m in args.models)
    if args.data != "stdlib":
        base += f"_on_{data_label(args.data)}" + ("_keepref" if args.keep_ref else "")
    return base


def file_label(model_label: str) -> str:
    """A model label as part of a file name (the ``@data`` part is left to ``result_name``)."""
    return model_label.partition("@")[0].replace(":", "_").replace("/", "_").strip("._") or "model"


def model_folder(model: str) -> Path:
    """The folder of a model's files: a ``ref:`` entry, a local folder, or a hub id from the local hub cache."""
    from llmx.core import zoo

    if model.startswith("ref:"):
        return zoo.locate(model)
    if Path(model).expanduser().is_dir():
        return Path(model).expanduser()
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model, local_files_only=True))


def spread(values: list[float]) -> dict[str, float]:
    """Mean, min and max of one figure over seeds."""
    return {"mean": statistics.mean(values), "min": min(values), "max": max(values), "n": len(values)}


def verdict(a: list[float], b: list[float], names: tuple[str, str] = ("a", "b"), lower_is_better: bool = True) -> str:
    """'<a> ahead' / '<b> ahead' only when the ranges over seeds do not overlap, else 'within noise'; 'n/a (fewer
    than 3 seeds)' when neither side has ``MIN_SEEDS`` runs (a side with one run is a method without randomness)."""
    if max(len(a), len(b)) < MIN_SEEDS:
        return f"n/a (fewer than {MIN_SEEDS} seeds)"
    sign = -1 if lower_is_better else 1
    a, b = [sign * x for x in a], [sign * x for x in b]
    if min(a) > max(b):
        return f"{names[0]} ahead"
    if min(b) > max(a):
        return f"{names[1]} ahead"
    return "within noise"


def run_pipeline(model: str, stages: list[dict[str, Any]], output_dir: str | None = None, **run: Any) -> list[dict]:
    """Resolve and execute a pipeline (run folders go to ``output_dir``, default a temporary directory removed
    afterwards); return each stage's metrics."""
    from llmx.core.config import resolve
    from llmx.core.pipeline import execute
    from llmx.core.plugins import host

    with tempfile.TemporaryDirectory() as tmp:
        raw = {"model": model, "output_dir": output_dir or tmp, "pipeline": stages, **run}
        result = execute(resolve(raw, host().methods), show_progress=False)
        return [s["metrics"] for s in result.stages]


def child(spec: dict[str, Any]) -> None:
    """A benchmark's child process: run one spec's pipeline and print its metrics as the last line."""
    print(json.dumps(run_pipeline(spec["model"], spec["stages"], output_dir=spec["out"], threads=1,
                                  seed=spec["seed"]), default=str))


def cached(script: str, folder: Path, spec: dict[str, Any]) -> list[dict]:
    """One child pipeline's metrics (``script --child SPEC`` on one thread), kept in ``folder`` under a digest of its
    spec (model, seed, stages; not where its run folders go), so an interrupted benchmark resumes and another spec
    never reuses them."""
    key = hashlib.sha256(json.dumps({k: v for k, v in spec.items() if k != "out"}, sort_keys=True).encode())
    path = folder / f"{key.hexdigest()[:16]}.json"
    if path.is_file():
        return json.loads(path.read_text())
    out = subprocess.run([sys.executable, script, "--child", json.dumps(spec)], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    metrics = json.loads(out.stdout.strip().splitlines()[-1])
    folder.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".part")
    partial.write_text(json.dumps(metrics, default=str))
    os.replace(partial, path)
    return metrics


def narrow_llama(folder: Path, tok, layers: int, seq_len: int) -> str:
    """A width-128 Llama (FFN 384, 4 heads over 2 KV heads, tied embeddings) saved with ``tok`` in ``folder``; its
    weights are seeded, and ``init: scratch`` stages redraw them."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from llmx.core import models

    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=384, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=seq_len,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    models.save(LlamaForCausalLM(cfg), tok, folder)
    return str(folder)


def timed(fn, *args, repeats: int = 10) -> float:
    """Median seconds per call of ``fn(*args)`` after one warm-up call."""
    fn(*args)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def write(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return path


def publish(name: str, rows: list[dict[str, Any]], **payload: Any) -> None:
    """``results/<name>.json`` (the rows, the machine and ``payload``) and ``results/<name>.md`` (the rows' table)."""
    write(name, {"benchmark": name, **payload, "machine": machine(), "rows": rows})
    table = markdown(list(rows[0]), rows)
    (RESULTS / f"{name}.md").write_text(table + "\n")
    print(table)


def markdown(columns: list[str], rows: list[dict[str, Any]]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return "-" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def heldout_windows(tokenizer, max_tokens: int, seq_len: int, data: str = "stdlib", split_rule=None):
    """The first ``max_tokens`` held-out tokens of ``data`` as ``[n, seq_len]`` windows (no overlap)."""
    from llmx.core.data import token_stream

    tokens = token_stream(tokenizer, data, "validation", max_tokens, split_rule)
    return tokens[: len(tokens) // seq_len * seq_len].reshape(-1, seq_len)


def heldout_scores(model, windows, fp_logp=None, batch: int = 16):
    """Perplexity of ``model`` on ``windows``; with the FP model's log-probs also KL(FP || model) per token and
    top-1 agreement. Returns ``(scores, log-probs)`` (the FP call's log-probs are what later calls compare to)."""
    import math

    import torch

    nll, kl, agree, logps = 0.0, 0.0, 0, []
    with torch.no_grad():
        for i in range(0, windows.shape[0], batch):
            ids = windows[i:i + batch]
            logp = torch.log_softmax(model(ids).logits[:, :-1].float(), -1)
            nll -= logp.gather(-1, ids[:, 1:, None]).sum().item()
            if fp_logp is None:
                logps.append(logp)
            else:
                ref = fp_logp[i:i + batch]
                kl += (ref.exp() * (ref - logp)).sum().item()
                agree += (ref.argmax(-1) == logp.argmax(-1)).sum().item()
    n = windows.shape[0] * (windows.shape[1] - 1)
    out = {"perplexity": math.exp(nll / n)}
    if fp_logp is not None:
        out.update(kl=kl / n, top1_agreement=agree / n)
    return out, torch.cat(logps) if logps else fp_logp
