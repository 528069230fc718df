"""Packed weights on the CPU through torch's own kernels: int4 (``aten._weight_int4pack_mm_for_cpu``) and int8
per-channel (``aten._weight_int8pack_mm``), both with bf16 activations, and W8A8's integer matmul; which one a layer
runs is decided once per layer from what this CPU runs fast (:func:`capability`, :func:`w8a8_path`).

The int4 kernel reads its own tiled nibble layout and computes ``x @ ((q - 8) * s + z)^T`` per group of 32, 64, 128
or 256 input channels, with bf16 activations and scales and float32 accumulation. A QuantLinear's int4 codes map onto
it exactly: symmetric codes ``c`` are stored as ``q = c + 8`` with ``z = 0``; asymmetric codes with zero point ``u``
give ``z = (8 - u) s``; per-channel and per-tensor scales repeat over the kernel's groups. The cost is bf16 rounding of
the activations and scales (relative 2^-9), which the fast path trades for 2-5x less time than float32 GEMV; set
``LLMX_CPU_KERNELS=0`` for the exact float32 path. The int8 kernel reads QuantLinear's int8 codes as they are, with
the per-channel (or the per-tensor, repeated) scales in bf16. torch's other int4 entry point on the CPU,
``_dyn_quant_matmul_4bit``, quantizes the activations to int8 (not W4A16) and has only a reference kernel on x86
(25 ms for one 4096x4096 token against 0.8 ms here): it is not used.

W8A8 (int8 codes of the activations times int8 weights): ``torch._int_mm`` runs through oneDNN only on a CPU with
AVX-512 VNNI; anywhere else it is a scalar triple loop (0.2x float32 at one token, seconds at 17). Without VNNI the
activation codes, exact in bf16, go through the int8 kernel with unit scales: every product is exact, the sums are
float32 (exact below 2^24), the kernel rounds each sum once to bf16 (relative 2^-9), and the float32 weight and
activation scales multiply after; past :data:`INT8PACK_MAX_ROWS` rows (prefill) the float32 matmul on the weights
dequantized for that call is the faster of the two.

The kernel layout replaces the canonical one in memory (no second copy): :func:`canonical` inverts it. That layout
depends on the CPU (torch tiles rows in blocks of 64 on AVX-512, 32 on AVX2): the block is learnt once per row count
from a probe, and :func:`to_kernel` checks the inversion on every layer it converts, so a CPU or torch with a layout
this module cannot invert runs the exact path (with one warning) instead of computing garbage. :func:`exact` switches
the kernels off for a block of code (calibration, export checks), whatever the environment says.

The kernels exist for CPU tensors only: a tensor on any other device reaching them raises :class:`DeviceMismatch`
naming the layer (never a silent copy to the CPU and back). A layer's plan checks its tensors once when it is made
and the input's device on every call, and calls them with ``layer=None`` (no per-call checks).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from llmx.core.quant.packing import pack, unpack
from llmx.errors import DeviceMismatch

GROUPS = (256, 128, 64, 32)
ENV = "LLMX_CPU_KERNELS"


_HAS_KERNELS = hasattr(torch, "_weight_int4pack_mm_for_cpu") and hasattr(torch, "_weight_int8pack_mm")


_exact_depth = 0
log = logging.getLogger("llmx.quant")

# LLMX_CPU_KERNELS is read on every forward, so the read is a plain dict lookup (~30 ns, against ~600 ns for
# os.environ.get): os.environ's own table, which every write through os.environ (monkeypatch.setenv included) updates.
_ENVIRON = getattr(os.environ, "_data", None)
try:
    _KEY, _OFF = os.environ.encodekey(ENV), os.environ.encodevalue("0")  # type: ignore[attr-defined]
except AttributeError:  # an os.environ without its table: the ordinary read
    _ENVIRON = None


def enabled() -> bool:
    """The fast CPU paths are on: torch has the kernels, no :func:`exact` block is open, ``LLMX_CPU_KERNELS`` is not 0."""
    if not _HAS_KERNELS or _exact_depth:
        return False
    if _ENVIRON is not None:
        return _ENVIRON.get(_KEY) != _OFF
    return os.environ.get(ENV, "1") != "0"


@contextlib.contextmanager
def exact() -> Iterator[None]:
    """Inside this block every QuantLinear computes on the exact float path (results independent of the CPU)."""
    global _exact_depth
    _exact_depth += 1
    try:
        yield
    finally:
        _exact_depth -= 1


# oneDNN's ISA names, lowest first (ONEDNN_MAX_CPU_ISA caps it at one of them); VNNI int8 from avx512_core_vnni up
_ONEDNN_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI", "AVX512_CORE_BF16",
                "AVX10_1_512", "AVX512_CORE_FP16", "AVX10_1_512_AMX", "AVX512_CORE_AMX", "AVX10_1_512_AMX_FP16",
                "AVX512_CORE_AMX_FP16")


@dataclass(frozen=True)
class Capability:
    """What this process's CPU runs fast, read once (the variables below are read by torch at startup too)."""

    torch: str  # torch.backends.cpu.get_cpu_capability(): DEFAULT, AVX2, AVX512 (ATEN_CPU_CAPABILITY lowers it)
    avx512_vnni: bool  # the CPU has AVX-512 VNNI (torch._int_mm's condition for oneDNN)
    onednn_isa: str  # ONEDNN_MAX_CPU_ISA, or "ALL"

    @property
    def avx512(self) -> bool:
        return self.torch.startswith("AVX512")

    @property
    def vnni(self) -> bool:
        """AVX-512 VNNI that this process may use: the CPU has it, torch runs its AVX-512 kernels (an AVX2 CPU has
        none, and ``ATEN_CPU_CAPABILITY=avx2`` stands for one) and oneDNN is not capped below it."""
        isa = self.onednn_isa.upper()
        onednn = isa in ("ALL", "DEFAULT", "") or (isa in _ONEDNN_ISAS and
                                                  _ONEDNN_ISAS.index(isa) >= _ONEDNN_ISAS.index("AVX512_CORE_VNNI"))
        return self.avx512_vnni and self.avx512 and onednn


def _has_avx512_vnni() -> bool:
    probe = getattr(torch.cpu, "_is_vnni_supported", None)  # cpuinfo's avx512_vnni, what torch._int_mm checks
    if probe is not None:
        return bool(probe())
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and "avx512_vnni" in line.split() for line in f)
    except OSError:
        return False


@functools.cache
def capability() -> Capability:
    return Capability(torch.backends.cpu.get_cpu_capability(), _has_avx512_vnni(),
                      os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL"))


# Past this many rows the int8 kernel (whose time grows with the rows: it is built for decode) loses to the float32
# matmul on weights dequantized for the call, which pays a fixed cost (a float32 copy of the weight) and then runs at
# float32 speed. Measured on one thread (4096x4096 and 256x704): under AVX2 the int8 kernel takes 1.3 ms for one row
# of 4096x4096 (float32 2.7 ms), 5.2 at 8 rows (7.4), 48 at 64 (19; dequantize + float32: 99) and 162 at 256 (82);
# at 256x704 it loses from 32 rows on (0.47 ms at 64 against 0.18 dequantized). AVX-512 moves the first crossing up.
INT8PACK_MAX_ROWS = {"AVX512": (32, 192), "AVX2": (16, 128)}  # (weights under 2^22 elements, larger ones)
SMALL_WEIGHT = 1 << 22


def int8pack_max_rows(n: int, k: int, cap: Capability | None = None) -> int:
    """The most rows the int8 kernel takes for an ``n x k`` weight on this CPU before the float32 matmul on the
    dequantized weight is faster."""
    small, large = INT8PACK_MAX_ROWS["AVX512" if (cap or capability()).avx512 else "AVX2"]
    return small if n * k < SMALL_WEIGHT else large


def w8a8_path(n: int, k: int, cap: Capability | None = None) -> tuple[str, int]:
    """W8A8's matmul for an ``n x k`` weight on this CPU, and the most rows it takes: ``("int_mm", 0)`` where
    oneDNN's VNNI int8 GEMM runs (exact int32 sums, any rows), else ``("int8pack", max_rows)``, past which the
    float32 matmul runs on the codes. ``torch._int_mm`` also needs oneDNN switched on
    (``torch.backends.mkldnn.enabled``), which is read when a layer decides."""
    cap = cap or capability()
    if cap.vnni and torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled:
        return "int_mm", 0
    return "int8pack", int8pack_max_rows(n, k, cap)


def require_cpu(layer: str, **tensors: torch.Tensor | None) -> None:
    """Refuse, naming ``layer``, any of ``tensors`` that is not on the CPU: these kernels have no other device."""
    off = [f"{k} on {t.device}" for k, t in tensors.items() if t is not None and t.device.type != "cpu"]
    if off:
        raise DeviceMismatch(f"{layer}: torch's CPU-only packed kernel got {', '.join(off)}",
                             hint="keep a model and its inputs on one device (model.to(device), inputs .to(device))")


def kernel_group(bits: int, group_size: int | None, in_features: int) -> int | None:
    """The largest kernel group that tiles both the format's groups and the row, or None when none does. A format
    group of 128 runs as kernel groups of 128, or of 64 when a ragged last group of 64 ends the row; per-channel and
    per-tensor scales repeat over kernel groups of up to 256."""
    if bits != 4:
        return None
    group = in_features if group_size in (None, 0) else group_size
    return next((g for g in GROUPS if group % g == 0 and in_features % g == 0), None)


def padded_rows(n: int) -> int:
    return -(-n // 16) * 16  # the kernel needs N % 16 == 0


def _from_kernel(packed: torch.Tensor, n_pad: int, k: int, block: int) -> torch.Tensor:
    """Stored values ``[n_pad, k]`` (0..15) from the kernel layout: whole blocks of ``block`` rows first, each
    ``[k, block / 2]`` bytes holding rows ``j`` (low nibble) and ``block / 2 + j`` (high), then the remaining rows as
    ``[k, rest / 2]`` bytes of adjacent row pairs."""
    p = packed.to(torch.int16).reshape(-1)
    full = n_pad // block * block
    b = p[:full * k // 2].reshape(full // block, k, block // 2)
    blocks = torch.cat([b & 15, b >> 4], dim=2).permute(0, 2, 1).reshape(full, k)
    rest = n_pad - full
    b = p[full * k // 2:].reshape(k, rest // 2)
    tail = torch.stack([b & 15, b >> 4], dim=2).reshape(k, rest).T
    return torch.cat([blocks, tail])


@functools.lru_cache(maxsize=256)
def _block_rows(n_pad: int) -> int | None:
    """The row block this CPU's kernel tiles ``n_pad`` rows in, learnt from a random probe (None: a layout other than
    the blocked one :func:`_from_kernel` inverts)."""
    probe = torch.randint(0, 16, (n_pad, 64), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(probe, 1)
    return next((b for b in (64, 32, 16) if torch.equal(_from_kernel(packed, n_pad, 64, b), probe.to(torch.int16))), None)


def to_kernel(qweight: torch.Tensor, n: int, k: int, layer: str = "cpu_kernels.to_kernel") -> torch.Tensor | None:
    """The kernel's packed weight for canonical ``qweight`` (stored values, two per byte), or None (with one warning)
    when this CPU's layout is not one :func:`canonical` inverts."""
    require_cpu(layer, qweight=qweight)
    n_pad = padded_rows(n)
    block = _block_rows(n_pad)
    stored = torch.nn.functional.pad(unpack(qweight, 4, k), (0, 0, 0, n_pad - n))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(stored.to(torch.int32), 1)
    if block is None or not torch.equal(_from_kernel(packed, n_pad, k, block), stored):
        _warn_layout()
        return None
    return packed


@functools.cache
def _warn_layout() -> None:
    log.warning("torch's int4 CPU kernel uses a weight layout llmx cannot invert on this CPU: int4 layers run the "
                "exact (slower) float path")


def canonical(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Inverse of :func:`to_kernel`: the canonical packed bytes ``[n, ceil(k / 8) * 4]``."""
    n_pad = padded_rows(n)
    return pack(_from_kernel(packed, n_pad, k, _block_rows(n_pad))[:n], 4)


def scales_and_zeros(scales: torch.Tensor, zeros: torch.Tensor | None, n: int, k: int, group: int,
                     kernel: int) -> torch.Tensor:
    """``[k / kernel, n_pad, 2]`` bf16 (scale, offset) for kernel groups of ``kernel`` columns, from the layer's
    ``[rows, groups]`` fp16 scales and zeros over format groups of ``group`` columns (``k`` for one per row / tensor)."""
    idx = torch.arange(0, k, kernel, device=scales.device) // group  # the format group of each kernel group
    s = scales.float().expand(n, -1)[:, idx]
    z = torch.zeros_like(s) if zeros is None else (8 - zeros.float().expand(n, -1)[:, idx]) * s
    sz = torch.stack([s, z], dim=-1).transpose(0, 1)
    return torch.nn.functional.pad(sz, (0, 0, 0, padded_rows(n) - n)).to(torch.bfloat16).contiguous()


def int8_ready(bits: int, symmetric: bool, group_size: int | None, act_bits: int) -> bool:
    """W8A16 with one scale per row or tensor: what ``_weight_int8pack_mm`` computes."""
    return bits == 8 and symmetric and group_size in (None, 0) and act_bits == 16


def int8_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                layer: str | None = "cpu_kernels.int8_matmul") -> torch.Tensor:
    """``x [M, K]`` times int8 ``qweight [N, K]`` scaled per row (bf16 ``[N]``, or any ``[1]`` / ``[N]`` float with
    ``layer`` given): bf16 ``[M, N]``. A plan passes bf16 contiguous ``x`` and ``layer=None``: no checks, no casts."""
    if layer is not None:
        require_cpu(layer, x=x, qweight=qweight, scales=scales)
        scales = scales.reshape(-1).to(torch.bfloat16).expand(qweight.shape[0]).contiguous()
        x = x.to(torch.bfloat16).contiguous()
    return torch._weight_int8pack_mm(x, qweight, scales)


def matmul(x: torch.Tensor, packed: torch.Tensor, sz: torch.Tensor, group: int, n: int,
           layer: str | None = "cpu_kernels.matmul") -> torch.Tensor:
    """``x [M, K]`` (any float dtype, or int8 codes) times the packed weight: bf16 ``[M, n]``. A plan passes bf16
    contiguous ``x`` and ``layer=None`` (its tensors were checked when it was made, the input's device is per call)."""
    if layer is not None:
        require_cpu(layer, x=x, packed=packed, scales=sz)
        x = x.to(torch.bfloat16).contiguous()
    out = torch._weight_int4pack_mm_for_cpu(x, packed, group, sz)  # (through torch.ops.aten: 1 us more a call)
    return out if out.shape[1] == n else out[:, :n]
