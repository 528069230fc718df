"""Block formats along the reduction axis: MXFP4, NVFP4, INT4 absmax and per-block tables (BlockDialect).

Every element is a sign and a 3-bit index into an 8-magnitude table; every block of ``block`` elements along the last
dim has one scale and, when the format holds several tables, a table id. Scales:

- ``e8m0`` (OCP MX v1.0): ``2^e`` with ``e = floor(log2 amax) - 2`` (2 = floor(log2) of the largest magnitude, E2M1's
  emax), stored as the biased exponent ``e + 127``; the scaled block max lies in [4, 8).
- ``e4m3`` (NVFP4): an FP8 E4M3 block scale ``E4M3(amax_b / (6 s_t))``, clamped to [2^-6, 448] as torchao's,
  times one FP32 tensor scale ``s_t = amax / (448 * 6)`` (torchao's dynamic recipe: the amax of the tensor quantized,
  so an activation's depends on the batch it comes in; llm-compressor calibrates a static one instead).
- ``fp16``: ``amax_b / 7`` in float16 (INT4 absmax; its table is the integers 0..7).

One rounding rule everywhere: nearest magnitude, ties to the even index (for E2M1 that is the IEEE ties-to-even of
``float4_e2m1fn``), values above the table's largest magnitude saturate to it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Literal

import torch

from llmx.core.quant.packing import pack, unpack

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
INT3 = tuple(float(i) for i in range(8))
E4M3_MAX = 448.0
E4M3_MIN = 2.0**-6  # the smallest normal E4M3: the floor torchao's NVFP4 puts under a block scale
SCALE_BITS = {"e8m0": 8, "e4m3": 8, "fp16": 16}
CHUNK = 1 << 15  # blocks per step of quantize (bounds its transients: the table search, the rounding)


@dataclass(frozen=True)
class BlockFormat:
    """``tables``: 8 sorted magnitudes each; ``select``: how a block with several tables picks one (``mse``: lowest
    squared error over all; ``two_stage``: the block max rounded to half-units picks the tables with that max, then
    the lower error among them); ``overflow``: a rounded max above every table's (BlockDialect's (7.75, 8)) keeps the
    exponent and saturates (``clamp``) or takes the next exponent (``bump``); ``tensor_scale`` (E4M3): one FP32
    scale for the whole tensor, or one per row (a token's activations then do not depend on the batch)."""

    name: str
    tables: tuple[tuple[float, ...], ...] = (E2M1,)
    block: int = 32
    scale: Literal["e8m0", "e4m3", "fp16"] = "e8m0"
    select: Literal["mse", "two_stage"] = "mse"
    overflow: Literal["clamp", "bump"] = "clamp"
    tensor_scale: Literal["tensor", "row"] = "tensor"

    def __post_init__(self) -> None:
        if self.block <= 0 or self.block % 8:
            raise ValueError(f"block must be a positive multiple of 8, got {self.block}")
        if not self.tables or any(len(t) != 8 or list(t) != sorted(t) or t[0] != 0 for t in self.tables):
            raise ValueError("every table holds 8 sorted magnitudes starting at 0")
        if self.scale != "e8m0" and (self.select == "two_stage" or self.overflow == "bump"):
            raise ValueError("two_stage selection and overflow bump need power-of-two (e8m0) scales")

    @property
    def id_bits(self) -> int:
        return 0 if len(self.tables) == 1 else math.ceil(math.log2(len(self.tables)))

    @property
    def bits(self) -> float:
        """Stored bits per element: 4 plus the block's scale and table id (the NVFP4 tensor scale is per tensor)."""
        return 4 + (SCALE_BITS[self.scale] + self.id_bits) / self.block

    @property
    def emax(self) -> int:
        return math.floor(math.log2(max(t[-1] for t in self.tables)))

    def with_(self, **changes) -> BlockFormat:
        return replace(self, **changes)

    def spec(self) -> dict:
        """JSON-ready fields (a stored layer's spec); :meth:`from_spec` inverts it."""
        return {**asdict(self), "tables": [list(t) for t in self.tables]}

    @classmethod
    def from_spec(cls, spec: dict) -> BlockFormat:
        return cls(**{**spec, "tables": tuple(tuple(t) for t in spec["tables"])})

    def describe(self) -> str:
        return f"{self.name} b{self.block} ({self.bits:g} bits)"


def mxfp4(block: int = 32) -> BlockFormat:
    return BlockFormat("mxfp4", (E2M1,), block, "e8m0")


def nvfp4(block: int = 16) -> BlockFormat:
    return BlockFormat("nvfp4", (E2M1,), block, "e4m3")


def int4(block: int = 32) -> BlockFormat:
    return BlockFormat("int4", (INT3,), block, "fp16")


@dataclass
class Blocks:
    """A tensor in a block format, unpacked: ``codes`` uint8 ``[..., nb, block]`` (sign << 3 | index), ``table``
    uint8 ``[..., nb]``, ``scale_code`` ``[..., nb]`` (uint8 E8M0 / E4M3 bits, or float16), ``tensor_scale`` (E4M3
    only) and ``length``, the last dim before padding to whole blocks."""

    codes: torch.Tensor
    table: torch.Tensor
    scale_code: torch.Tensor
    tensor_scale: torch.Tensor | None
    length: int


def table_tensor(fmt: BlockFormat, device: torch.device) -> torch.Tensor:
    return torch.tensor(fmt.tables, dtype=torch.float32, device=device)


def nearest(a: torch.Tensor, mags: torch.Tensor) -> torch.Tensor:
    """Index of the nearest magnitude, ties to the even index, saturating: ``a`` ``[N, B]`` non-negative, ``mags``
    ``[N, 8]`` (each row's table) or ``[8]``."""
    mids = (mags[..., 1:] + mags[..., :-1]) / 2
    if mids.dim() == 1:
        mids = mids.expand(a.shape[0], -1)
    lo = torch.searchsorted(mids.contiguous(), a.contiguous(), right=False, out_int32=True)
    hi = torch.searchsorted(mids.contiguous(), a.contiguous(), right=True, out_int32=True)
    return torch.where((lo == hi) | (lo % 2 == 0), lo, hi)


def _error(a: torch.Tensor, mags: torch.Tensor) -> torch.Tensor:
    """Squared error of each block of ``a`` ``[N, B]`` rounded to its own table ``mags`` ``[N, 8]``."""
    q = mags.gather(-1, nearest(a, mags).long())
    return ((a - q) ** 2).sum(-1)


def candidates(fmt: BlockFormat, device: torch.device) -> torch.Tensor:
    """``[17, C]`` table ids per half-unit block max 0..16 (two-stage): the tables whose largest magnitude is the
    smallest one at or above that max (the largest available when none is), padded by repeating the first."""
    maxima = sorted({t[-1] for t in fmt.tables})
    rows = []
    for h in range(17):
        target = next((m for m in maxima if m >= h / 2), maxima[-1])
        rows.append([i for i, t in enumerate(fmt.tables) if t[-1] == target])
    width = max(len(r) for r in rows)
    return torch.tensor([r + [r[0]] * (width - len(r)) for r in rows], dtype=torch.long, device=device)


def select_tables(a: torch.Tensor, fmt: BlockFormat, amax: torch.Tensor) -> torch.Tensor:
    """A table id per block of scaled magnitudes ``a`` ``[N, B]`` (``amax`` ``[N]`` their max): the lowest squared
    error among the candidates (every table for ``mse``; the tables of the rounded max for ``two_stage``, whose errors
    differ only on elements above the magnitudes the pair shares), the first on ties."""
    n = a.shape[0]
    if len(fmt.tables) == 1:
        return torch.zeros(n, dtype=torch.long, device=a.device)
    tables = table_tensor(fmt, a.device)
    if fmt.select == "mse":
        choices = torch.arange(len(fmt.tables), device=a.device).expand(n, -1)
    else:
        choices = candidates(fmt, a.device)[torch.round(2 * amax).clamp(0, 16).long()]  # [N, C]
    err = torch.stack([_error(a, tables[choices[:, c]]) for c in range(choices.shape[1])], dim=1)
    return choices.gather(1, err.argmin(1, keepdim=True)).squeeze(1)


def _scaled(xb: torch.Tensor, fmt: BlockFormat) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Blocks divided by their scale, the stored scale code and the tensor scale."""
    amax = xb.abs().amax(-1)
    if fmt.scale == "e8m0":
        e = torch.frexp(amax).exponent.to(torch.int32) - 1 - fmt.emax
        e = torch.where(amax > 0, e, torch.full_like(e, -127)).clamp(-127, 127)
        if fmt.overflow == "bump":
            top = max(t[-1] for t in fmt.tables)
            over = torch.round(2 * torch.ldexp(amax, -e.float())) / 2 > top
            e = (e + over.int()).clamp(max=127)
        return torch.ldexp(xb, -e.float()[..., None]), (e + 127).to(torch.uint8), None
    if fmt.scale == "e4m3":
        top = amax.amax(-1, keepdim=True) if fmt.tensor_scale == "row" else amax.amax().reshape(1)
        ts = torch.where(top > 0, top / (E4M3_MAX * 6), torch.ones_like(top))
        sb = (amax / (6 * ts)).clamp(E4M3_MIN, E4M3_MAX).to(torch.float8_e4m3fn)
        return xb / (sb.float() * ts)[..., None], sb.view(torch.uint8), ts
    s = (amax / 7).to(torch.float16)
    s = torch.where(s > 0, s, torch.ones_like(s))
    return xb / s.float()[..., None], s, None


def to_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """``x`` as float32 ``[..., nb, block]`` along its last dim, a ragged last block zero-padded (its max unchanged)."""
    pad = -x.shape[-1] % block
    xf = torch.nn.functional.pad(x.float(), (0, pad)) if pad else x.float()
    return xf.reshape(*x.shape[:-1], -1, block)


def quantize(x: torch.Tensor, fmt: BlockFormat) -> Blocks:
    """Block-quantize ``x`` along its last dim (``CHUNK`` blocks at a time: an attention matrix is large)."""
    xb = to_blocks(x, fmt.block)
    v, scale_code, ts = _scaled(xb, fmt)
    lead = v.shape[:-1]
    flat = v.reshape(-1, fmt.block)
    codes = torch.empty(flat.shape, dtype=torch.uint8, device=x.device)
    tid = torch.empty(flat.shape[0], dtype=torch.uint8, device=x.device)
    tables = table_tensor(fmt, x.device)
    for s in range(0, flat.shape[0], CHUNK):
        part = flat[s:s + CHUNK]
        a = part.abs()
        t = select_tables(a, fmt, a.amax(-1))
        idx = nearest(a, tables[t]).to(torch.uint8)
        codes[s:s + CHUNK] = (((part < 0) & (idx > 0)).to(torch.uint8) << 3) | idx
        tid[s:s + CHUNK] = t.to(torch.uint8)
    return Blocks(codes.reshape(*lead, fmt.block), tid.reshape(lead), scale_code, ts, x.shape[-1])


def block_scale(b: Blocks, fmt: BlockFormat) -> torch.Tensor:
    """The float32 multiplier of each block ``[..., nb]``."""
    if fmt.scale == "e8m0":
        return torch.ldexp(torch.ones_like(b.scale_code, dtype=torch.float32), b.scale_code.float() - 127)
    if fmt.scale == "e4m3":
        return b.scale_code.view(torch.float8_e4m3fn).float() * b.tensor_scale
    return b.scale_code.float()


def dequantize(b: Blocks, fmt: BlockFormat, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    mags = table_tensor(fmt, b.codes.device)[b.table.long()]  # [..., nb, 8]
    idx = (b.codes & 7).long()
    val = mags.gather(-1, idx) * torch.where(b.codes >= 8, -1.0, 1.0)
    out = (val * block_scale(b, fmt)[..., None]).reshape(*b.codes.shape[:-2], -1)
    return out[..., :b.length].to(dtype)


def fake_quantize(x: torch.Tensor, fmt: BlockFormat, dim: int = -1) -> torch.Tensor:
    """Quantize-dequantize along ``dim`` (the reduction axis of the matmul ``x`` enters), in ``x``'s dtype."""
    if dim not in (-1, x.dim() - 1):
        return fake_quantize(x.transpose(dim, -1), fmt).transpose(dim, -1)
    return dequantize(quantize(x, fmt), fmt, x.dtype)


def half_units(b: Blocks, fmt: BlockFormat) -> torch.Tensor:
    """Each element as a signed integer count of half-units (``value = k * 0.5 * scale``); exact for tables on the
    0.5 grid (MXFP4, BlockDialect), the integer operand of the MAC."""
    mags = table_tensor(fmt, b.codes.device)[b.table.long()]
    k = (2 * mags.gather(-1, (b.codes & 7).long())).to(torch.int32)
    return torch.where(b.codes >= 8, -k, k)


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes ``[rows, n]`` two per byte, low nibble first."""
    return pack(codes, 4)


def unpack_codes(packed: torch.Tensor, n: int) -> torch.Tensor:
    return unpack(packed, 4, n).to(torch.uint8)
