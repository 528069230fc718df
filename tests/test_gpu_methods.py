"""Every smoke recipe on CUDA against the same recipe on the CPU.

``test_recipe_on_cuda_matches_the_cpu[NAME]`` (gpu) runs ``configs/smoke/NAME.yaml`` in fresh processes with
``--device cpu`` and ``--device cuda`` (same seed: the recipe's) and compares, stage by stage, every metric in the two
runs' ``metrics.json``, every training curve (``metrics.jsonl``: per-step loss, gradient norm and the loss's own
figures) and every tensor of every ``.safetensors`` file the runs saved, within NAME's row of TOLERANCES. The CPU
side runs with ``LLMX_CPU_KERNELS=0``, the exact float32 path of packed layers, since the CPU's bf16 int4/int8
kernels compute something else than the CUDA kernels do. ``GPU_CHECK_RUNS=DIR`` reads the runs
``scripts/gpu-check.sh`` made (``DIR/cpu/NAME/<run>/``, ``DIR/cuda/NAME/<run>/``) instead of running them again, and
``GPU_CHECK_REPORT=FILE`` appends one JSON line per recipe with its largest differences (to set tolerances from).

Without CUDA these are skipped; the CPU tests below check that TOLERANCES has a row for every recipe, that the
comparison flags planted differences in a real run folder (a metric, one code, one small float entry) and in training
curves (a zero gradient, a first loss off by 0.2%, a run that does not learn), and that the device check and the
kernel benchmark refuse cleanly (exit 3) here.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke"
RECIPES = sorted(p.stem for p in SMOKE.glob("*.yaml"))
RUNS = os.environ.get("GPU_CHECK_RUNS")  # read at import: the suite's fixtures clear LLMX_* variables, not these
REPORT = os.environ.get("GPU_CHECK_REPORT")
SELECTED = os.environ.get("GPU_CHECK_RECIPES", "").split()  # the device check's subset, when it runs one

# Metrics that measure the machine, not the method: never compared (matched on the metric's own name).
MACHINE = ("*seconds*", "*per_s", "*per_s_*", "*ms_per_*", "ms_*", "*_ms", "*wall*", "*peak*", "*rss*", "device",
           "threads")


@dataclass(frozen=True)
class Tol:
    """How close a recipe's CUDA run must come to its CPU run.

    ``rel``/``abs``: a number matches when ``|cuda - cpu| <= abs + rel * max(|cpu|, |cuda|)`` (counts too, so a small
    count must match exactly); strings, booleans and None must be equal (paths inside the run folder compared
    relative to it). ``items``: metric-name patterns of shares of counted items (accuracies, agreements over greedy
    outcomes) allowed to move by one item: the pattern's value names the count, a metric of the same stage, or is a
    function of the stage's metrics and params (the run's ``config.yaml``) returning it; without a count the share
    is compared at ``rel``/``abs``. ``loose``: metric-name patterns with their own ``(rel, abs)`` (after ``items``).
    ``skip``: metric-name patterns not compared (``why`` says why); ``N:glob`` skips in stage N only.

    Training curves (each training stage's ``metrics.jsonl``): the first step's loss and gradient norm within
    ``first`` relative (the same weights on the same batch: one forward and one backward pass, so a broken or zero
    gradient fails; None where that step draws from the device's generator, dropout), every other figure of every
    step at ``rel``/``abs``, and the loss drop from the first step to the last within ``learn`` of itself plus
    ``first`` of the first loss (a run that does not learn drops by the batches' variation only).

    ``codes``: share of the elements of each integer (or fp8) tensor in the saved ``.safetensors`` files that may
    differ, 0.0 bit-exact; ``floats``: per element of each float tensor there, ``|cuda - cpu| <= floats *
    (max(|cpu|, |cuda|) + FLOOR * the tensor's largest magnitude)``, 0.0 bit-exact; ``float_keys``: tensor-key
    patterns (``*.act_scale``) with their own ``floats``; None: saved tensors not compared. (A recipe whose method
    declares ``cupy`` is skipped without CuPy: its point on CUDA is a kernel.)"""

    rel: float
    abs: float = 0.0
    codes: float | None = 0.0
    floats: float | None = 0.0
    float_keys: dict[str, float] = field(default_factory=dict)
    items: dict[str, str | Callable[[dict, dict], float | None]] = field(default_factory=dict)
    loose: dict[str, tuple[float, float]] = field(default_factory=dict)
    skip: tuple[str, ...] = ()
    first: float | None = 1e-3
    learn: float = 0.1
    why: str = ""


FLOOR = 1e-3  # of a float tensor's largest magnitude: elements smaller than that are compared against it
FIRST = ("loss", "grad_norm")  # a training curve's first-step figures compared within Tol.first


def tokens_of(length: str) -> Callable[[dict, dict], float | None]:
    """The tokens a Lexico/KIVI decode stage averages a share over: its windows times its ``length`` param."""
    return lambda metrics, params: (metrics["windows"] * params[length]
                                    if "windows" in metrics and isinstance(params.get(length), int) else None)


# Families. Float32 everywhere (the recipes' dtype); matmuls are not TF32 (torch's default), but cuDNN convolutions
# are (Mamba's conv1d), and sums run in another order on the device: ~1e-6 relative on one forward's logits.
EVAL = Tol(rel=1e-3, why="fp32 forward passes only; greedy outcomes (accuracies, generated text) must agree: a flip "
                         "needs a near-tie of two logits")
QUANT = Tol(rel=2e-3, codes=0.0, floats=0.0,
            why="round-to-nearest of the same fp32 weights: amax, the division by the grid's range (by a device "
                "tensor, core/quant/formats.py: CUDA computes a division by a Python scalar as a multiplication by "
                "its reciprocal, an ulp off) and round-half-even are exact IEEE ops on both devices, so saved codes "
                "and scales are bit-exact; the quantized model's metrics differ only by summation order in the "
                "kernels")
CALIBRATED = Tol(rel=2e-2, codes=0.02, floats=5e-2,
                 why="codes from calibration statistics (Hessians, activation ranges) that differ in the last bits; "
                     "GPTQ's error feedback then moves a few codes by one step, and the group scales computed "
                     "after them (each scale within 5% of itself)")
TRAIN = Tol(rel=2e-2, abs=1e-3, codes=None, floats=None, items={"heldout_pref_accuracy": "eval_rows"},
            why="a few optimizer steps: Adam's first update is ~lr*sign(grad), so gradient noise across devices "
                "(atomics in embedding and scatter backward) moves some weights by up to lr; trained weights are not "
                "compared. Each training curve's first step (a forward and a backward pass of the same weights) "
                "within 1e-3 in loss and gradient norm, so a broken or zero gradient fails; its later steps and the "
                "final losses within 2%, its loss drop within 10% (+1e-3 of the first loss), so a run that does not "
                "learn fails; held-out preference accuracy within one pair (eval_rows; PIPA's step labels: at most "
                "one row's steps)")

# Sampling draws from a generator on the model's device (core/eval/generate.py, the overtraining noise): CUDA's
# Philox stream is not the CPU's, so what depends on the draws is not compared draw for draw.
DRAWN = "drawn from the device's generator (CUDA's stream is not the CPU's): not compared"
# Per-language shares: each language's question count is not among the metrics (a few questions each here).
LANGUAGES = {"accuracy_*": (0.0, 0.26), "ci_*": (0.0, 0.26)}
LANGUAGES_WHY = ("; the answer accuracy within one question; the per-language shares and their bootstrap bounds "
                 "within 0.26 (their counts are not recorded: one question of four)")

TOLERANCES: dict[str, Tol] = {
    # alignment: 4 steps on preference pairs, held-out preference accuracy over 2-8 pairs
    **{f"align_{m}": TRAIN for m in ("confpo", "dpo", "ipo", "kto", "pipa-step", "pipa", "simpo")},
    "blockdialect": replace(QUANT, rel=5e-3, codes=1e-3,
                            why="BlockDialect's block scales (amax over the dialect's largest value) may be an ulp "
                                "apart before rounding, and its kernel sums a block's squared error in another "
                                "order: a near tie between two dialects may pick either (<=0.1% of codes and table "
                                "ids, same error); the saved float tensors are unquantized weights (bit-exact); W4A4 "
                                "activations quantized on the fly, so perplexity within 0.5%"),
    "bnb": replace(EVAL, rel=5e-3, why="NF4 through bitsandbytes' own CPU and CUDA paths; nothing saved"),
    "clover": replace(TRAIN, first=None, why=TRAIN.why + "; CLOVER's dropout (0.05, seeded per micro-batch) draws "
                                                         "from the device's generator, so its curve's first step is "
                                                         "compared like the others (a zero gradient still fails: "
                                                         "gradient norms within 2%) and the loss drop is not"),
    "cosd": replace(EVAL, rel=2e-3, why="greedy decoding with two models; speculative draws from a CPU generator"),
    "crow": TRAIN,
    "evals": EVAL,
    "export": replace(QUANT, loose={"max_abs_logit_diff": (0.0, 1e-3)},
                      why=QUANT.why + "; the compressed-tensors folder packs those codes; the reload's logit "
                                      "difference is rounding noise (within 1e-3)"),
    "feeder": replace(EVAL, why="no training: the tree and the accuracies compare log-likelihoods of a fixed model"),
    "fope": TRAIN,
    "funbo": replace(EVAL, why="no model: offline AST mutation and NumPy, seeded; the device is unused"),
    "gptq": CALIBRATED,
    "guidedquant": replace(CALIBRATED, codes=0.05, why="LNQ's codebooks from 2 alternating solves on calibration "
                                                       "gradients: a few more indices move than with GPTQ"),
    "guidedquant_gptq": CALIBRATED,
    "humaneval": EVAL,
    "lexico": replace(TRAIN, rel=5e-2, skip=("dictionary_bytes", "*with_dictionaries", "*amortised"),
                      items={"top1_agreement": tokens_of("continuation_len"),
                             "next_token_accuracy": tokens_of("continuation_len"),
                             "greedy_agreement": tokens_of("generate_tokens"),
                             "recall_accuracy": tokens_of("recall_tokens")},
                      why="dictionaries learned for 20 steps, then OMP on the device kernel (another atom on a near "
                          "tie): KL and perplexity within 5%, stored bytes exact; the token shares (agreement, "
                          "accuracy, recall) within one token of the windows x tokens they average over, the full "
                          "cache's exactly; the dictionaries' figures differ by the 1 KiB fp8 decoding table only "
                          "the CPU holds (CUDA casts)"),
    "lift": replace(TRAIN, items={"score": "prompts", "pass@1": "prompts", "finished_rate": "completions"},
                    loose={"score_ci_*": (0.0, 0.26)},
                    why=TRAIN.why + "; the tracing eval's score and pass@1 within one prompt, finished_rate one "
                                    "completion; the score's bootstrap bounds within 0.26 (a resample may draw the "
                                    "prompt that moved several times)"),
    "llava": replace(TRAIN, items={"accuracy": "questions"}, loose=LANGUAGES, why=TRAIN.why + LANGUAGES_WHY),
    "lm": TRAIN,
    "mxfp4": replace(QUANT, why=QUANT.why + "; MXFP4's scales are powers of two (E8M0): no rounding in them"),
    "nvfp4": replace(QUANT, codes=1e-4, floats=1e-6,
                     why="NVFP4's scales are divisions (the tensor scale amax/(6*448) in fp32, each block's amax/6 "
                         "then rounded to E4M3) that CUDA may compute as a multiplication by the reciprocal, an ulp "
                         "off before rounding: a value on a rounding boundary may round the other way (<=0.01% of "
                         "codes and block scales), the fp32 tensor scales within 1e-6; metrics as round-to-nearest"),
    "onload": replace(CALIBRATED, why=CALIBRATED.why + "; on CUDA the blocks really move between the CPU store and "
                                                       "the device (on the CPU the moves are no-ops)"),
    "overtraining": replace(TRAIN, skip=("sensitivity", "turning_points"), why=TRAIN.why + "; the noise " + DRAWN),
    "parrot": replace(TRAIN, items={"accuracy": "questions", "row_accuracy": "rows"},
                      loose={**LANGUAGES, "routing_language_accuracy*": (0.0, 0.26)},
                      why=TRAIN.why + LANGUAGES_WHY + "; the routing's language accuracy (held-out routing scenes, "
                                                      "their count not recorded) within 0.26"),
    "pasta": TRAIN,
    "perplexity": replace(EVAL, rel=5e-3, why="Mamba2's conv1d runs through cuDNN in TF32"),
    "prosec": replace(EVAL, skip=("*unparsed*", "*vulnerable*", "*pairs*", "rows", "fixes_*", "trigger_ratio"),
                      why="the code samples are " + DRAWN + "; the counts the recipe fixes are"),
    "quamba2": replace(CALIBRATED, why=CALIBRATED.why + "; Mamba2's conv1d in TF32 on cuDNN during calibration"),
    "quamba2_mamba1": replace(CALIBRATED, why=CALIBRATED.why + "; Mamba1's conv1d in TF32 on cuDNN"),
    "reper": replace(TRAIN, skip=("0:*",), items={"*critic_score": "images"},
                     why=TRAIN.why + "; stage 0's captions at temperature 1 are " + DRAWN + "; the critic's integer "
                                     "scores averaged over the decoded images within one point of one image"),
    "rtn": QUANT,
    "sft": TRAIN,
    "task": replace(EVAL, skip=("0:*", "1:score*", "1:finished_rate", "1:pass@1", "1:kl_*", "1:diff*", "1:wins",
                                "1:losses", "1:ties", "1:compare_score", "1:judge_errors"),
                    why="the brackets samples (stages 0 and 1) are " + DRAWN + "; their reference NLL and the "
                        "choice rows' accuracy are exact fp32 forward passes"),
    "upcycle": replace(TRAIN, loose={"identity_max_logit_error": (0.0, 1e-4)}),
    "w8a8": replace(QUANT, float_keys={"*.act_scale": 1e-4},
                    why="weight codes and scales bit-exact (RTN); the static activation scales (act_scale) come from "
                        "a calibration forward, so within 1e-4"),
    "zoo_text": EVAL,
}


# ---- the comparison ----------------------------------------------------------------------------------------------

def _matches(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _close(a: float, b: float, rel: float, abs_: float) -> tuple[bool, float]:
    """(within tolerance, relative difference) for two numbers; NaN matches NaN, infinities must be equal."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b), 0.0 if math.isnan(a) and math.isnan(b) else math.inf
    if math.isinf(a) or math.isinf(b):
        return a == b, 0.0 if a == b else math.inf
    d, scale = abs(a - b), max(abs(a), abs(b))
    return d <= abs_ + rel * scale, d / scale if scale else 0.0


def compare_values(where: str, name: str, a: Any, b: Any, tol: Tol, roots: tuple[str, str], problems: list[str],
                   diffs: dict[str, float]) -> None:
    if _matches(name, MACHINE) or _matches(name, tol.skip):
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                if not (_matches(str(key), MACHINE) or _matches(str(key), tol.skip)):
                    problems.append(f"{where}.{key}: only on {'cuda' if key in b else 'cpu'}")
                continue
            compare_values(f"{where}.{key}", str(key), a[key], b[key], tol, roots, problems, diffs)
        return
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            problems.append(f"{where}: {len(a)} items on cpu, {len(b)} on cuda")
            return
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            compare_values(f"{where}[{i}]", name, x, y, tol, roots, problems, diffs)
        return
    numeric = (int, float)
    if isinstance(a, numeric) and isinstance(b, numeric) and not isinstance(a, bool) and not isinstance(b, bool):
        rel, abs_ = next((v for p, v in tol.loose.items() if fnmatch.fnmatchcase(name, p)), (tol.rel, tol.abs))
        ok, d = _close(float(a), float(b), rel, abs_)
        if d:
            diffs[where] = d
        if not ok:
            problems.append(f"{where}: cpu {a!r}, cuda {b!r} (relative {d:.3g}; allowed rel {rel:g} + abs {abs_:g})")
        return
    if isinstance(a, str) and isinstance(b, str) and all(roots):
        a, b = a.replace(roots[0], "<run>"), b.replace(roots[1], "<run>")
    if a != b:
        problems.append(f"{where}: cpu {a!r:.120}, cuda {b!r:.120}")


def for_stage(tol: Tol, index: Any) -> Tol:
    """The row as it applies to stage ``index``: its "N:glob" skips for that stage only."""
    prefix = f"{index}:"
    return replace(tol, skip=tuple(p.removeprefix(prefix) for p in tol.skip if ":" not in p or p.startswith(prefix)))


def one_item(tol: Tol, metrics: dict, params: dict) -> dict[str, tuple[float, float]]:
    """``tol.items`` for one stage, as ``loose`` entries: each share may move by one item of its count."""
    out = {}
    for pattern, count in tol.items.items():
        n = metrics.get(count) if isinstance(count, str) else count(metrics, params)
        if isinstance(n, int | float) and not isinstance(n, bool) and n > 0:
            out[pattern] = (0.0, 1.0 / n + 1e-9)
    return out


def compare_metrics(cpu: dict, cuda: dict, tol: Tol, roots: tuple[str, str] = ("", ""),
                    params: list[dict] | None = None) -> tuple[list[str], dict]:
    """Problems (one line each) and the relative differences seen, stage by stage (``params``: each stage's, for the
    counts ``tol.items`` derives from them)."""
    problems: list[str] = []
    diffs: dict[str, float] = {}
    a, b = cpu.get("stages", []), cuda.get("stages", [])
    if len(a) != len(b):
        problems.append(f"{len(a)} stages on cpu, {len(b)} on cuda")
    for sa, sb in zip(a, b, strict=False):  # the count is checked above
        where = f"stage {sa.get('index')} ({sa.get('method')})"
        if (sa.get("method"), sa.get("stage")) != (sb.get("method"), sb.get("stage")):
            problems.append(f"{where}: cuda ran {sb.get('method')} ({sb.get('stage')})")
            continue
        index, metrics = sa.get("index"), sa.get("metrics", {})
        stage_params = params[index] if params and isinstance(index, int) and index < len(params) else {}
        here = for_stage(tol, index)
        here = replace(here, loose={**one_item(tol, metrics, stage_params), **tol.loose})
        compare_values(where, "", metrics, sb.get("metrics", {}), here, roots, problems, diffs)
    return problems, diffs


def stage_params(run: Path) -> list[dict]:
    """Each stage's params as the run resolved them (its ``config.yaml``)."""
    path = run / "config.yaml"
    pipeline = (yaml.safe_load(path.read_text()) or {}).get("pipeline", []) if path.is_file() else []
    return [(s or {}).get("params") or {} for s in pipeline]


def curve_files(run: Path) -> dict[str, Path]:
    """Every training stage's per-step record (``artifacts/N_method/metrics.jsonl``), by path inside the run."""
    return {str(p.relative_to(run)): p for p in sorted(run.rglob("metrics.jsonl"))}


def compare_curves(cpu: Path, cuda: Path, tol: Tol) -> tuple[list[str], dict]:
    """The two runs' training curves, step by step: the first step's ``FIRST`` figures within ``tol.first``, the
    rest at the row's tolerance, and the loss drop over the curve (Tol's docstring)."""
    from llmx.core.runs import records

    problems: list[str] = []
    diffs: dict[str, float] = {}
    a, b = curve_files(cpu), curve_files(cuda)
    for rel in sorted(set(a) ^ set(b)):
        problems.append(f"{rel}: a training curve only on {'cpu' if rel in a else 'cuda'}")
    for rel in sorted(set(a) & set(b)):
        ra, rb = records(a[rel]), records(b[rel])
        if len(ra) != len(rb):
            problems.append(f"{rel}: {len(ra)} steps on cpu, {len(rb)} on cuda")
            continue
        index = Path(rel).parent.name.partition("_")[0]  # artifacts/N_method/metrics.jsonl
        here = for_stage(tol, int(index) if index.isdigit() else index)
        for i, (x, y) in enumerate(zip(ra, rb, strict=True)):
            where = f"{rel} step {x.get('step', i + 1)}"
            if i == 0 and here.first is not None:
                tight = replace(here, rel=here.first, abs=0.0, loose={})
                both = [key for key in FIRST if key in x and key in y]
                for key in both:
                    compare_values(f"{where}.{key}", key, x[key], y[key], tight, ("", ""), problems, diffs)
                x, y = {k: v for k, v in x.items() if k not in both}, {k: v for k, v in y.items() if k not in both}
            compare_values(where, "", x, y, here, ("", ""), problems, diffs)
        losses = [[r.get("loss") for r in (c[0], c[-1])] for c in (ra, rb)] if ra else []
        if (here.first is None or len(ra) < 2 or _matches("loss", here.skip)
                or not all(isinstance(v, int | float) and math.isfinite(v) for pair in losses for v in pair)):
            continue
        (first_a, last_a), (first_b, last_b) = losses
        drop_a, drop_b = first_a - last_a, first_b - last_b
        d, allowed = abs(drop_b - drop_a), here.learn * abs(drop_a) + here.first * abs(first_a)
        if d:
            diffs[f"{rel} loss drop"] = d / max(abs(drop_a), abs(drop_b))
        if d > allowed:
            problems.append(f"{rel}: the loss drops by {drop_a:.5g} over {len(ra)} steps on cpu, {drop_b:.5g} on cuda "
                            f"(allowed {here.learn:g} of the drop + {here.first:g} of the first loss: {allowed:.3g})")
    return problems, diffs


def _bits(t: torch.Tensor) -> torch.Tensor:
    """An integer view of the tensor's storage (fp8 and bool read as bytes)."""
    if t.dtype == torch.bool or "float8" in str(t.dtype):
        return t.view(torch.uint8)
    return t


def compare_tensors(where: str, a: torch.Tensor, b: torch.Tensor, tol: Tol, problems: list[str],
                    diffs: dict[str, float]) -> None:
    if a.dtype != b.dtype or a.shape != b.shape:
        problems.append(f"{where}: cpu {a.dtype} {tuple(a.shape)}, cuda {b.dtype} {tuple(b.shape)}")
        return
    if a.is_floating_point() and "float8" not in str(a.dtype):
        if tol.floats is None:
            return
        allowed = next((v for p, v in tol.float_keys.items() if fnmatch.fnmatchcase(where, p)), tol.floats)
        d, at = float_difference(a, b)
        x, y = a.double().flatten(), b.double().flatten()
        same_nan = torch.equal(x.isnan(), y.isnan())
        inf = x.isinf() | y.isinf()
        same_inf = torch.equal(x[inf], y[inf])
        if d:
            diffs[where] = d
        if not (same_nan and same_inf) or d > allowed:
            worst = f"; element {at}: cpu {float(x[at]):.8g}, cuda {float(y[at]):.8g}" if at >= 0 else ""
            problems.append(f"{where}: float tensor differs by {d:.3g} of an element's magnitude (+{FLOOR:g} of the "
                            f"largest){worst} (allowed {allowed:g}){'' if same_nan else '; NaNs differ'}"
                            f"{'' if same_inf else '; infinities differ'}")
        return
    if tol.codes is None:
        return
    share = float((_bits(a) != _bits(b)).double().mean()) if a.numel() else 0.0
    if share:
        diffs[where] = share
    if share > tol.codes:
        problems.append(f"{where}: {share:.3%} of {a.numel()} codes differ (allowed {tol.codes:.3%})")


def float_difference(a: torch.Tensor, b: torch.Tensor) -> tuple[float, int]:
    """The largest ``|b - a| / (max(|a|, |b|) + FLOOR * the largest magnitude)`` over the elements finite on both
    sides, and its flat index (-1: none): per element, so a small entry far off is seen, with a floor so that
    entries near zero are measured against the tensor's scale."""
    x, y = a.double().flatten(), b.double().flatten()
    fin = x.isfinite() & y.isfinite()
    if not fin.any():
        return 0.0, -1
    size = torch.maximum(x.abs(), y.abs()).where(fin, torch.zeros((), dtype=x.dtype))
    ratio = ((x - y).abs() / (size + FLOOR * size.max()).clamp_min(1e-300)).where(fin, torch.zeros((), dtype=x.dtype))
    at = int(ratio.argmax())
    return float(ratio[at]), at


def saved_files(run: Path) -> dict[str, Path]:
    return {str(p.relative_to(run)): p for p in sorted(run.rglob("*.safetensors"))}


def compare_saved(cpu: Path, cuda: Path, tol: Tol) -> tuple[list[str], dict]:
    """Every tensor of every ``.safetensors`` file the two runs saved, matched by path inside the run folder."""
    from safetensors.torch import load_file

    problems: list[str] = []
    diffs: dict[str, float] = {}
    if tol.codes is None and tol.floats is None:
        return problems, diffs
    a, b = saved_files(cpu), saved_files(cuda)
    for rel in sorted(set(a) ^ set(b)):
        problems.append(f"{rel}: saved only on {'cpu' if rel in a else 'cuda'}")
    for rel in sorted(set(a) & set(b)):
        ta, tb = load_file(str(a[rel])), load_file(str(b[rel]))
        for key in sorted(set(ta) ^ set(tb)):
            problems.append(f"{rel}:{key}: only on {'cpu' if key in ta else 'cuda'}")
        for key in sorted(set(ta) & set(tb)):
            compare_tensors(f"{rel}:{key}", ta[key], tb[key], tol, problems, diffs)
    return problems, diffs


def compare_runs(cpu: Path, cuda: Path, tol: Tol) -> tuple[list[str], dict]:
    problems, diffs = compare_metrics(json.loads((cpu / "metrics.json").read_text()),
                                      json.loads((cuda / "metrics.json").read_text()), tol, (str(cpu), str(cuda)),
                                      stage_params(cpu))
    curves, curve_diffs = compare_curves(cpu, cuda, tol)
    more, saved_diffs = compare_saved(cpu, cuda, tol)
    return problems + curves + more, {**diffs, **curve_diffs, **saved_diffs}


# ---- running a recipe --------------------------------------------------------------------------------------------

def finished_run(out: Path) -> Path:
    """The one run folder under ``out``, which must have finished ok (its error otherwise)."""
    runs = sorted(p.parent for p in out.glob("*/meta.json"))
    if not runs:
        raise AssertionError(f"no run folder under {out}")
    meta = json.loads((runs[-1] / "meta.json").read_text())
    if meta.get("status") != "ok" or not (runs[-1] / "metrics.json").is_file():
        raise AssertionError(f"run {runs[-1]} is {meta.get('status')}: {meta.get('error', '')[-1500:]}")
    return runs[-1]


def _command(name: str, device: str, out: Path, sets: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """``python -m llmx --json run configs/smoke/NAME.yaml --device DEVICE`` and its environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMX_") or k == "LLMX_CACHE_DIR"}
    env.update(OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"), PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [env.get("PYTHONPATH")])]))
    if device == "cpu":
        env["LLMX_CPU_KERNELS"] = "0"  # the exact float32 path: what the CUDA kernels compute
    cmd = [sys.executable, "-m", "llmx", "--json", "run", str(SMOKE / f"{name}.yaml"), "--device", device,
           "--output-dir", str(out), *(a for s in sets for a in ("--set", s))]
    return cmd, env


def run_recipe(name: str, out: Path, *sets: str, devices: tuple[str, ...] = ("cpu",)) -> list[Path]:
    """The recipe on each device, in fresh processes side by side (``out/DEVICE``); their run folders."""
    procs = []
    out.mkdir(parents=True, exist_ok=True)
    for device in devices:
        cmd, env = _command(name, device, out / device, sets)
        with open(out / f"{device}.out", "w") as stdout, open(out / f"{device}.err", "w") as stderr:  # no pipe fills
            procs.append(subprocess.Popen(cmd, stdout=stdout, stderr=stderr, env=env, cwd=ROOT))
    for device, proc in zip(devices, procs, strict=True):
        if proc.wait(timeout=900) != 0:
            err = (out / f"{device}.err").read_text(errors="replace")
            raise AssertionError(f"{name} on {device}: exit {proc.returncode}\n{err[-3000:]}")
    return [finished_run(out / device) for device in devices]


def missing_requirement(name: str) -> str | None:
    """Why this machine cannot run the recipe on CUDA (a package; CuPy where a method declares it), or None."""
    from llmx.cli.build import merged_files, resolve_cli
    from llmx.core.pipeline import check_requirements
    from llmx.errors import MissingRequirement

    path = SMOKE / f"{name}.yaml"
    raw = {**merged_files([path]), "device": "cuda"}
    try:
        check_requirements(resolve_cli(raw, None, None, source=str(path), files=[path]))
    except MissingRequirement as exc:
        return exc.message
    return None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", RECIPES)
def test_recipe_on_cuda_matches_the_cpu(name, tmp_path):
    tol = TOLERANCES[name]
    if SELECTED and name not in SELECTED:
        pytest.skip("not in GPU_CHECK_RECIPES")
    reason = missing_requirement(name)
    if reason:
        pytest.skip(reason)
    if RUNS:  # the device check ran both already
        cpu, cuda = (finished_run(Path(RUNS) / d / name) for d in ("cpu", "cuda"))
    else:
        cpu, cuda = run_recipe(name, tmp_path, devices=("cpu", "cuda"))
    device = json.loads((cuda / "meta.json").read_text())["device"]
    assert device.startswith("cuda"), device
    problems, diffs = compare_runs(cpu, cuda, tol)
    if REPORT:
        worst = dict(sorted(diffs.items(), key=lambda kv: -kv[1])[:8])
        with open(REPORT, "a") as f:
            f.write(json.dumps({"recipe": name, "ok": not problems, "problems": problems[:20], "largest": worst}) + "\n")
    assert not problems, f"{name}: {len(problems)} differences beyond the table ({tol.why}):\n" + "\n".join(problems[:40])


# ---- on the CPU: the table, the comparison, the refusals ---------------------------------------------------------

def test_the_table_has_a_row_for_every_recipe_and_no_other():
    assert RECIPES, SMOKE
    assert sorted(TOLERANCES) == RECIPES, {"no row": sorted(set(RECIPES) - set(TOLERANCES)),
                                           "no recipe": sorted(set(TOLERANCES) - set(RECIPES))}
    for name, tol in TOLERANCES.items():
        assert tol.why and tol.rel >= 0 and tol.abs >= 0, name
        assert all(isinstance(count, str) or callable(count) for count in tol.items.values()), name


def test_the_comparison_flags_planted_differences(tmp_path):
    """A real CPU run of the W8A8 recipe (packed weights saved) compared with a copy of itself, then with plants."""
    run, = run_recipe("w8a8", tmp_path / "a")
    twin = tmp_path / "b" / run.name
    shutil.copytree(run, twin)
    original = (run / "metrics.json").read_text()
    (twin / "metrics.json").write_text(original.replace(str(run), str(twin)))  # as a run of its own records it
    tol = TOLERANCES["w8a8"]
    assert compare_runs(run, twin, tol) == ([], {})
    assert saved_files(run), "the W8A8 recipe saves its packed model"

    metrics = json.loads((twin / "metrics.json").read_text())
    ppl = next(s["metrics"] for s in metrics["stages"] if s["method"] == "perplexity")
    ppl["perplexity"] *= 1 + 5 * tol.rel  # beyond the table
    ppl["nll"] *= 1 + tol.rel / 4  # within it
    ppl["seconds"] = 1e9  # never compared
    metrics["stages"][-1]["metrics"]["speed_only"] = 1  # a metric only one side has
    (twin / "metrics.json").write_text(json.dumps(metrics))
    problems, diffs = compare_runs(run, twin, tol)
    assert len(problems) == 2, problems
    assert "perplexity: cpu" in problems[0] and "speed_only: only on cuda" in problems[1]
    assert any(k.endswith(".nll") for k in diffs)
    (twin / "metrics.json").write_text(original.replace(str(run), str(twin)))

    from safetensors.torch import load_file, save_file

    (rel, path), = saved_files(twin).items()
    saved = path.read_bytes()

    def planted(edit, row=tol) -> list[str]:
        """The comparison with one edit of the twin's saved tensors (the original restored first)."""
        path.write_bytes(saved)
        tensors = load_file(str(path))
        edit(tensors)
        save_file(tensors, str(path), metadata={"format": "pt"})
        return compare_runs(run, twin, row)[0]

    tensors = load_file(str(path))
    code = next(k for k, t in tensors.items() if t.dtype == torch.int8)
    numel = tensors[code].numel()

    def flip(t):
        t[code].view(-1)[0] ^= 1  # one code of one layer

    assert planted(flip) == [f"{rel}:{code}: {1 / numel:.3%} of {numel} codes differ (allowed 0.000%)"]
    assert planted(flip, replace(tol, codes=0.01)) == []  # within a looser table row

    scale = next(k for k, t in tensors.items() if k.endswith(".scales") and t.dtype == torch.float16)

    def ulp(t):  # a weight scale one fp16 ulp up: RTN's scales are bit-exact
        t[scale].view(torch.int16).view(-1)[0] += 1

    problems = planted(ulp)
    assert len(problems) == 1 and problems[0].startswith(f"{rel}:{scale}: float tensor differs"), problems
    act = next(k for k in tensors if k.endswith(".act_scale"))
    for factor, flagged in ((1 + 2e-5, 0), (1 + 1e-3, 1)):  # the activation scales' own 1e-4

        def calibration(t, factor=factor):
            t[act].mul_(factor)

        assert len(planted(calibration)) == flagged, factor

    # Per element: one small entry of a float tensor off by 10x the allowance. Measured against the tensor's largest
    # magnitude (as this comparison once did) it hides below the allowance.
    weight = tensors["model.embed_tokens.weight"]
    size = weight.abs().flatten()
    small = int(((size > 0.01 * size.max()) & (size < 0.05 * size.max())).nonzero()[0])
    loose = replace(tol, floats=1e-3, float_keys={})

    def nudge(t):
        t["model.embed_tokens.weight"].view(-1)[small] *= 1 + 10 * loose.floats

    problems = planted(nudge, loose)
    assert len(problems) == 1 and "model.embed_tokens.weight: float tensor differs" in problems[0], problems
    nudged = load_file(str(path))["model.embed_tokens.weight"]
    assert float((nudged - weight).abs().max() / weight.abs().max()) < loose.floats  # what the old measure saw
    assert planted(nudge, replace(loose, floats=2e-2)) == []


def _training_run(folder: Path, curve: list[tuple[float, float]], accuracy: float = 0.5,
                  agreement: float = 0.5) -> Path:
    """A run folder as a training recipe leaves it: one aligning stage with its curve ((loss, gradient norm) per
    step) and held-out accuracy over 4 pairs, then a Lexico-style decode stage (2 windows of 8 tokens)."""
    run = folder / "run"
    (run / "artifacts" / "0_dpo").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"pipeline": [
        {"method": "dpo", "params": {"steps": len(curve)}},
        {"method": "lexico", "params": {"continuation_len": 8, "generate_tokens": 4}}]}))
    (run / "metrics.json").write_text(json.dumps({"stages": [
        {"index": 0, "method": "dpo", "stage": "train", "metrics": {
            "final_loss": curve[-1][0], "eval_rows": 4, "heldout_pref_accuracy": accuracy}},
        {"index": 1, "method": "lexico", "stage": "decode", "metrics": {
            "windows": 2, "top1_agreement": agreement, "perplexity": 10.0}}]}))
    (run / "artifacts" / "0_dpo" / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i + 1, "lr": 1e-5, "loss": loss, "grad_norm": norm}) + "\n"
        for i, (loss, norm) in enumerate(curve)))
    return run


def test_training_curves_catch_a_zero_gradient_a_wrong_first_loss_and_no_learning(tmp_path):
    """Four DPO-like steps whose loss moves by 0.1% in all: within TRAIN's 2% on every step, so only the curve's
    first step (1e-3) and its loss drop (10%) tell a broken backward or a run that does not learn."""
    tol = replace(TRAIN, items={**TRAIN.items, **TOLERANCES["lexico"].items})
    cpu_curve = [(0.6931, 2.07), (0.6929, 1.59), (0.6925, 1.41), (0.6921, 1.30)]
    cpu = _training_run(tmp_path / "cpu", cpu_curve)

    def check(name, curve, **kw) -> list[str]:
        return compare_runs(cpu, _training_run(tmp_path / name, curve, **kw), tol)[0]

    assert check("same", cpu_curve) == []
    noise = [(loss * (1 + 3e-6), norm * (1 - 2e-4)) for loss, norm in cpu_curve]
    assert check("noise", noise) == []
    zero = [(0.6931, 0.0)] * 4  # no gradient: nothing learned either
    problems = check("zero", zero)
    assert any("step 1.grad_norm" in p for p in problems) and any("the loss drops" in p for p in problems), problems
    off = [(cpu_curve[0][0] * 1.002, cpu_curve[0][1]), *cpu_curve[1:]]  # a forward 0.2% off (the drop with it)
    problems = check("off", off)
    assert "step 1.loss" in problems[0] and all("step 1.loss" in p or "the loss drops" in p for p in problems), problems
    still = [(0.6931, norm) for _, norm in cpu_curve]  # right gradients, no update
    problems = check("still", still)
    assert len(problems) == 1 and "the loss drops by 0.001 over 4 steps on cpu, 0 on cuda" in problems[0], problems
    assert check("short", cpu_curve[:3]) == ["artifacts/0_dpo/metrics.jsonl: 4 steps on cpu, 3 on cuda"]
    dropout = replace(tol, first=None)  # a first step drawn on the device: the row's tolerance, no drop check
    assert compare_runs(cpu, _training_run(tmp_path / "still2", still), dropout)[0] == []

    # shares move by one item of their count: one pair of 4, one token of 2 windows x 8
    for accuracy, agreement, flagged in ((0.75, 0.5625, 0), (1.0, 0.5, 1), (0.5, 0.625, 1)):
        problems = check(f"share{accuracy}{agreement}", cpu_curve, accuracy=accuracy, agreement=agreement)
        assert len(problems) == flagged, (accuracy, agreement, problems)


def test_the_comparison_reads_paths_inside_the_run_and_every_value_kind():
    tol = Tol(rel=1e-3, loose={"acc*": (0.0, 0.25)}, skip=("samples",), why="test")
    cpu = {"stages": [{"index": 0, "method": "m", "stage": "eval", "metrics": {
        "file": "/r/cpu/x.json", "ok": True, "n": 7, "acc": 0.5, "ci": [0.1, 0.9], "none": None, "samples": ["a"],
        "nan": float("nan"), "ms_per_step": 3.0}}]}
    same = json.loads(json.dumps(cpu).replace("/r/cpu", "/r/cuda"))
    same["stages"][0]["metrics"].update(acc=0.75, samples=["b"], ms_per_step=9.0)
    assert compare_metrics(cpu, same, tol, ("/r/cpu", "/r/cuda"))[0] == []
    for key, value in (("ok", False), ("n", 8), ("ci", [0.1, 0.95]), ("ci", [0.1]), ("none", 0), ("acc", 1.0),
                       ("nan", 1.0), ("file", "/r/cuda/y.json")):
        other = json.loads(json.dumps(same))
        other["stages"][0]["metrics"][key] = value
        assert len(compare_metrics(cpu, other, tol, ("/r/cpu", "/r/cuda"))[0]) == 1, (key, value)
    other = json.loads(json.dumps(same))
    other["stages"][0]["method"] = "other"
    assert compare_metrics(cpu, other, tol)[0] == ["stage 0 (m): cuda ran other (eval)"]
    assert compare_metrics(cpu, {"stages": []}, tol)[0] == ["1 stages on cpu, 0 on cuda"]
    two = {"stages": [{"index": i, "method": "m", "stage": "eval", "metrics": {"x": 1.0}} for i in (0, 1)]}
    drawn = replace(tol, skip=("1:x",))  # a stage-specific skip
    for i, flagged in ((1, 0), (0, 1)):
        other = json.loads(json.dumps(two))
        other["stages"][i]["metrics"]["x"] = 2.0
        assert len(compare_metrics(two, other, drawn)[0]) == flagged, i


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the device check would run for real")
def test_the_device_check_refuses_without_cuda_in_one_line(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out)}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh")], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert len(lines) == 1 and "CUDA" in lines[0], lines
    assert not out.exists()  # before any work


def test_the_kernel_benchmark_dry_runs_on_the_cpu_and_refuses_cuda_here(tmp_path):
    env = {**os.environ, "LLMX_BENCH_RESULTS": str(tmp_path), "OMP_NUM_THREADS": "1"}
    script = str(ROOT / "benchmarks" / "bench_kernels_gpu.py")
    proc = subprocess.run([sys.executable, script, "--device", "cpu", "--repeats", "1"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((tmp_path / "kernels_gpu.json").read_text())
    assert len({r["kernel"] for r in doc["rows"]}) == 10 and all(r["match"] and not r["error"] for r in doc["rows"])
    if not torch.cuda.is_available():
        proc = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 3 and len((proc.stdout + proc.stderr).strip().splitlines()) == 1, proc.stderr
