"""Every smoke recipe on CUDA against the same recipe on the CPU.

``test_recipe_on_cuda_matches_the_cpu[NAME]`` (gpu) runs ``configs/smoke/NAME.yaml`` in fresh processes with
``--device cpu`` and ``--device cuda`` (same seed: the recipe's) and compares, stage by stage, every metric in the two
runs' ``metrics.json`` and every tensor of every ``.safetensors`` file the runs saved, within NAME's row of
TOLERANCES. The CPU side runs with ``LLMX_CPU_KERNELS=0``, the exact float32 path of packed layers, since the CPU's
bf16 int4/int8 kernels compute something else than the CUDA kernels do. ``GPU_CHECK_RUNS=DIR`` reads the runs
``scripts/gpu-check.sh`` made (``DIR/cpu/NAME/<run>/``, ``DIR/cuda/NAME/<run>/``) instead of running them again, and
``GPU_CHECK_REPORT=FILE`` appends one JSON line per recipe with its largest differences (to set tolerances from).

Without CUDA these are skipped; the CPU tests below check that TOLERANCES has a row for every recipe, that the
comparison flags planted differences in a real run folder, and that the device check and the kernel benchmark refuse
cleanly (exit 3) here.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import torch

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
    relative to it). ``loose``: metric-name patterns with their own ``(rel, abs)``. ``skip``: metric-name patterns
    not compared (``why`` says why); ``N:glob`` skips in stage N only. ``codes``: share of the elements of each
    integer (or fp8) tensor in the saved ``.safetensors`` files that may differ, 0.0 bit-exact; ``floats``: the
    largest difference of each float tensor there over its largest magnitude, 0.0 bit-exact; None: saved tensors not
    compared. (A recipe whose method declares ``cupy`` is skipped without CuPy: its point on CUDA is a kernel.)"""

    rel: float
    abs: float = 0.0
    codes: float | None = 0.0
    floats: float | None = 0.0
    loose: dict[str, tuple[float, float]] = field(default_factory=dict)
    skip: tuple[str, ...] = ()
    why: str = ""


# Families. Float32 everywhere (the recipes' dtype); matmuls are not TF32 (torch's default), but cuDNN convolutions
# are (Mamba's conv1d), and sums run in another order on the device: ~1e-6 relative on one forward's logits.
EVAL = Tol(rel=1e-3, why="fp32 forward passes only; greedy outcomes (accuracies, generated text) must agree: a flip "
                         "needs a near-tie of two logits")
QUANT = Tol(rel=2e-3, codes=0.0, floats=0.0,
            why="round-to-nearest of the same fp32 weights: amax, division and round-half-even are exact IEEE ops on "
                "both devices, so saved codes and scales are bit-exact; the quantized model's metrics differ only "
                "by summation order in the kernels")
CALIBRATED = Tol(rel=2e-2, codes=0.02, floats=5e-2,
                 why="codes from calibration statistics (Hessians, activation ranges) that differ in the last bits; "
                     "GPTQ's error feedback then moves a few codes by one step, and the group scales computed "
                     "after them")
TRAIN = Tol(rel=2e-2, abs=1e-3, codes=None, floats=None,
            loose={"*accuracy*": (0.0, 0.26), "*score*": (0.0, 0.26), "*agreement*": (0.0, 0.26)},
            why="a few optimizer steps: Adam's first update is ~lr*sign(grad), so gradient noise across devices "
                "(atomics in embedding and scatter backward) moves some weights by up to lr; trained weights are not "
                "compared, losses within 2%, and outcome shares may move by one sample of four")

# Sampling draws from a generator on the model's device (core/eval/generate.py, the overtraining noise): CUDA's
# Philox stream is not the CPU's, so what depends on the draws is not compared draw for draw.
DRAWN = "drawn from the device's generator (CUDA's stream is not the CPU's): not compared"

TOLERANCES: dict[str, Tol] = {
    # alignment: 4 steps on preference pairs, held-out preference accuracy over 2-8 pairs
    **{f"align_{m}": TRAIN for m in ("confpo", "dpo", "ipo", "kto", "pipa-step", "pipa", "simpo")},
    "blockdialect": replace(QUANT, rel=5e-3, codes=1e-3,
                            why="BlockDialect's kernel sums a block's squared error in another order: a near tie "
                                "between two dialects may pick either (<=0.1% of table ids, same error); W4A4 "
                                "activations quantized on the fly, so perplexity within 0.5%"),
    "bnb": replace(EVAL, rel=5e-3, why="NF4 through bitsandbytes' own CPU and CUDA paths; nothing saved"),
    "clover": TRAIN,
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
                      why="dictionaries learned for 20 steps, then OMP on the device kernel (another atom on a near "
                          "tie): KL and perplexity within 5%, stored bytes exact; the dictionaries' figures differ by the "
                          "1 KiB fp8 decoding table only the CPU holds (CUDA casts)"),
    "lift": TRAIN,
    "llava": TRAIN,
    "lm": TRAIN,
    "mxfp4": QUANT,
    "nvfp4": QUANT,
    "overtraining": replace(TRAIN, skip=("sensitivity", "turning_points"), why=TRAIN.why + "; the noise " + DRAWN),
    "parrot": TRAIN,
    "pasta": TRAIN,
    "perplexity": replace(EVAL, rel=5e-3, why="Mamba2's conv1d runs through cuDNN in TF32"),
    "prosec": replace(EVAL, skip=("*unparsed*", "*vulnerable*", "*pairs*", "rows", "fixes_*", "trigger_ratio"),
                      why="the code samples are " + DRAWN + "; the counts the recipe fixes are"),
    "quamba2": replace(CALIBRATED, why=CALIBRATED.why + "; Mamba2's conv1d in TF32 on cuDNN during calibration"),
    "quamba2_mamba1": replace(CALIBRATED, why=CALIBRATED.why + "; Mamba1's conv1d in TF32 on cuDNN"),
    "reper": replace(TRAIN, skip=("0:*",), why=TRAIN.why + "; stage 0's captions at temperature 1 are " + DRAWN),
    "rtn": QUANT,
    "sft": TRAIN,
    "task": replace(EVAL, skip=("0:*", "1:score*", "1:finished_rate", "1:pass@1", "1:kl_*", "1:diff*", "1:wins",
                                "1:losses", "1:ties", "1:compare_score", "1:judge_errors"),
                    why="the brackets samples (stages 0 and 1) are " + DRAWN + "; their reference NLL and the "
                        "choice rows' accuracy are exact fp32 forward passes"),
    "upcycle": replace(TRAIN, loose={"identity_max_logit_error": (0.0, 1e-4), **TRAIN.loose}),
    "w8a8": replace(QUANT, floats=1e-4, why="weight codes bit-exact (RTN); the static activation scales come from a "
                                            "calibration forward, so saved float tensors within 1e-4"),
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


def compare_metrics(cpu: dict, cuda: dict, tol: Tol, roots: tuple[str, str] = ("", "")) -> tuple[list[str], dict]:
    """Problems (one line each) and the relative differences seen, stage by stage."""
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
        prefix = f"{sa.get('index')}:"  # "N:glob" skips apply to stage N only
        here = replace(tol, skip=tuple(p.removeprefix(prefix) for p in tol.skip if ":" not in p or p.startswith(prefix)))
        compare_values(where, "", sa.get("metrics", {}), sb.get("metrics", {}), here, roots, problems, diffs)
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
        a64, b64 = a.double(), b.double()
        same_nan = torch.equal(a64.isnan(), b64.isnan())
        fin = ~a64.isnan()
        d = float((a64[fin] - b64[fin]).abs().max() / a64[fin].abs().max().clamp_min(1e-30)) if fin.any() else 0.0
        if d:
            diffs[where] = d
        if not same_nan or d > tol.floats:
            problems.append(f"{where}: float tensor differs by {d:.3g} of its largest magnitude "
                            f"(allowed {tol.floats:g}){'' if same_nan else '; NaNs differ'}")
        return
    if tol.codes is None:
        return
    share = float((_bits(a) != _bits(b)).double().mean()) if a.numel() else 0.0
    if share:
        diffs[where] = share
    if share > tol.codes:
        problems.append(f"{where}: {share:.3%} of {a.numel()} codes differ (allowed {tol.codes:.3%})")


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
                                      json.loads((cuda / "metrics.json").read_text()), tol, (str(cpu), str(cuda)))
    more, saved_diffs = compare_saved(cpu, cuda, tol)
    return problems + more, {**diffs, **saved_diffs}


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

    from safetensors.torch import load_file, save_file

    (rel, path), = saved_files(twin).items()
    tensors = load_file(str(path))
    key = next(k for k, t in tensors.items() if t.dtype == torch.int8)
    tensors[key].view(-1)[0] ^= 1  # one code of one layer
    save_file(tensors, str(path), metadata={"format": "pt"})
    (twin / "metrics.json").write_text(original.replace(str(run), str(twin)))
    problems, _ = compare_runs(run, twin, tol)
    assert problems == [f"{rel}:{key}: {1 / tensors[key].numel():.3%} of {tensors[key].numel()} codes differ "
                        "(allowed 0.000%)"]
    assert compare_runs(run, twin, replace(tol, codes=0.01))[0] == []  # within a looser table row


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
