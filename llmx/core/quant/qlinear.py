"""QuantLinear: a Linear that really stores packed integer weights, for weight-only and W8A8 inference.

Weights: ``bits``-bit codes packed densely along the input dim (int4: two per byte, low nibble first; int8 stored as
int8), fp16 scales per group / channel / tensor, uint8 zero points when asymmetric. W8A8 (8-bit symmetric
per-channel or per-tensor weights, 8-bit activations) runs through an integer matmul (``torch._int_mm``) with int32
accumulation, W4A8 (4-bit symmetric grouped weights) through ``ops.w4a8_gemm`` (int32 per group, then scaled; a CuPy
kernel on CUDA); other activation widths are simulated (quantize-dequantize) around a float matmul.

On the CPU, int4 layers (W4A16 and W4A8) run through torch's packed-int4 kernel, per-channel W8A16 through its
int8 one (:mod:`llmx.core.quant.cpu_kernels`, bf16 activations), and W8A8 through ``torch._int_mm`` where the CPU has
AVX-512 VNNI, else through the int8 kernel on the activation codes. Which of these a layer runs is its plan, decided
on its first CPU call (``_decide``) and again only when its tensors are assigned, swapped, moved, cast, loaded or
written in place: a CPU call then checks the input's device, the plan's tensors (identity, storage, version counter)
and that the kernels are on, and calls the kernel. On the first call an int4 ``qweight`` is converted in place to the
kernel's layout, and ``codes()``, ``state_dict()``, pickles and any other device read the canonical layout back from
it. An input on another device than the layer's weights (a CUDA tensor reaching the CPU kernels, or the reverse)
raises :class:`~llmx.errors.DeviceMismatch` naming the layer; nothing is copied between devices here.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from llmx.core import kernels
from llmx.core.kernels import ops
from llmx.core.quant import cpu_kernels
from llmx.core.quant.formats import IntFormat, dequantize
from llmx.core.quant.packing import pack, unpack
from llmx.errors import DeviceMismatch


def quantize_activation(x: torch.Tensor, bits: int, static_scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric integer activations: per token (dynamic) or one calibrated scale (static). Returns (codes, scale)."""
    qmax = 2 ** (bits - 1) - 1
    if static_scale is None:
        scale = (x.abs().amax(dim=-1, keepdim=True) / qmax).clamp(min=1e-8)
    else:
        scale = static_scale.to(x.dtype)
    return torch.clamp(torch.round(x / scale), -qmax - 1, qmax), scale


def _version(t: torch.Tensor) -> int | None:
    """In-place writes counted on ``t`` (None for an inference-mode tensor, which counts none)."""
    return None if t.is_inference() else t._version


_BF16 = torch.bfloat16
_PLANNED = frozenset({"qweight", "scales", "zeros", "act_scale", "bias"})  # what a CPU plan is built from


def _finish(out: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor, n: int) -> torch.Tensor:
    """The kernel's ``[M, n]`` output plus the bias (added in float32 at least), in ``x``'s dtype and shape.
    (``.float()`` and ``.bfloat16()`` where they apply: a third of ``.to(dtype)``'s time on a decode step.)"""
    if bias is not None:
        out = out + bias if bias.dtype == torch.float32 else out.float() + bias
    dtype = x.dtype
    if out.dtype != dtype:
        out = out.float() if dtype == torch.float32 else out.to(dtype)
    d = x.dim()
    if d == 2:
        return out
    if d == 3:
        b, t, _ = x.shape
        return out.view(b, t, n)
    return out.view(*x.shape[:-1], n)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class _Plan:
    """One layer's CPU path with everything it needs, made by :meth:`QuantLinear._decide`. It stays current while
    the tensors it was made from are still the layer's (the same objects over the same storage: ``functional_call``,
    offload hooks and ``.data =`` swap them without ``setattr``) and see no in-place write (their version counters;
    an inference-mode tensor counts none, as before plans), and the kernels stay on; anything else that changes them
    drops the plan."""

    __slots__ = ("src", "watch", "stamp", "k", "n", "bias")

    def __init__(self, layer: QuantLinear | None = None, *names: str):
        self.src: tuple = ()
        if layer is not None:
            self.k, self.n, self.bias = layer.in_features, layer.out_features, layer.bias
            stores = [(layer._buffers, name) for name in names] + [(layer._parameters, "bias")]
            self.src = tuple((store, name, store.get(name), _ptr(store.get(name))) for store, name in stores)
        self.watch = tuple(t for _, _, t, _ in self.src if t is not None and not t.is_inference())
        self.stamp = sum(t._version for t in self.watch)

    def fresh(self) -> bool:  # on every CPU call: plain loops, no generator, no helper calls (~0.1 us a tensor)
        for store, name, t, ptr in self.src:
            if store.get(name) is not t or (ptr is not None and t.data_ptr() != ptr):
                return False
        v = 0
        for t in self.watch:
            v += t._version
        return v == self.stamp

    def run(self, layer: QuantLinear, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class _Exact(_Plan):
    """No CPU kernel for this format (or this CPU's int4 layout): the exact path, decided once."""

    __slots__ = ()

    def run(self, layer: QuantLinear, x: torch.Tensor) -> torch.Tensor:
        return layer._exact_forward(x)


class _W4A16(_Plan):
    """bf16 activations into torch's int4 kernel (its layout and bf16 scales built by ``_plan_int4``)."""

    __slots__ = ("packed", "sz", "group")

    def __init__(self, layer: QuantLinear):
        b = layer._buffers
        super().__init__(layer, "qweight", "scales", "zeros")
        self.packed, self.sz, self.group = b["qweight"], b["_kernel_sz"], layer._kernel_group

    def run(self, layer: QuantLinear, x: torch.Tensor) -> torch.Tensor:
        out = cpu_kernels.matmul(x.reshape(-1, self.k).bfloat16().contiguous(), self.packed, self.sz, self.group,
                                 self.n, None)
        if self.bias is None and x.dtype == torch.float32 and x.dim() == 3:  # a decode step, without _finish's call
            b, t, _ = x.shape
            return out.float().view(b, t, self.n)
        return _finish(out, self.bias, x, self.n)


class _W4A8(_W4A16):
    """The int8 codes of the activations (exact in bf16) into the int4 kernel, times their scale, as the integer
    kernel would."""

    __slots__ = ("bits", "act_scale")

    def __init__(self, layer: QuantLinear):
        super().__init__(layer)
        self.bits, self.act_scale = layer.act_bits, layer._buffers["act_scale"]
        self.src += ((layer._buffers, "act_scale", self.act_scale, _ptr(self.act_scale)),)

    def run(self, layer: QuantLinear, x: torch.Tensor) -> torch.Tensor:
        codes, scale = quantize_activation(x.reshape(-1, self.k).float(), self.bits, self.act_scale)
        out = cpu_kernels.matmul(codes.bfloat16().contiguous(), self.packed, self.sz, self.group, self.n, None)
        return _finish(out.float() * scale, self.bias, x, self.n)


class _Int8Pack(_Plan):
    """W8A16 per channel: bf16 activations into torch's int8 kernel with bf16 scales; past ``max_rows`` rows the
    float32 matmul on the weight dequantized for the call (what the exact path computes)."""

    __slots__ = ("w8", "s", "s_col", "max_rows")

    def __init__(self, layer: QuantLinear):
        b = layer._buffers
        super().__init__(layer, "qweight", "scales")
        self.w8 = b["qweight"]
        self.s = b["scales"].reshape(-1).to(_BF16).expand(self.n).contiguous()
        self.s_col = b["scales"].float().reshape(-1, 1)
        self.max_rows = cpu_kernels.int8pack_max_rows(self.n, self.k)

    def run(self, layer: QuantLinear, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.k)
        if x2.shape[0] <= self.max_rows:
            out = cpu_kernels.int8_matmul(x2.bfloat16().contiguous(), self.w8, self.s, None)
        else:
            out = F.linear(x2.float(), self.w8.float().mul_(self.s_col))
        return _finish(out, self.bias, x, self.n)


class _W8A8(_Plan):
    """W8A8 with the exact path's activation codes and scales (per token, or the static scale). ``int_mm``
    (AVX-512 VNNI: oneDNN's int8 GEMM) computes what the exact path computes, bit for bit. ``int8pack`` (no VNNI,
    where ``torch._int_mm`` is a scalar loop): the codes, exact in bf16, through the int8 kernel with unit scales
    (exact products, float32 sums, one rounding of each sum to bf16), times the float32 weight and activation scales;
    past ``max_rows`` rows the float32 matmul on the codes and the weight's codes (sums exact below 2^24)."""

    __slots__ = ("path", "max_rows", "w8", "wt", "sw", "ones", "act_scale", "qmax", "eps")

    def __init__(self, layer: QuantLinear):
        b = layer._buffers
        super().__init__(layer, "qweight", "scales", "act_scale")
        self.path, self.max_rows = cpu_kernels.w8a8_path(self.n, self.k)
        self.w8 = b["qweight"]
        self.wt = self.w8.t()
        self.sw = b["scales"].float().reshape(1, -1)
        self.ones = self.w8.new_ones(self.n, dtype=_BF16)
        self.act_scale = b["act_scale"]
        # float32 constants as tensors: the same division and clamp as with Python numbers, without wrapping one
        # into a tensor on every call (1 us each at decode)
        self.qmax, self.eps = self.sw.new_tensor(127.0), self.sw.new_tensor(1e-8)

    def run(self, layer: QuantLinear, x: torch.Tensor) -> torch.Tensor:
        xf = x.reshape(-1, self.k).float()
        if self.act_scale is None:  # ops.quantize_rows_int8's codes: |x / scale| <= 127 already, so no clamp
            sx = xf.abs().amax(dim=-1, keepdim=True).div_(self.qmax).clamp_(min=self.eps)
            xq = torch.div(xf, sx).round_()
        else:
            xq, sx = quantize_activation(xf, 8, self.act_scale)
        if self.path == "int_mm":  # int32 times float32: each sum converted, then scaled, as the exact path does
            out = (torch._int_mm(xq.char(), self.wt) * sx).mul_(self.sw)
        elif xq.shape[0] <= self.max_rows:
            out = (cpu_kernels.int8_matmul(xq.bfloat16(), self.w8, self.ones, None) * self.sw).mul_(sx)
        else:
            out = (F.linear(xq, self.w8.float()) * sx).mul_(self.sw)
        if self.bias is None and x.dtype == torch.float32 and x.dim() == 3:  # a decode step, without _finish's call
            b, t, _ = x.shape
            return out.view(b, t, self.n)
        return _finish(out, self.bias, x, self.n)


class QuantLinear(torch.nn.Module):
    LAYER = "quant_linear"  # the stored layer type (a subclass registers its own)
    llmx_name: str | None = None  # its dotted name in the model (set by replace_module): errors name the layer

    def __init__(self, in_features: int, out_features: int, bias: bool, fmt: IntFormat, act_bits: int = 16,
                 static_act: bool = False, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        super().__init__()
        w8 = fmt.bits == 8 and fmt.group_size in (None, 0)
        if act_bits == 8 and not (fmt.symmetric and (w8 or (fmt.bits == 4 and fmt.group_size != 0))):
            raise ValueError("A8 needs symmetric weights: 8-bit per channel or per tensor, or 4-bit per channel or per group")
        self.in_features, self.out_features, self.fmt, self.act_bits = in_features, out_features, fmt, act_bits
        groups = 1 if fmt.group_size == 0 else 1 if fmt.group_size is None else -(-in_features // fmt.group_size)
        rows = 1 if fmt.group_size == 0 else out_features
        if fmt.bits == 8 and fmt.symmetric:
            self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
        else:
            self.register_buffer("qweight", torch.zeros(out_features, -(-in_features // 8) * fmt.bits, dtype=torch.uint8,
                                                        device=device))
        self.register_buffer("scales", torch.ones(rows, groups, dtype=torch.float16, device=device))
        self.register_buffer("zeros", torch.zeros(rows, groups, dtype=torch.uint8, device=device)
                             if not fmt.symmetric else None)
        self.register_buffer("act_scale", torch.ones((), dtype=torch.float32, device=device) if static_act else None)
        self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device)) if bias else None
        self._kernel_group = cpu_kernels.kernel_group(fmt.bits, fmt.group_size, in_features)
        self._kernel_layout = False  # qweight holds the CPU kernel's layout (and _kernel_sz its scales)
        self._kernel_version = self._kernel_key = None
        self._int8_kernel = cpu_kernels.int8_ready(fmt.bits, fmt.symmetric, fmt.group_size, act_bits)
        self._plan: _Plan | None = None  # the CPU path, decided by _decide

    @property
    def float_numel(self) -> int:
        """Parameters of the float layer this one replaces."""
        return self.in_features * self.out_features + (self.out_features if self.bias is not None else 0)

    @property
    def offset(self) -> int:
        return 2 ** (self.fmt.bits - 1) if self.fmt.symmetric else 0

    @classmethod
    def from_codes(cls, linear: torch.nn.Linear, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                   fmt: IntFormat, act_bits: int = 16, act_scale: float | None = None) -> QuantLinear:
        """Build from integer codes (shape of the weight) and grouped ``[rows, groups, 1]`` scales / zeros."""
        with torch.device(linear.weight.device):  # built where the linear lives (a subclass's own buffers too)
            q = cls(linear.in_features, linear.out_features, linear.bias is not None, fmt, act_bits,
                    static_act=act_scale is not None, dtype=linear.weight.dtype)
        if fmt.bits == 8 and fmt.symmetric:
            q.qweight.copy_(codes.to(torch.int8))
        else:
            q.qweight.copy_(pack(codes, fmt.bits, q.offset))
        q.scales.copy_(scale.reshape(q.scales.shape).to(torch.float16))
        if q.zeros is not None:
            q.zeros.copy_(zero.reshape(q.zeros.shape).to(torch.uint8))
        if act_scale is not None:
            q.act_scale.fill_(act_scale)
        if linear.bias is not None:
            q.bias.data.copy_(linear.bias.data)
        return q.to(linear.weight.device)

    def describe(self) -> str:
        """The layer as errors name it: its dotted name in the model, else its type and shape."""
        return f"layer {self.llmx_name}" if self.llmx_name else f"{type(self).__name__}({self.extra_repr()})"

    def canonical_qweight(self) -> torch.Tensor:
        self._check_layout()
        if self._kernel_layout:
            return cpu_kernels.canonical(self.qweight, self.out_features, self.in_features)
        return self.qweight

    def codes(self) -> torch.Tensor:
        if self.qweight.dtype == torch.int8:
            return self.qweight.to(torch.int16)
        return unpack(self.canonical_qweight(), self.fmt.bits, self.in_features, self.offset)

    def _check_layout(self) -> None:
        """A ``qweight`` written in place since the conversion holds what was written: the canonical layout."""
        if self._kernel_layout and _version(self._buffers["qweight"]) != self._kernel_version:
            self._kernel_layout = False
            del self._kernel_sz

    def _scale_key(self) -> tuple:
        """What the kernel's scales were built from: rebuilt when the scales or zeros change (in place or by a cast)."""
        s, z = self._buffers["scales"], self._buffers["zeros"]
        return s.data_ptr(), _version(s), s.dtype, None if z is None else (z.data_ptr(), _version(z))

    # The CPU plan: which kernel this layer runs and everything it needs, decided by _decide on the first CPU forward
    # and again only when the layer's tensors change: assigned or registered (__setattr__, register_buffer), moved or
    # cast (_apply), loaded (_load_from_state_dict), swapped without setattr or written in place (_Plan.fresh, per
    # call: identity, storage and version counters).
    def __setattr__(self, name: str, value: Any) -> None:
        if name in _PLANNED:
            self.__dict__["_plan"] = None
        super().__setattr__(name, value)

    def register_buffer(self, name: str, tensor: torch.Tensor | None, persistent: bool = True) -> None:
        if name in _PLANNED:
            self.__dict__["_plan"] = None
        super().register_buffer(name, tensor, persistent)

    def _apply(self, fn, recurse: bool = True):  # .to(), .half(), .cuda(), ...: decided again where it lands
        self.__dict__["_plan"] = None
        return super()._apply(fn, recurse)

    def _decide(self) -> _Plan:
        """This layer's CPU path, from its format, its tensors and this CPU's capability: the int4 kernel (W4A16,
        W4A8), the int8 kernel (W8A16), W8A8's integer matmul (``torch._int_mm`` with AVX-512 VNNI, the int8 kernel on
        the activation codes without it), or the exact path. Its tensors are checked to be on the CPU here, once."""
        self.__dict__["_plan"] = None
        cpu_kernels.require_cpu(self.describe(), **{k: v for k, v in self._buffers.items() if not k.startswith("_")},
                                bias=self.bias)
        plan: _Plan | None = None
        if self._kernel_group is not None:
            plan = self._plan_int4()
        elif self._int8_kernel:
            plan = _Int8Pack(self)
        elif self.act_bits == 8 and self.fmt.bits == 8:  # symmetric, per channel or per tensor (checked at init)
            plan = _W8A8(self)
        plan = plan or _Exact()
        self.__dict__["_plan"] = plan
        return plan

    def _plan_int4(self) -> _Plan | None:
        if not self._kernel_layout:
            packed = cpu_kernels.to_kernel(self.qweight, self.out_features, self.in_features, self.describe())
            if packed is None:  # a CPU whose kernel layout this module cannot invert: the exact path, always
                self._kernel_group = None
                return None
            self.qweight = packed
            self._kernel_version = _version(packed)
            self._kernel_layout = True
        sz = self._buffers.get("_kernel_sz")
        if self._kernel_key != self._scale_key() or sz is None or sz.dtype != torch.bfloat16 or not sz.is_cpu:
            group = self.fmt.group_size or self.in_features
            sz = cpu_kernels.scales_and_zeros(self.scales, self.zeros, self.out_features, self.in_features, group,
                                              self._kernel_group)
            self.register_buffer("_kernel_sz", sz, persistent=False)
            self._kernel_key = self._scale_key()
        return _W4A16(self) if self.act_bits == 16 else _W4A8(self)

    def _leave_kernel_layout(self) -> None:
        self.qweight = self.canonical_qweight()
        if "_kernel_sz" in self._buffers:
            del self._kernel_sz
        self._kernel_layout = False

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self._kernel_layout:
            destination[prefix + "qweight"] = self.canonical_qweight()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        self.__dict__["_plan"] = None
        if self._kernel_layout:
            self._leave_kernel_layout()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        """Pickles and deep copies hold the canonical layout: the kernel's depends on the CPU that built it; the plan
        is made again where they run."""
        state = self.__dict__.copy()
        state["_plan"] = None
        if self._kernel_layout:
            buffers = dict(self._buffers)
            buffers["qweight"] = self.canonical_qweight()
            buffers.pop("_kernel_sz", None)
            state.update(_buffers=buffers, _kernel_layout=False, _kernel_key=None)
        return state

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        zero = self.zeros.float()[..., None] if self.zeros is not None else torch.zeros(1, device=self.scales.device)
        w = dequantize(self.codes(), self.scales.float()[..., None], zero, self.fmt.group_size)
        return w.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A CPU decode step is microseconds: with a plan made, the checks are an input on the CPU, the tensors
        # unchanged since the plan, the kernels on, no gradient wanted; everything else was decided by _decide.
        plan = self._plan
        if plan is not None and x.is_cpu and not (x.requires_grad and torch.is_grad_enabled()) and cpu_kernels.enabled():
            if plan.fresh():
                return plan.run(self, x)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device != self._buffers["qweight"].device:  # before any path: the CPU kernels' layout switch included
            raise DeviceMismatch(f"{self.describe()}: input on {x.device}, weights on {self._buffers['qweight'].device}",
                                 hint="keep a model and its inputs on one device (model.to(device), inputs .to(device))")
        self._check_layout()
        if x.device.type == "cpu" and cpu_kernels.enabled() and not (x.requires_grad and torch.is_grad_enabled()):
            plan = self._plan
            if plan is None or not plan.fresh():
                plan = self._decide()
            return plan.run(self, x)
        if self._kernel_layout:  # every path but the kernel's reads the canonical layout (and leaves it there)
            self._leave_kernel_layout()
        return self._exact_forward(x)

    def _exact_forward(self, x: torch.Tensor) -> torch.Tensor:
        """What the layer computes on any device without the CPU kernels: W8A8's exact int32 matmul, CUDA kernels,
        else the float matmul on the dequantized weight. Inputs that need a gradient land here (the CPU kernels have
        no derivative)."""
        if self.act_bits == 8:
            return self._int8_forward(x)
        if self.fmt.bits == 4 and self.act_bits == 16 and self.fmt.group_size != 0 and kernels.use_kernel(x):
            return self._int4_kernel_forward(x)
        if self.act_bits < 16:
            codes, s = quantize_activation(x, self.act_bits, self.act_scale)
            x = codes * s
        return F.linear(x, self.dequantized_weight(x.dtype), self.bias)

    def _int4_kernel_forward(self, x: torch.Tensor) -> torch.Tensor:
        group = self.fmt.group_size or self.in_features
        out = ops.int4_gemm(x.reshape(-1, x.shape[-1]), self.qweight, self.scales, self.zeros, self.bias, group, self.offset)
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def _int8_forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.act_scale is None:
            xq, sx = ops.quantize_rows_int8(x2)
        else:
            xq, sx = quantize_activation(x2.float(), 8, self.act_scale)
        if self.fmt.bits == 4:
            group = self.fmt.group_size or self.in_features
            out = ops.w4a8_gemm(xq.to(torch.int8), sx, self.qweight, self.scales, self.bias, group)
            return out.to(x.dtype).reshape(*shape[:-1], self.out_features)
        acc = ops.int_mm(xq.to(torch.int8), self.qweight.t())
        out = acc.float() * sx.reshape(-1, 1) * self.scales.float().reshape(1, -1)
        if self.bias is not None:
            out = out + self.bias.float()
        return out.to(x.dtype).reshape(*shape[:-1], self.out_features)

    def llmx_spec(self) -> dict[str, Any]:
        """What :func:`llmx.core.models.storage.load` needs to rebuild this layer."""
        return {"layer": self.LAYER,
                "bits": self.fmt.bits, "group_size": self.fmt.group_size, "symmetric": self.fmt.symmetric,
                "full_range": self.fmt.full_range,
                "act_bits": self.act_bits, "static_act": self.act_scale is not None,
                "in_features": self.in_features, "out_features": self.out_features, "bias": self.bias is not None}

    @classmethod
    def rebuild(cls, spec: dict[str, Any], state: dict[str, torch.Tensor], dtype: torch.dtype, config: Any = None) -> QuantLinear:
        """Inverse of :meth:`llmx_spec` plus the layer's stored tensors (the storage loader's builder)."""
        fmt = IntFormat(spec["bits"], spec["group_size"], spec["symmetric"], spec.get("full_range", False))
        layer = cls(spec["in_features"], spec["out_features"], spec["bias"], fmt, spec["act_bits"], spec["static_act"], dtype)
        layer.load_state_dict(state, strict=True)
        return layer

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, {self.fmt.describe()}, a{self.act_bits}"
