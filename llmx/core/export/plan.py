"""What an export can express: each stored layer's compressed-tensors scheme, or a one-line reason why it has none.

Checked twice with the same rules: from the specs in a saved folder's ``llmx.json`` (before anything loads), then on
the loaded model against the plain transformers architecture (module types, shapes, tied weights, hooks), so a layer
only llmx can run is refused instead of written and loaded as garbage. No torch import at module level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmx.errors import UsageError

PLAIN_LAYER = "quant_linear"  # the only stored layer type with a compressed-tensors form
PLAIN_BUILDER = "llmx.core.quant.qlinear:QuantLinear.rebuild"  # its builder, in specs written before layers were named


@dataclass(frozen=True)
class Scheme:
    """One layer's quantization, in llmx's terms: ``group_size`` None is per channel, 0 per tensor; ``act`` is None
    (16-bit activations), ``"static"`` (int8, one calibrated scale) or ``"dynamic"`` (int8, per token)."""

    bits: int
    group_size: int | None
    symmetric: bool
    act: str | None = None

    @property
    def format(self) -> str:
        return "int-quantized" if self.act else "pack-quantized"

    @property
    def strategy(self) -> str:
        return "tensor" if self.group_size == 0 else "channel" if self.group_size is None else "group"

    @property
    def packed_zero_point(self) -> bool:
        """Zero points stored packed (int32 along the output dim): asymmetric group or channel weights."""
        return not self.symmetric and self.strategy != "tensor"

    def describe(self) -> str:
        grid = {"tensor": "per-tensor", "channel": "per-channel"}.get(self.strategy, f"g{self.group_size}")
        act = f"a8 {self.act}" if self.act else "a16"
        return f"w{self.bits}{act.replace(' ', '-')} {grid} {'sym' if self.symmetric else 'asym'}"


def refuse(name: str, why: str) -> UsageError:
    return UsageError(f"cannot export {name} to compressed-tensors: {why}")


def _layer_kind(spec: dict[str, Any]) -> str:
    if "layer" in spec:
        return str(spec["layer"])
    return PLAIN_LAYER if spec.get("builder") == PLAIN_BUILDER else str(spec.get("builder"))


def scheme_for(name: str, spec: dict[str, Any]) -> Scheme:
    """The scheme of one stored layer, or a UsageError naming the layer and why it has none."""
    kind = _layer_kind(spec)
    if kind != PLAIN_LAYER:
        from llmx.core.plugins import host

        known = host().layers.get(kind)
        what = f"a {kind} layer ({known.summary})" if known and known.summary else f"a {kind} layer"
        raise refuse(name, f"it is {what}, which has no compressed-tensors form; only llmx's plain packed linears "
                           f"({PLAIN_LAYER}: RTN, GPTQ) export")
    bits, group, sym, act = spec["bits"], spec["group_size"], spec["symmetric"], spec["act_bits"]
    if act == 16:
        if group and spec["in_features"] % group:
            raise refuse(name, f"in_features {spec['in_features']} is not a multiple of group_size {group} "
                               "(compressed-tensors groups must tile each row)")
        return Scheme(bits, group, sym)
    if act != 8:
        raise refuse(name, f"a{act} activations: compressed-tensors' int-quantized format runs int8 activations only")
    if bits != 8 or not sym or group not in (None, 0):
        raise refuse(name, f"W{bits}A8 ({'int4 weights with int8 activations' if bits == 4 else 'these weights'}) is "
                           "neither pack-quantized (weight-only) nor int-quantized (symmetric int8 weights per "
                           "channel or tensor)")
    return Scheme(8, group, True, "static" if spec["static_act"] else "dynamic")


def schemes_from_specs(specs: dict[str, dict[str, Any]], source: str) -> dict[str, Scheme]:
    """Every stored layer's scheme (the first layer that has none raises); no stored layer at all is an error."""
    if not specs:
        raise UsageError(f"{source} holds no llmx-quantized layers: nothing to export (a float model already loads in "
                         "plain transformers; quantize it first, e.g. llmx quantize --method rtn --bits w4a16)")
    schemes = {name: scheme_for(name, spec) for name, spec in specs.items()}
    formats = {s.format for s in schemes.values()}
    if "int-quantized" in formats and any(s.packed_zero_point for s in schemes.values()):
        raise UsageError("cannot export to compressed-tensors: asymmetric grouped or per-channel weights load "
                         "dequantized in transformers, which would drop the int8 activations of the W8A8 layers")
    return schemes


def plain_architecture(config: Any):
    """The model transformers builds from ``config``, on the meta device (no memory, no init)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def check_model(model: Any, schemes: dict[str, Scheme], config: Any) -> list[str]:
    """Check the loaded model against the plain architecture: each quantized layer must replace an ``nn.Linear`` of
    its shape, every other module must be the plain one, tensors must match, nothing may hook a forward. Returns the
    plain linear layers left in float (the config's ``ignore`` list)."""
    import torch

    from llmx.core.quant.qlinear import QuantLinear

    plain = plain_architecture(config)
    plain_modules = dict(plain.named_modules())
    arch = type(plain).__name__
    for name in schemes:
        layer, base = model.get_submodule(name), plain_modules.get(name)
        if type(layer) is not QuantLinear:
            raise refuse(name, f"a {type(layer).__name__} is stored as a plain packed linear")
        if not isinstance(base, torch.nn.Linear):
            what = type(base).__name__ if base is not None else "no module"
            raise refuse(name, f"the plain {arch} has {what} there, and compressed-tensors quantizes nn.Linear only")
        if (base.in_features, base.out_features) != (layer.in_features, layer.out_features):
            raise refuse(name, f"shape {layer.out_features}x{layer.in_features} differs from the plain {arch}'s "
                               f"{base.out_features}x{base.in_features}")
        s = schemes[name]
        if not s.symmetric and int(layer.zeros.max()) >= 2**s.bits:
            raise refuse(name, f"a zero point of {int(layer.zeros.max())} is outside the int{s.bits} grid")
    for name, module in model.named_modules():
        if name in schemes or any(name.startswith(q + ".") for q in schemes):
            continue
        base = plain_modules.get(name)
        if base is None or type(base) is not type(module):
            raise refuse(name or "the model", f"it is a {type(module).__name__} where the plain {arch} has "
                                              f"{type(base).__name__ if base is not None else 'no module'}")
        if module._forward_hooks or module._forward_pre_hooks:
            raise refuse(name or "the model", "it has forward hooks (a run-time transform the folder cannot carry)")
    plain_state, state = plain.state_dict(), model.state_dict()
    for key, tensor in state.items():
        if key.rpartition(".")[0] in schemes:
            continue
        if key not in plain_state or tuple(plain_state[key].shape) != tuple(tensor.shape):
            raise refuse(key, f"tensor of shape {tuple(tensor.shape)} is not in the plain {arch}")
    missing = [k for k in plain_state if k not in state and k.rpartition(".")[0] not in schemes]
    if missing:
        raise refuse(missing[0], f"the plain {arch} has this tensor and the model does not")
    out_emb = model.get_output_embeddings()
    tied = getattr(config.get_text_config(decoder=True), "tie_word_embeddings", False)
    if tied and any(model.get_submodule(n) is out_emb for n in schemes):
        raise refuse(next(n for n in schemes if model.get_submodule(n) is out_emb),
                     "the output head is quantized but tied to the input embeddings")
    return [n for n, m in plain_modules.items() if isinstance(m, torch.nn.Linear) and n not in schemes]
