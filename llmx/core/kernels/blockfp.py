"""Integer-MAC block-format ops (BlockDialect's efficiency case, arXiv 2501.01144 Sec. 3.3): a fused block quantizer
and a GEMM over packed operands, each a CuPy kernel for CUDA tensors with its PyTorch reference.

Both take formats on the half-unit grid with E8M0 scales and blocks of 32 (MXFP4 and BlockDialect): every element
is ``k * 0.5 * 2^e`` with an integer ``|k| <= 15``, so a block pair's dot product is an int32 sum times
``2^(e_a + e_b - 2)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch

from llmx.core import kernels
from llmx.core.quant import blockfp
from llmx.core.quant.blockfp import BlockFormat, Blocks

CUDA = Path(__file__).parent / "cuda"
BLOCK = 32


def integer_ready(fmt: BlockFormat | None) -> bool:
    return (fmt is not None and fmt.scale == "e8m0" and fmt.block == BLOCK and len(fmt.tables) <= 16
            and all(float(2 * m).is_integer() and m <= 7.5 for t in fmt.tables for m in t))


def integer_path(x: torch.Tensor, weight_format: BlockFormat, act_format: BlockFormat | None) -> bool:
    """True when a layer's call can run the integer kernels: CUDA input, no gradient, both formats integer-ready."""
    return (kernels.use_kernel(x) and not (x.requires_grad and torch.is_grad_enabled())
            and integer_ready(weight_format) and integer_ready(act_format))


def _half_tables(fmt: BlockFormat, device: torch.device) -> torch.Tensor:
    return (2 * blockfp.table_tensor(fmt, device)).to(torch.int32).reshape(-1).contiguous()


class Packed(NamedTuple):
    """A 2-D operand as the kernels take it: ``codes`` uint8 ``[rows, nb * 16]`` (two per byte, low nibble first),
    ``exps`` uint8 ``[rows, nb]`` (E8M0), ``tids`` uint8 ``[rows, nb]`` (one table id per byte)."""

    codes: torch.Tensor
    exps: torch.Tensor
    tids: torch.Tensor


def packed(b: Blocks) -> Packed:
    rows = b.codes.shape[0]
    return Packed(blockfp.pack_codes(b.codes.reshape(rows, -1)), b.scale_code, b.table)


def quantize_reference(x: torch.Tensor, fmt: BlockFormat) -> Packed:
    return packed(blockfp.quantize(x, fmt))


def quantize(x: torch.Tensor, fmt: BlockFormat) -> Packed:
    """Block-quantize a 2-D float tensor along its last dim (the kernel needs ``integer_ready(fmt)``)."""
    if not (kernels.use_kernel(x) and integer_ready(fmt)):
        return quantize_reference(x, fmt)
    import cupy

    xb = blockfp.to_blocks(x, BLOCK).contiguous()
    rows, nb = xb.shape[:2]
    n_blocks = rows * nb
    codes = torch.empty(rows, nb * BLOCK // 2, dtype=torch.uint8, device=x.device)
    exps = torch.empty(rows, nb, dtype=torch.uint8, device=x.device)
    tids = torch.empty(rows, nb, dtype=torch.uint8, device=x.device)
    if fmt.select == "mse" or len(fmt.tables) == 1:
        cand = torch.arange(len(fmt.tables), device=x.device).expand(17, -1)
    else:
        cand = blockfp.candidates(fmt, x.device)
    cand = cand.to(torch.int32).contiguous()
    top = int(2 * max(t[-1] for t in fmt.tables))
    args = (cupy.asarray(xb), cupy.asarray(codes), cupy.asarray(exps), cupy.asarray(tids),
            cupy.asarray(_half_tables(fmt, x.device)), cupy.asarray(cand), cupy.int32(cand.shape[1]),
            cupy.int32(fmt.emax), cupy.int32(fmt.overflow == "bump"), cupy.int32(top), cupy.int64(n_blocks))
    threads = 256
    kernels.launch(CUDA / "blockfp_quant.cu", "blockfp_quantize", (-(-n_blocks * 32 // threads),), (threads,), args, x)
    return Packed(codes, exps, tids)


def _half_units(p: Packed, fmt: BlockFormat) -> torch.Tensor:
    rows, nb = p.exps.shape
    codes = blockfp.unpack_codes(p.codes, nb * BLOCK).reshape(rows, nb, BLOCK)
    return blockfp.half_units(Blocks(codes, p.tids, p.exps, None, nb * BLOCK), fmt)


def gemm_reference(a: Packed, a_fmt: BlockFormat, b: Packed, b_fmt: BlockFormat) -> torch.Tensor:
    """``A @ B^T`` from half-unit integers: an exact int32 sum per block pair (``|dot| <= 32 * 225``, exact in
    float64), times ``2^(e_a + e_b - 2)``, summed over blocks in float32 in block order."""
    ka, kb = _half_units(a, a_fmt), _half_units(b, b_fmt)  # [M, nb, 32], [N, nb, 32]
    ea, eb = a.exps.int() - 127, b.exps.int() - 127
    out = torch.zeros(ka.shape[0], kb.shape[0], dtype=torch.float32, device=ka.device)
    for blk in range(ka.shape[1]):
        dot = (ka[:, blk].double() @ kb[:, blk].double().T).to(torch.int32)
        out += torch.ldexp(dot.float(), (ea[:, blk, None] + eb[None, :, blk] - 2).float())
    return out


def gemm(a: Packed, a_fmt: BlockFormat, b: Packed, b_fmt: BlockFormat) -> torch.Tensor:
    """Same contract as the reference."""
    if not (kernels.use_kernel(a.codes, b.codes) and integer_ready(a_fmt) and integer_ready(b_fmt)):
        return gemm_reference(a, a_fmt, b, b_fmt)
    import cupy

    m, nb = a.exps.shape
    n = b.exps.shape[0]
    out = torch.empty(m, n, dtype=torch.float32, device=a.codes.device)
    args = (*(cupy.asarray(t.contiguous()) for t in a), cupy.asarray(_half_tables(a_fmt, a.codes.device)),
            *(cupy.asarray(t.contiguous()) for t in b), cupy.asarray(_half_tables(b_fmt, b.codes.device)),
            cupy.asarray(out), cupy.int32(m), cupy.int32(n), cupy.int32(nb))
    kernels.launch(CUDA / "blockfp_gemm.cu", "blockfp_gemm", (-(-n // 16), -(-m // 16)), (16, 16), args, a.codes)
    return out


def linear(x: torch.Tensor, weight: Packed, weight_format: BlockFormat, act_format: BlockFormat) -> torch.Tensor:
    """``x [M, K] @ W^T`` with ``x`` block-quantized on the fly, in float32 (no bias)."""
    return gemm(quantize(x, act_format), act_format, weight, weight_format)
