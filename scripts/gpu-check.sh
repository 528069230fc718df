#!/usr/bin/env bash
# The device check for a machine with a CUDA GPU: the gpu-marked tests (kernels against their references, every
# training stage on the device), then every smoke recipe with --device cuda. Results under ${OUT:-gpu-check}/.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
BIN=${BIN:-.venv/bin}
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
"$BIN/python" -c "import torch; print(torch.__version__, torch.cuda.is_available(), torch.cuda.get_device_name(0))" \
  | tee "$OUT/torch.txt"
"$BIN/pytest" -q -m gpu -rsP --durations=20 2>&1 | tee "$OUT/pytest-gpu.txt"
status=${PIPESTATUS[0]}
for f in configs/smoke/*.yaml; do
  name=$(basename "$f" .yaml)
  if "$BIN/llmx" --json run "$f" --device cuda --output-dir "$OUT/runs" > "$OUT/smoke-$name.json" 2> "$OUT/smoke-$name.err"; then
    echo "smoke ok:   $f" | tee -a "$OUT/smoke.txt"
  else
    echo "smoke FAIL: $f ($(tail -1 "$OUT/smoke-$name.err"))" | tee -a "$OUT/smoke.txt"; status=1
  fi
done
exit $status
