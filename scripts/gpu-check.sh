#!/usr/bin/env bash
# The device check for a lent CUDA machine whose system python has torch (and CuPy) but no package index: the
# packages it lacks come as wheels in .whl/ (`make gpu-wheels`, run beforehand where an index is reachable).
#
#   scripts/gpu-check.sh      # summary.md, summary.json, logs.tar.gz to ${OUT:-gpu-check}/; PYTHON=... picks python
#
# Steps, each under its own timeout (about 5 minutes on one H100; the limits add up to 7.5 minutes):
#   1. refuse (one line, exit 3) before any work when torch sees no CUDA device or CuPy is missing;
#   2. install .whl/*.whl into /tmp/llmx-site (no index, no deps) and run llmx from this checkout (PYTHONPATH);
#   3. every smoke recipe on CUDA and, alongside, on the CPU (LLMX_CPU_KERNELS=0: the exact float32 path), plus the
#      gpu-marked tests other than the recipe comparison;
#      and, beside them, the fast CPU suite under the machine's own torch and transformers (the lowest bounds
#      pyproject.toml states are what CUDA images ship: this is where torch's is tested);
#   4. tests/test_gpu_methods.py on those runs: each recipe's CUDA metrics and saved codes against its CPU run;
#   5. benchmarks/bench_kernels_gpu.py: every CuPy kernel against its PyTorch reference, timed with CUDA events;
#   6. Lexico and KIVI at an 896-token context against the full cache: stored bytes and peak device memory;
#   7. summary.md and summary.json: per recipe CUDA/CPU smoke and comparison, other gpu tests, kernels, memory.
# Exit 0 when every step passed, 1 otherwise, 3 when refused. For a rerun of what failed: GPU_CHECK_RECIPES="rtn gptq"
# limits steps 3-4 to those recipes, GPU_CHECK_STEPS="smoke compare" (of: smoke tests suite compare kernels memory) to those
# steps. GPU_CHECK_DRY=1 walks every step on a machine without a GPU (to test this script).
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
  timeout -k 10 "$limit" bash -c '"$@"' _ "$@" > "$WORK/$name.log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t))" "$limit" >> "$WORK/steps.tsv"
  if [ "$rc" -ne 0 ]; then
    echo "gpu-check: $name: exit $rc$([ "$rc" -eq 124 ] && echo ' (timed out)'); last lines of $WORK/$name.log:"
    tail -n 5 "$WORK/$name.log" | sed 's/^/    /'
  fi
}

install_wheels() {
  shopt -s nullglob
  local wheels=(.whl/*.whl)
  if [ ${#wheels[@]} -eq 0 ]; then echo "no .whl/*.whl: nothing to install"; return 0; fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}" \
    && echo "installed ${#wheels[@]} wheels into $SITE"
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

smoke_and_tests() {  # the recipes on both devices and the other gpu tests, side by side (16 cores, one GPU)
  local deadline=$(($(date +%s) + $1)) recipes cuda=0 cpu=0 tests
  # the slowest first (CPU seconds measured on the CI machine), so the phase does not end on a long tail
  recipes=${GPU_CHECK_RECIPES:-$( (for n in $SLOW; do [ -f "configs/smoke/$n.yaml" ] && echo "$n"; done
                                   for f in configs/smoke/*.yaml; do basename "$f" .yaml; done) | awk '!seen[$0]++')}
  if want smoke; then
    # shellcheck disable=SC2016  # $1 and $2 are the inner shell's
    echo "$recipes" | tr ' ' '\n' | xargs -P 4 -I{} bash -c 'smoke_one cuda "$1" "$2"' _ {} "$deadline" \
      > "$WORK/smoke/cuda.log" 2>&1 &
    cuda=$!
    # shellcheck disable=SC2016
    echo "$recipes" | tr ' ' '\n' | xargs -P 6 -I{} bash -c 'smoke_one cpu "$1" "$2"' _ {} "$deadline" \
      > "$WORK/smoke/cpu.log" 2>&1 &
    cpu=$!
  fi
  if want tests; then
    timeout -k 10 $(($1 - 5)) "$PY" -m pytest -m gpu -p no:cacheprovider -rs --durations=15 \
      --continue-on-collection-errors --junitxml="$WORK/pytest-gpu.xml" \
      --deselect tests/test_gpu_methods.py::test_recipe_on_cuda_matches_the_cpu tests > "$WORK/pytest-gpu.txt" 2>&1
    echo "pytest -m gpu: exit $?"
  fi &
  tests=$!
  if want suite; then  # 4 workers (pytest-xdist, on CUDA images) beside 10 smoke processes: 15 of 16 cores
    local workers=(-n 4); "$PY" -c 'import xdist' 2>/dev/null || workers=()
    OMP_NUM_THREADS=1 timeout -k 10 $(($1 - 5)) "$PY" -m pytest -m "not slow and not gpu" "${workers[@]}" -p no:cacheprovider -q \
      --junitxml="$WORK/pytest-suite.xml" tests > "$WORK/pytest-suite.txt" 2>&1
    echo "fast suite: exit $?"
  fi
  wait "$tests"
  [ "$cuda" -eq 0 ] || wait "$cuda" "$cpu"
  echo "smoke: $(grep -c . "$WORK/smoke/results.tsv") runs recorded"
}

compare() {
  GPU_CHECK_RUNS=$RUNS GPU_CHECK_REPORT=$WORK/compare.jsonl "$PY" -m pytest -p no:cacheprovider -rs -q --durations=5 \
    --junitxml="$WORK/pytest-compare.xml" tests/test_gpu_methods.py -k test_recipe_on_cuda_matches_the_cpu -m gpu
}

kernels() {
  LLMX_BENCH_RESULTS=$WORK "$PY" benchmarks/bench_kernels_gpu.py --repeats 10
}

memory() {  # the smoke recipe's Lexico and KIVI stages at a longer context, bf16 as benchmarks/bench_lexico.py
  local sets=() i
  for i in 1 2; do
    sets+=(--set "pipeline.$i.params.context_len=896" --set "pipeline.$i.params.continuation_len=32"
           --set "pipeline.$i.params.windows=1" --set "pipeline.$i.params.generate_tokens=0"
           --set "pipeline.$i.params.recall_tokens=0")
  done
  "$PY" -m llmx --json run configs/smoke/lexico.yaml --device cuda --set dtype=bfloat16 "${sets[@]}" \
    --output-dir "$RUNS/memory" > "$WORK/memory.json"
}

STEPS=${GPU_CHECK_STEPS:-smoke tests suite compare kernels memory}
export STEPS
export -f install_wheels environment want smoke_one smoke_and_tests compare kernels memory
SLOW="quamba2_mamba1 quamba2 pasta funbo upcycle prosec llava zoo_text reper guidedquant sft parrot"
export SLOW
step install 40 install_wheels
step environment 30 environment
if ! grep -q "^environment	0	" "$WORK/steps.tsv"; then
  echo "gpu-check: llmx does not start from this checkout under $PY; stopping" >&2
  { echo "# llmx device check: stopped, llmx does not start under $PY"; echo; cat "$WORK/install.log" \
    "$WORK/environment.log"; } > "$RESULT/summary.md"
  exit 1
fi
{ want smoke || want tests || want suite; } && step smoke 210 smoke_and_tests 200
want compare && step compare 40 compare
want kernels && step kernels 70 kernels
want memory && step memory 45 memory
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


def junit(path):
    cases = []
    if not path.is_file():
        return cases
    for case in ET.parse(path).getroot().iter("testcase"):
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


smoke = {}
for dev, name, rc, secs in tsv(out / "smoke" / "results.tsv"):
    ok = rc == "0"
    smoke.setdefault(name, {})[dev] = {"ok": ok, "rc": rc, "seconds": int(secs),
                                       "error": "" if ok else last_error(out / "smoke" / f"{dev}-{name}.err")}
compare = {}
for case in junit(out / "pytest-compare.xml"):
    name = case["name"].partition("[")[2].rstrip("]")
    compare[name] = case
largest, problems = {}, {}
if (out / "compare.jsonl").is_file():
    for line in (out / "compare.jsonl").read_text().splitlines():
        row = json.loads(line)
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
others = junit(out / "pytest-gpu.xml")
suite = junit(out / "pytest-suite.xml")
suite_counts = {k: sum(c["outcome"] == k for c in suite) for k in ("passed", "failed", "error", "skipped")}
by_file = {}
for c in others:
    f = by_file.setdefault(c["file"], {"passed": 0, "failed": 0, "error": 0, "skipped": 0})
    f[c["outcome"]] += 1
bench = json.loads((out / "kernels_gpu.json").read_text()) if (out / "kernels_gpu.json").is_file() else {}
memory = []
for label, path in (("896 tokens, bf16", out / "memory.json"),):
    try:
        stages = json.loads(path.read_text())["stages"]
    except (OSError, ValueError, KeyError):
        stages = []
    for st in stages:
        m = st.get("metrics", {})
        if "peak_bytes" in m:
            memory.append({"run": label, "method": st["method"], "context": m.get("context_len"),
                           "stored_vs_fp16": m.get("kv_memory_fraction"),
                           "stored_with_dictionaries": m.get("kv_memory_fraction_with_dictionaries"),
                           "peak_vs_fp16": m.get("kv_peak_fraction"),
                           "full_cache_peak_vs_fp16": m.get("kv_peak_fraction_full_cache"),
                           "peak_bytes": m.get("peak_bytes"), "full_cache_peak_bytes": m.get("peak_bytes_full_cache")})
for d in sorted(glob.glob(str(runs / "cuda" / "lexico" / "*" / "metrics.json"))):
    for st in json.loads(Path(d).read_text()).get("stages", []):
        m = st.get("metrics", {})
        if "peak_bytes" in m:
            memory.append({"run": "smoke, 48 tokens, fp32", "method": st["method"], "context": m.get("context_len"),
                           "stored_vs_fp16": m.get("kv_memory_fraction"),
                           "stored_with_dictionaries": m.get("kv_memory_fraction_with_dictionaries"),
                           "peak_vs_fp16": m.get("kv_peak_fraction"),
                           "full_cache_peak_vs_fp16": m.get("kv_peak_fraction_full_cache"),
                           "peak_bytes": m.get("peak_bytes"), "full_cache_peak_bytes": m.get("peak_bytes_full_cache")})
steps = [{"step": a, "rc": int(b), "seconds": int(c), "limit": int(d)} for a, b, c, d in tsv(out / "steps.tsv")]
import torch  # noqa: E402

device = (f"{torch.cuda.get_device_name()} (torch {torch.__version__}, CUDA {torch.version.cuda})"
          if torch.cuda.is_available() else f"no CUDA device (a dry run; torch {torch.__version__})")
judged = ("passed", "skipped") if (out / "pytest-compare.xml").is_file() else ("passed", "skipped", "not run")
failed = ([f"{r['recipe']} (gpu test {r['gpu_test']})" for r in per_recipe if r["gpu_test"] not in judged]
          + [f"{r['recipe']} (cuda smoke)" for r in per_recipe if r["cuda_smoke"] and not r["cuda_smoke"]["ok"]]
          + [f"{c['file']}::{c['name']}" for c in others + suite if c["outcome"] in ("failed", "error")]
          + [f"{r['kernel']} {r['shape']}" for r in bench.get("rows", []) if not r.get("match")]
          + [f"step {s['step']} (exit {s['rc']})" for s in steps if s["rc"]]
          + (["fast suite (no result: see pytest-suite.txt)"] if "suite" in os.environ["STEPS"].split() and not suite else []))
import transformers  # noqa: E402

summary = {"device": device, "transformers": transformers.__version__, "suite": suite_counts,
           "suite_failures": [c for c in suite if c["outcome"] in ("failed", "error")], "steps": steps, "recipes": per_recipe, "other_gpu_tests": by_file,
           "other_gpu_failures": [c for c in others if c["outcome"] in ("failed", "error")],
           "kernels": bench.get("rows", []), "memory": memory, "failed": failed}
(out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")


def cell(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v).replace("|", "/")


def smoke_cell(s):
    if not s:
        return "not run"
    return f"ok {s['seconds']}s" if s["ok"] else f"FAIL ({s['rc']}) {s['error']}"


lines = [f"# llmx device check: {device}", "",
         "steps: " + ", ".join(f"{s['step']} {'ok' if s['rc'] == 0 else 'exit ' + str(s['rc'])} {s['seconds']}s"
                               for s in steps), "",
         f"failed: {', '.join(failed) if failed else 'nothing'}", "",
         f"fast CPU suite under torch {torch.__version__}, transformers {transformers.__version__}: "
         + (", ".join(f"{n} {k}" for k, n in suite_counts.items()) if suite else "not run"), "",
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
lines += ["", f"## Kernels against their PyTorch references ({bench.get('timing', 'not run')})", "",
          "| kernel | used by | shape | kernel ms | reference ms | speedup | fp16 matmul ms | diff | match |",
          "|---|---|---|---|---|---|---|---|---|"]
for r in bench.get("rows", []):
    lines.append("| " + " | ".join(cell(r.get(k)) for k in ("kernel", "used_by", "shape", "kernel_ms", "reference_ms", "speedup",
                                                             "fp16_matmul_ms", "diff"))
                 + f" | {'yes' if r.get('match') else 'NO ' + cell(r.get('error'))} |")
lines += ["", "## KV cache memory on the device (fractions of a full fp16 cache of the same length)", "",
          "| run | method | context | stored | stored + dictionaries | peak | full cache peak | peak bytes "
          "| full cache peak bytes |",
          "|---|---|---|---|---|---|---|---|---|"]
for m in memory:
    lines.append("| " + " | ".join(cell(m[k]) for k in ("run", "method", "context", "stored_vs_fp16",
                                                          "stored_with_dictionaries", "peak_vs_fp16",
                                                          "full_cache_peak_vs_fp16", "peak_bytes",
                                                          "full_cache_peak_bytes")) + " |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines[:6]))
sys.exit(1 if failed else 0)
EOF

cp "$WORK/summary.md" "$WORK/summary.json" "$RESULT/" 2>/dev/null
tar -czf "$RESULT/logs.tar.gz" -C "$WORK" --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' . 2>/dev/null
echo "gpu-check: done in $((SECONDS - T0))s: $RESULT/summary.md (logs.tar.gz beside it; everything in $WORK)"
awk -F'\t' '$2 != 0 {bad = 1} END {exit bad}' "$WORK/steps.tsv"
