"""QuantLinear: a Linear that really stores packed integer weights, for weight-only and W8A8 inference.

Weights: ``bits``-bit codes packed densely along the input dim (int4: two per byte, low nibble first; int8 stored as
int8), fp16 scales per group / channel / tensor, uint8 zero points when asymmetric. W8A8 (8-bit symmetric
per-channel or per-tensor weights, 8-bit activations) runs through an integer matmul (``torch._int_mm``) with int32
accumulation, W4A8 (4-bit symmetric grouped weights) through ``ops.w4a8_gemm`` (int32 per group, then scaled; a CuPy
kernel on CUDA); other activation widths are simulated (quantize-dequantize) around a float matmul.

On the CPU, int4 layers (W4A16 and W4A8) run through torch's packed-int4 kernel and per-channel W8A16 through its
int8 one (:mod:`llmx.core.quant.cpu_kernels`, bf16 activations): on the first CPU call an int4 ``qweight`` is converted
in place to that kernel's layout, and ``codes()``, ``state_dict()`` and any other device read the canonical layout
back from it. An input on another device than the layer's weights (a CUDA tensor reaching the CPU kernels, or the
reverse) raises :class:`~llmx.errors.DeviceMismatch` naming the layer; nothing is copied between devices here.
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

    def _use_cpu_kernel(self, x: torch.Tensor) -> bool:
        """Switch to (or out of) the CPU kernel's layout for an input on ``x``'s device; True when it runs there.
        Inputs that need a gradient take the exact path (the kernel has no derivative)."""
        self._check_layout()
        on_cpu = (x.device.type == "cpu" and self._kernel_group is not None and cpu_kernels.enabled()
                  and not (x.requires_grad and torch.is_grad_enabled()))
        if on_cpu and not self._kernel_layout:
            packed = cpu_kernels.to_kernel(self.qweight, self.out_features, self.in_features, self.describe())
            if packed is None:  # a CPU whose kernel layout this module cannot invert: the exact path, always
                self._kernel_group = None
                return False
            self.qweight = packed
            self._kernel_version = _version(packed)
            self._kernel_layout = True
        if on_cpu and (self._kernel_key != self._scale_key() or self._buffers.get("_kernel_sz") is None
                       or self._kernel_sz.dtype != torch.bfloat16):
            group = self.fmt.group_size or self.in_features
            sz = cpu_kernels.scales_and_zeros(self.scales, self.zeros, self.out_features, self.in_features, group,
                                              self._kernel_group)
            self.register_buffer("_kernel_sz", sz, persistent=False)
            self._kernel_key = self._scale_key()
        elif not on_cpu and self._kernel_layout:
            self._leave_kernel_layout()
        return on_cpu

    def _leave_kernel_layout(self) -> None:
        self.qweight = self.canonical_qweight()
        del self._kernel_sz
        self._kernel_layout = False

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self._kernel_layout:
            destination[prefix + "qweight"] = self.canonical_qweight()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if self._kernel_layout:
            self._leave_kernel_layout()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        """Pickles and deep copies hold the canonical layout: the kernel's depends on the CPU that built it."""
        state = self.__dict__.copy()
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
        if x.device != self._buffers["qweight"].device:  # before any path: the CPU kernels' layout switch included
            raise DeviceMismatch(f"{self.describe()}: input on {x.device}, weights on {self._buffers['qweight'].device}",
                                 hint="keep a model and its inputs on one device (model.to(device), inputs .to(device))")
        if self._use_cpu_kernel(x):
            return self._cpu_kernel_forward(x)
        if self._int8_kernel and x.device.type == "cpu" and cpu_kernels.enabled():
            out = cpu_kernels.int8_matmul(x.reshape(-1, x.shape[-1]), self.qweight, self.scales)
            out = out + self.bias.float() if self.bias is not None else out
            return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        if self.act_bits == 8:
            return self._int8_forward(x)
        if self.fmt.bits == 4 and self.act_bits == 16 and self.fmt.group_size != 0 and kernels.use_kernel(x):
            return self._int4_kernel_forward(x)
        if self.act_bits < 16:
            codes, s = quantize_activation(x, self.act_bits, self.act_scale)
            x = codes * s
        return F.linear(x, self.dequantized_weight(x.dtype), self.bias)

    def _cpu_kernel_forward(self, x: torch.Tensor) -> torch.Tensor:
        """W4A16: bf16 activations into the int4 kernel. W4A8: the int8 codes (exact in bf16) into it, times their
        scale, as the integer kernel would."""
        buffers, bias = self._buffers, self._parameters.get("bias")  # direct reads: a decode step is microseconds
        x2 = x.reshape(-1, x.shape[-1])
        scale = None
        if self.act_bits < 16:
            x2, scale = quantize_activation(x2.float(), self.act_bits, buffers["act_scale"])
        out = cpu_kernels.matmul(x2, buffers["qweight"], buffers["_kernel_sz"], self._kernel_group, self.out_features)
        out = out.float() if scale is None else out.float() * scale
        if bias is not None:
            out = out + bias
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

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
