"""Every CuPy kernel against its PyTorch reference on one CUDA device: the same op on the same inputs with the
kernel dispatch on, then forced off (the reference then runs on the same device), the difference between the two,
and both timed with CUDA events (median of ``--repeats`` after a warm-up); the GEMMs also show fp16 cuBLAS
(``x.half() @ w.half().T``) at their shape as a yardstick.

Script-only (not a comparison): kernel microbenchmarks against their PyTorch references.

    python benchmarks/bench_kernels_gpu.py [--repeats 20] [--quick]

Needs CuPy and a CUDA device: without them it says so in one line and exits 3. ``--device cpu`` runs every case at
``--quick`` shapes with the references on both sides (a dry run of this script, timed with the wall clock). A case
that raises is reported as a row with its error; the exit status is 1 when any case failed or did not match. Writes
benchmarks/results/kernels_gpu.json and .md (``LLMX_BENCH_RESULTS`` moves them).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import publish, write  # noqa: E402


@contextlib.contextmanager
def reference_only() -> Iterator[None]:
    """Every dispatch in llmx takes the PyTorch reference (``kernels.use_kernel`` reads ``available()``)."""
    from llmx.core import kernels

    real = kernels.available
    kernels.available = lambda: False
    try:
        yield
    finally:
        kernels.available = real


def timed_ms(fn: Callable[[], Any], device: str, repeats: int, warmup: int = 3) -> float:
    """Median milliseconds per call: CUDA events on the device, the wall clock on the CPU."""
    for _ in range(warmup):
        fn()
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def float_diff(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest absolute difference over the reference's largest magnitude."""
    return float((got.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30))


def int_diff(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Share of integer codes that differ."""
    return float((got != ref).float().mean())


@dataclass
class Case:
    kernel: str
    shape: str
    build: Callable[[str], tuple[Callable[[], Any], Callable[[Any, Any], float], Callable[[], Any] | None]]
    tol: float  # the largest difference (float_diff or int_diff, as the case measures it) that still matches
    measure: str = "rel. max abs diff"


USED_BY = {"int4_gemm": "rtn, gptq, export (W4A16 QuantLinear)", "w4a8_gemm": "quamba2 (W4A8 QuantLinear)",
           "quantize_rows_int8": "quamba2, w8a8 (dynamic int8 activations)", "lut_gemm": "guidedquant (LNQ LUTLinear)",
           "blockfp_quantize": "mxfp4, blockdialect", "blockfp_gemm": "mxfp4, blockdialect",
           "conv_silu_quant": "quamba2 (Mamba2 conv)", "fope_rotate": "fope", "pasta_segment_attention": "pasta",
           "lexico_omp": "lexico"}


# Each build(device) returns (op, diff(kernel_out, reference_out), fp16 yardstick or None).

def _int4(m: int, k: int, n: int, group: int):
    def build(device):
        from llmx.core.kernels import ops
        from llmx.core.quant.formats import IntFormat, quantize
        from llmx.core.quant.qlinear import QuantLinear

        torch.manual_seed(0)
        lin = torch.nn.Linear(k, n)
        fmt = IntFormat(4, group, True, full_range=True)
        q = QuantLinear.from_codes(lin, *quantize(lin.weight.data, fmt), fmt).to(device)
        x = torch.randn(m, k, device=device)
        xh, wh = x.half(), lin.weight.data.to(device).half()
        return (lambda: ops.int4_gemm(x, q.qweight, q.scales, q.zeros, q.bias, group, q.offset), float_diff,
                lambda: xh @ wh.T)
    return Case("int4_gemm", f"m{m} k{k} n{n} g{group}", build, 1e-4)


def _w4a8(m: int, k: int, n: int, group: int):
    def build(device):
        from llmx.core.kernels import ops
        from llmx.core.quant.formats import IntFormat, quantize
        from llmx.core.quant.qlinear import QuantLinear

        torch.manual_seed(0)
        lin = torch.nn.Linear(k, n)
        fmt = IntFormat(4, group, True)
        q = QuantLinear.from_codes(lin, *quantize(lin.weight.data, fmt), fmt).to(device)
        xq = torch.randint(-128, 128, (m, k), dtype=torch.int8, device=device)
        xs = torch.rand(m, device=device) * 0.05 + 1e-3
        xh, wh = xq.half(), lin.weight.data.to(device).half()
        return (lambda: ops.w4a8_gemm(xq, xs, q.qweight, q.scales, q.bias, group), float_diff, lambda: xh @ wh.T)
    return Case("w4a8_gemm", f"m{m} k{k} n{n} g{group}", build, 1e-4)


def _int8_rows(rows: int, cols: int):
    def build(device):
        from llmx.core.kernels import ops

        torch.manual_seed(0)
        x = torch.randn(rows, cols, device=device) * torch.linspace(0.1, 10, cols, device=device)

        def diff(got, ref):  # codes may differ by one where float division rounds differently; scales must match
            return max(float_diff(got[1], ref[1]), float((got[0].int() - ref[0].int()).abs().max() > 1))
        return lambda: ops.quantize_rows_int8(x), diff, None
    return Case("quantize_rows_int8", f"{rows}x{cols}", build, 1e-6, "scale diff (1 if a code is off by >1)")


def _lut(m: int, k: int, n: int, bits: int):
    def build(device):
        from llmx.core.kernels import lut
        from llmx.core.quant.packing import pack

        g = torch.Generator().manual_seed(0)
        q = pack(torch.randint(0, 2**bits, (n, k), generator=g), bits).to(device)
        cb = torch.randn(n, 2**bits, generator=g).half().to(device)
        x, bias = torch.randn(m, k, device=device), torch.randn(n, device=device)
        xh, wh = x.half(), torch.randn(n, k, device=device, dtype=torch.float16)
        return lambda: lut.lut_gemm(x, q, cb, bias, bits), float_diff, lambda: xh @ wh.T
    return Case("lut_gemm", f"b{bits} m{m} k{k} n{n}", build, 1e-4)


def _formats():
    from llmx.core.quant import blockfp as bf
    from llmx.plugins.blockdialect import formatbook

    bd = bf.BlockFormat("blockdialect", formatbook.load("dialectfp4"), 32, select="two_stage")
    return {"mxfp4": bf.mxfp4(), "blockdialect": bd, "blockdialect_mse": bd.with_(select="mse")}


def _llm_like(rows: int, k: int, device: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, k, generator=g) * torch.exp(torch.randn(k, generator=g))
    return torch.where(torch.rand(x.shape, generator=g) < 0.01, 30 * x, x).to(device)


def _blockfp_quant(rows: int, k: int, name: str):
    def build(device):
        from llmx.core.kernels import blockfp as kops

        fmt = _formats()[name]
        x = _llm_like(rows, k, device)

        def diff(got, ref):  # shared exponents must agree; a near tie between two dialects may pick either table
            return max(int_diff(got.exps, ref.exps), int_diff(got.tids, ref.tids))
        return lambda: kops.quantize(x, fmt), diff, None
    return Case("blockfp_quantize", f"{name} {rows}x{k}", build, 1e-3, "share of exps/table ids differing")


def _blockfp_gemm(m: int, k: int, n: int):
    def build(device):
        from llmx.core.kernels import blockfp as kops

        f = _formats()
        x, w = _llm_like(m, k, device), torch.randn(n, k, device=device) * 0.02
        with reference_only():
            a, b = kops.quantize(x, f["blockdialect"]), kops.quantize(w, f["blockdialect_mse"])
        xh, wh = x.half(), w.half()
        return lambda: kops.gemm(a, f["blockdialect"], b, f["blockdialect_mse"]), float_diff, lambda: xh @ wh.T
    return Case("blockfp_gemm", f"m{m} k{k} n{n}", build, 1e-5)


def _conv_quant(b: int, t: int, c: int, k: int):
    def build(device):
        from llmx.plugins.quamba2 import ops as qops

        torch.manual_seed(0)
        xbc, w = torch.randn(b, t, c, device=device), torch.randn(c, 1, k, device=device) * 0.5
        bias, scale = torch.randn(c, device=device) * 0.1, torch.linspace(0.005, 0.03, c, device=device)

        def diff(got, ref):  # int8 codes: off by one only where the float conv rounds across a half
            return float((got.int() - ref.int()).abs().max() > 1) + int_diff(got, ref) * 1e-3
        return lambda: qops.conv_silu_quant(xbc, w, bias, scale), diff, None
    return Case("conv_silu_quant", f"b{b} t{t} c{c} k{k}", build, 1e-3, "1 if a code is off by >1, + 1e-3 x share off")


def _fope(t: int, hq: int, hkv: int, hd: int):
    def build(device):
        from llmx.plugins.fope import ops as fops
        from llmx.plugins.fope import position

        g = torch.Generator().manual_seed(0)
        freqs = position.kept_frequencies(hd, 1e4, 512).to(device)
        a_s = position.init_coefficients((hkv, len(freqs), hd // 4), 0.4, g).to(device)
        a_c = position.init_coefficients((hkv, len(freqs), hd // 4), 0.4, g).to(device)
        q, k = torch.randn(1, hq, t, hd, generator=g).to(device), torch.randn(1, hkv, t, hd, generator=g).to(device)
        pos = torch.arange(t, device=device)[None]

        def diff(got, ref):
            return max(float_diff(got[0], ref[0]), float_diff(got[1], ref[1]))
        return lambda: fops.fope_rotate(q, k, pos, freqs, a_s, a_c), diff, None
    return Case("fope_rotate", f"t{t} hq{hq} hkv{hkv} d{hd}", build, 1e-4)


def _pasta(t: int, s: int, hq: int, hkv: int, d: int):
    def build(device):
        from llmx.plugins.pasta import attention as A

        g = torch.Generator().manual_seed(0)
        owner = torch.randint(0, 6, (s,), generator=g)
        limit = torch.randint(0, s + 1, (t, 6), generator=g)
        limit[:, 0] = torch.randint(1, s + 1, (t,), generator=g)
        owner[0] = 0
        owner, limit = owner.int().to(device), limit.int().to(device)
        q, k, v = (torch.randn(*shape, generator=g).to(device) for shape in ((hq, t, d), (hkv, s, d), (hkv, s, d)))
        return lambda: A.segment_attention(q, k, v, owner, limit, d ** -0.5), float_diff, None
    return Case("pasta_segment_attention", f"t{t} s{s} hq{hq} hkv{hkv} d{d}", build, 1e-4)


def _omp(vectors: int, dim: int, atoms: int, s: int):
    """Lexico's OMP. ``omp`` runs the kernel only on calls with at least as many vectors as atoms (a smaller call runs
    the reference, and the row would time the reference against itself): such a row raises here, when ``cases`` is
    built (the CPU dry run builds the full-size list too), and on CUDA a row fails unless the kernel launched."""
    from llmx.plugins.lexico import omp as omp_mod

    if not omp_mod.kernel_shape(vectors, atoms, s):
        raise ValueError(f"{vectors} vectors, {atoms} atoms, s={s}: omp takes the reference path, not the kernel")

    def build(device):
        g = torch.Generator().manual_seed(0)
        d = torch.nn.functional.normalize(torch.randn(dim, atoms, generator=g), dim=0).to(device)
        x = torch.randn(vectors, dim, generator=g).to(device)
        launches = []

        def op():
            real = omp_mod._omp_gram
            omp_mod._omp_gram = lambda *args: launches.append(len(args[2])) or real(*args)
            try:
                return omp_mod.omp(d, x, s)
            finally:
                omp_mod._omp_gram = real

        def error(out):
            idx, coef = out
            rec = torch.einsum("mdk,mk->md", d.T[idx].transpose(1, 2), coef)
            return float(((x - rec) ** 2).sum() / (x ** 2).sum())

        def diff(got, ref):  # a near tie may pick another atom: the residual energy must agree, not the indices
            if device == "cuda" and sum(launches) != vectors:  # the kernel's call, once, then the reference's
                raise RuntimeError(f"the kernel ran on {sum(launches)} of {vectors} vectors: not the kernel's call")
            return abs(error(got) - error(ref)) / max(error(ref), 1e-12)
        return op, diff, None
    return Case("lexico_omp", f"{vectors} vec d{dim} N{atoms} s{s}", build, 1e-2,
                "rel. diff of residual energy (kernel launched on every vector)")


def cases(quick: bool) -> list[Case]:
    if quick:
        return [_int4(3, 256, 128, 64), _w4a8(3, 256, 128, 64), _int8_rows(16, 256), _lut(3, 256, 128, 3),
                _blockfp_quant(16, 256, "mxfp4"), _blockfp_quant(16, 256, "blockdialect"), _blockfp_gemm(4, 256, 64),
                _conv_quant(1, 40, 64, 4), _fope(40, 8, 2, 64), _pasta(1, 100, 4, 2, 32), _omp(256, 32, 128, 4)]
    return [_int4(1, 4096, 4096, 128), _int4(64, 4096, 4096, 128), _w4a8(1, 4096, 4096, 128),
            _w4a8(64, 4096, 4096, 128), _int8_rows(2048, 4096), _lut(1, 4096, 4096, 2), _lut(1, 4096, 4096, 3),
            _lut(1, 4096, 11008, 4), _blockfp_quant(2048, 4096, "mxfp4"), _blockfp_quant(2048, 4096, "blockdialect"),
            _blockfp_gemm(1, 4096, 4096), _blockfp_gemm(64, 4096, 4096), _conv_quant(1, 2048, 4352, 4),
            _fope(2048, 32, 8, 128), _pasta(1, 4096, 32, 8, 128), _pasta(16, 4096, 32, 8, 128),
            _omp(4096, 128, 1024, 8), _omp(4096, 128, 4096, 8), _omp(16384, 128, 16384, 8)]  # Gram: 1 GiB


def run_case(case: Case, device: str, repeats: int) -> dict[str, Any]:
    row: dict[str, Any] = {"kernel": case.kernel, "used_by": USED_BY.get(case.kernel), "shape": case.shape,
                           "kernel_ms": None, "reference_ms": None, "speedup": None, "fp16_matmul_ms": None,
                           "diff": None, "tol": case.tol, "measure": case.measure, "match": False, "error": None}
    try:
        op, diff, yardstick = case.build(device)
        with torch.no_grad():
            got = op()
            with reference_only():
                ref = op()
            row["diff"] = diff(got, ref)
            row["match"] = bool(row["diff"] <= case.tol)
            row["kernel_ms"] = timed_ms(op, device, repeats)
            with reference_only():
                row["reference_ms"] = timed_ms(op, device, repeats)
            row["speedup"] = row["reference_ms"] / row["kernel_ms"]
            if yardstick is not None:
                row["fp16_matmul_ms"] = timed_ms(yardstick, device, repeats)
    except Exception as exc:  # noqa: BLE001 - one broken kernel is a row, not the end of the benchmark
        row["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        traceback.print_exc()
    finally:
        if device == "cuda":
            torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="small shapes (seconds)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: a dry run of the script, references on both sides")
    ap.add_argument("--name", default="kernels_gpu", help="result file name (without extension)")
    args = ap.parse_args(argv)
    if args.device == "cuda":
        from llmx.core import kernels

        if not torch.cuda.is_available() or not kernels.available():
            print("bench_kernels_gpu: needs CuPy and a CUDA device (torch sees "
                  f"{torch.cuda.device_count() if torch.cuda.is_available() else 0} GPU(s)); nothing measured",
                  file=sys.stderr)
            return 3
        name = torch.cuda.get_device_name()
    else:
        name, args.quick = "cpu (dry run: references on both sides)", True
        cases(quick=False)  # the full-size cases are well formed (a Lexico row off the kernel's path raises here)
    meta = {"device": name, "repeats": args.repeats, "quick": args.quick,
            "timing": "CUDA events, median of repeats after 3 warm-up calls" if args.device == "cuda" else "wall clock"}
    rows: list[dict[str, Any]] = []
    for case in cases(args.quick):
        rows.append(run_case(case, args.device, args.repeats))
        write(args.name, {"benchmark": args.name, **meta, "partial": True, "rows": rows})  # a timeout keeps these
    publish(args.name, rows, **meta)
    bad = [f"{r['kernel']} {r['shape']}: " + (r["error"] or "diff {:.3g} > {:.3g}".format(r["diff"], r["tol"]))
           for r in rows if not r["match"]]
    print(f"{name}: {len(rows) - len(bad)}/{len(rows)} kernels match their references" + "".join(f"\n  {b}" for b in bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
