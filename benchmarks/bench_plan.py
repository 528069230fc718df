"""The memory plan (``llmx plan``, ``llmx.core.train.plan``) against the measured peak of the same training stages
run for real on the CPU.

    python benchmarks/bench_plan.py [--shapes 256x4:4x256 512x4:1x64] [--steps 2]

For each shape (``HIDDENxLAYERS:BATCHxLENGTH``; the default: one where activations dominate, one where weights and
optimizer state do), a Llama (random weights, the byte tokenizer) is saved to a temporary folder; each arm runs one
stage (sft or dpo, full, LoRA, gradient checkpointing, bf16-mixed, a precomputed reference) on synthetic rows long
enough to fill ``--length`` tokens, through ``llmx.core.pipeline`` in-process with the run's model loading inside a
``PeakMemory`` section (the CPU profiler's allocation log: every byte torch allocates, above what was held before).
The plan is ``plan_run`` of the same resolved run (device cpu: AdamW's per-tensor path). Writes
benchmarks/results/plan_vs_measured.json and .md with the CPU (its model and torch's CPU capability).

Script only: the memory plan against measured peaks, no method judged against a baseline on paired items.
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, cpu_model, publish  # noqa: E402

from llmx.core.memory import PeakMemory  # noqa: E402

ARMS = {  # name: (method, params)
    "sft full fp32": ("sft", {}),
    "sft full, checkpointing": ("sft", {"gradient_checkpointing": True}),
    "sft full bf16-mixed": ("sft", {"precision": "bf16-mixed"}),
    "sft lora r8 (q, v)": ("sft", {"adapter": "lora", "lora": {"r": 8}}),
    "dpo full fp32 (reference copy)": ("dpo", {}),
    "dpo precomputed reference": ("dpo", {"precompute_ref_log_probs": True}),
    "dpo lora r8 (adapter off)": ("dpo", {"adapter": "lora", "lora": {"r": 8}}),
}


def model_folder(folder: Path, hidden: int, layers: int, length: int) -> str:
    from transformers import AutoModelForCausalLM

    from llmx.core import models
    from llmx.core.models.archs import config
    from llmx.core.tokenizer import byte_tokenizer

    tok = byte_tokenizer()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config("llama", len(tok), hidden, layers, max_positions=2 * length,
                                                    heads=hidden // 64))
    models.save(model, tok, folder)
    return str(folder)


def rows(folder: Path, length: int, count: int = 48) -> tuple[str, str]:
    """sft rows and dpo pairs whose prompt and responses are each longer than ``length`` bytes (one byte, one
    token), so every sequence is cut to fill the length exactly."""
    rng = random.Random(0)

    def text() -> str:
        return "".join(rng.choice(string.ascii_lowercase + " ") for _ in range(length))

    sft, dpo = folder / "sft.jsonl", folder / "pairs.jsonl"
    sft.write_text("".join(json.dumps({"prompt": text(), "completion": text()}) + "\n" for _ in range(count)))
    dpo.write_text("".join(json.dumps({"prompt": text(), "chosen": text(), "rejected": text()}) + "\n"
                           for _ in range(count)))
    return str(sft), str(dpo)


def arm(model: str, method: str, params: dict, out: str):
    from llmx.core.config import resolve
    from llmx.core.pipeline import execute
    from llmx.core.plugins import host
    from llmx.core.train.plan import plan_run

    raw = {"model": model, "output_dir": out, "threads": 1, "pipeline": [{"method": method, "params": params}]}
    run = resolve(raw, host().methods)
    ((_, plan),) = plan_run(run, 1)
    with PeakMemory("cpu") as pm, pm.section():
        result = execute(run, show_progress=False)
    return plan, pm.peak_bytes, result.stages[0]["metrics"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["256x4:4x256", "512x4:1x64"])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    args = ap.parse_args()
    torch.set_num_threads(1)
    mib = 1 << 20
    out = []
    for shape in args.shapes:
        model_shape, _, batch_shape = shape.partition(":")
        (hidden, layers), (batch, length) = (map(int, model_shape.split("x")), map(int, batch_shape.split("x")))
        with tempfile.TemporaryDirectory() as tmp:
            model = model_folder(Path(tmp) / "model", hidden, layers, length)
            sft, dpo = rows(Path(tmp), length)
            for name in args.arms:
                method, extra = ARMS[name]
                params = {"data": sft if method == "sft" else dpo, "steps": args.steps, "batch_size": batch,
                          "warmup": 0, "save": False, ("max_length" if method == "sft" else "max_len"): length,
                          **({"max_prompt_length": length // 2} if method == "sft" else {}),
                          **extra}
                plan, peak, metrics = arm(model, method, params, str(Path(tmp) / "runs"))
                parts = {p.name: p.device for p in plan.parts}
                row = {"shape": shape, "arm": name, **{f"{k}_MiB": v / mib for k, v in parts.items()
                                                       if k != "collectives"},
                       "planned_peak_MiB": plan.peak()[0] / mib, "planned_total_MiB": plan.total()[0] / mib,
                       "measured_peak_MiB": peak / mib, "measured_over_planned_peak": peak / plan.peak()[0],
                       "final_loss": metrics.get("final_loss")}
                out.append(row)
                print(json.dumps(row), flush=True)
    cpu = cpu_model()
    capability = torch.backends.cpu.get_cpu_capability()
    publish("plan_vs_measured", out, steps=args.steps, cpu=cpu["cpu_model"], cpu_capability=capability)
    table = RESULTS / "plan_vs_measured.md"
    table.write_text(f"Planned (llmx plan) against measured peak CPU memory of {args.steps} training steps, one "
                     f"thread, on {cpu['cpu_model']} (torch CPU capability {capability}); written by "
                     f"benchmarks/bench_plan.py.\n\n" + table.read_text())


if __name__ == "__main__":
    main()
