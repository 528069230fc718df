"""GPTQ's memory and time against depth, on a Llama with real widths (random weights).

Script-only (not a comparison): one method's peak memory and wall time against depth, on random weights.

    python benchmarks/bench_quant_scaling.py [--layers 4 8] [--calib-samples 4]

Hidden 2048, intermediate 8192, 16 heads, 4 KV heads, attention biases, 2048-token vocabulary; GPTQ w4a16 group 128
through ``llmx.quantize`` on a few 256-token windows. Each depth runs in its own process: the model's bytes, the
resident memory after building it, the peak resident memory of the whole run (``ru_maxrss``) and the wall time of
the quantization. Calibration runs each block once on cached block inputs, so the peak should sit about one block's
working set above the model (its activations, its Hessians, GPTQ's copies) whatever the depth, and the time should
grow linearly. Writes benchmarks/results/quant_scaling.json and .md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import publish  # noqa: E402

MIB = 2**20


def child(layers: int, samples: int) -> dict:
    import resource
    import time

    import psutil
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import llmx

    torch.manual_seed(0)
    _, tok = llmx.load("ref:llama-test")
    config = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_attention_heads=16, num_key_value_heads=4,
                         num_hidden_layers=layers, vocab_size=len(tok), attention_bias=True, max_position_embeddings=512)
    model = LlamaForCausalLM(config).eval()
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    block_bytes = sum(p.numel() * p.element_size() for p in model.model.layers[0].parameters())
    rss_built = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    _, metrics = llmx.quantize(model, tokenizer=tok, method="gptq", bits="w4a16", calib_samples=samples,
                               calib_seq_len=256, save=False)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"layers": layers, "model_mib": model_bytes / MIB, "block_mib": block_bytes / MIB,
            "rss_after_build_mib": rss_built / MIB, "peak_rss_mib": peak / MIB,
            "peak_above_build_mib": (peak - rss_built) / MIB, "peak_above_build_blocks": (peak - rss_built) / block_bytes,
            "quantize_s": seconds, "s_per_layer": seconds / layers, "calib_tokens": metrics["calib_tokens"],
            "layers_quantized": metrics["layers"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--calib-samples", type=int, default=4)
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.calib_samples)))
        return
    rows = []
    for layers in args.layers:
        out = subprocess.run([sys.executable, __file__, "--child", str(layers), "--calib-samples", str(args.calib_samples)],
                             capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    publish("quant_scaling", rows)


if __name__ == "__main__":
    main()
