"""Calibration: hook Linear inputs on token windows, accumulate Hessians ``X X^T`` and activation ranges.

``sequential`` walks the model block by block: the inputs of block ``i`` are computed with blocks ``< i`` already
quantized (``propagate="quantized"``, as GPTQ and Quamba do) or all in full precision (``propagate="fp"``, as
GuidedQuant's Hessians are), and a callback quantizes each block once its statistics are in. With
``true_sequential`` (the reference GPTQ code's ``--true-sequential``) a block's layers are quantized group by group in
the order it calls them, each group's inputs recomputed with the block's earlier groups quantized.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch

from llmx.core.models import onload
from llmx.core.quant.cpu_kernels import exact

_BLOCK = re.compile(r"\.(?:layers|h|blocks)\.(\d+)\.")


@dataclass
class LinearStats:
    """What the hooks saw at one Linear's input."""

    hessian: torch.Tensor | None = None  # sum over tokens of x x^T (float32, accumulated in place, as the GPTQ code)
    tokens: int = 0
    absmax: float = 0.0
    channel_absmax: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)

    def add(self, x: torch.Tensor, with_hessian: bool) -> None:
        x = x.detach().reshape(-1, x.shape[-1]).float()
        if with_hessian:
            if self.hessian is None:
                self.hessian = x.T @ x
            else:
                self.hessian.addmm_(x.T, x)
        self.tokens += x.shape[0]
        self.absmax = max(self.absmax, float(x.abs().max()))
        cmax = x.abs().amax(dim=0)
        self.channel_absmax = cmax if self.channel_absmax is None else torch.maximum(self.channel_absmax, cmax)


def block_of(name: str) -> int | None:
    m = _BLOCK.search(f".{name}.")
    return int(m.group(1)) if m else None


@torch.no_grad()
def forward_batches(model: torch.nn.Module, batches: torch.Tensor, batch_size: int = 8, progress=None,
                    description: str = "calibrating") -> None:
    """Run token windows through ``model`` in chunks (whatever hooks or observers it carries record them)."""
    device = next(model.parameters()).device
    chunks = list(range(0, len(batches), batch_size))
    for i in progress(chunks, description=description) if progress else chunks:
        model(input_ids=batches[i:i + batch_size].to(device))


@torch.no_grad()
def collect(model: torch.nn.Module, layers: dict[str, torch.nn.Module], batches: torch.Tensor, with_hessian: bool = True,
            batch_size: int = 8, progress=None) -> dict[str, LinearStats]:
    """Run ``batches`` through ``model`` once, recording the inputs of ``layers``."""
    stats = {name: LinearStats() for name in layers}
    hooks = [m.register_forward_pre_hook(lambda _m, args, n=name: stats[n].add(args[0], with_hessian))
             for name, m in layers.items()]
    try:
        forward_batches(model, batches, batch_size, progress)
    finally:
        for h in hooks:
            h.remove()
    return stats


class _Stop(Exception):
    """Raised by the hook that caught a block's inputs: the rest of the model need not run."""


def decoder_blocks(model: torch.nn.Module, names: Iterable[str]) -> torch.nn.ModuleList | None:
    """The list of decoder blocks that ``names`` live in (``model.layers`` for ``model.layers.3.mlp.up_proj``)."""
    for name in names:
        m = _BLOCK.search(f".{name}.")
        if m:
            return model.get_submodule(f".{name}."[1:m.end() - len(m.group(1)) - 2])
    return None


@torch.no_grad()
def block_inputs(model: torch.nn.Module, blocks: torch.nn.ModuleList, first: int, last: int, batches: torch.Tensor,
                 batch_size: int = 8) -> dict[int, list[tuple[tuple, dict]]]:
    """``(args, kwargs)`` of every call blocks ``first..last`` receive, one per chunk of windows, from one pass that
    stops before block ``last`` runs. Each block keeps its own arguments (a sliding-window layer gets another mask than
    a global one), the hidden states only for ``first``: later blocks get theirs from the block before. Onloaded
    blocks (:mod:`~llmx.core.models.onload`) come to the device one at a time, ``last`` never: the hook that stops
    the pass runs before its forward."""
    device = next(model.parameters()).device
    calls: dict[int, list[tuple[tuple, dict]]] = {i: [] for i in range(first, last + 1)}

    def catch(_module, args, kwargs, idx):
        if idx != first:
            args, kwargs = _with_hidden((args, kwargs), None)
        calls[idx].append((args, kwargs))
        if idx == last:
            raise _Stop

    handles = [blocks[i].register_forward_pre_hook(lambda m, a, k, i=i: catch(m, a, k, i), with_kwargs=True)
               for i in calls]
    try:
        for i in range(0, len(batches), batch_size):
            try:
                model(input_ids=batches[i:i + batch_size].to(device), use_cache=False)
            except _Stop:
                pass
    finally:
        for h in handles:
            h.remove()
    return calls


def _input_key(x: torch.Tensor) -> tuple:
    """What identifies one tensor within a call (hold the tensor meanwhile, so that no address is reused)."""
    return x.data_ptr(), tuple(x.shape), x.stride()


@torch.no_grad()
def _input_groups(block: torch.nn.Module, call: tuple[tuple, dict], layers: dict[str, torch.nn.Module],
                  ) -> list[dict[str, torch.nn.Module]]:
    """``layers`` in the order ``block`` calls them on one cached ``call``, consecutive layers that read one tensor
    together: q, k, v; o; gate, up; down in a Llama block, the reference's true-sequential groups. Layers that call
    does not reach (an idle expert) form a last group."""
    order: dict[str, tuple[tuple, torch.Tensor]] = {}  # each layer's first input, held

    def record(name, x):
        order.setdefault(name, (_input_key(x), x))

    hooks = [m.register_forward_pre_hook(lambda _m, args, n=name: record(n, args[0])) for name, m in layers.items()]
    try:
        block(*call[0], **call[1])
    finally:
        for h in hooks:
            h.remove()
    groups: list[dict[str, torch.nn.Module]] = []
    last = None
    for name, (key, _) in order.items():
        if key != last:
            groups.append({})
            last = key
        groups[-1][name] = layers[name]
    rest = {n: m for n, m in layers.items() if n not in order}
    return (groups + [rest]) if rest else groups


def _hidden(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _with_hidden(call: tuple[tuple, dict], hidden: torch.Tensor) -> tuple[tuple, dict]:
    args, kwargs = call
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


@torch.no_grad()
def _run_block(block: torch.nn.Module, calls: list[tuple[tuple, dict]], layers: dict[str, torch.nn.Module] | None = None,
               with_hessian: bool = True, make_stats: Callable[[str], LinearStats] | None = None,
               ) -> tuple[list[torch.Tensor], dict[str, LinearStats]]:
    """Run ``block`` on its cached calls; with ``layers``, record their inputs. Layers reading the same tensor (q, k,
    v; gate, up) share one ``LinearStats``: one Hessian, not three, unless ``make_stats`` gives each layer its own
    (a guided Hessian depends on the layer's outputs, not only on its input)."""
    stats = {name: (make_stats or (lambda _n: LinearStats()))(name) for name in layers or {}}  # never called: empty
    same_as: dict[str, str] = {}
    seen: dict[tuple, tuple[str, torch.Tensor]] = {}  # this call's inputs (held, so no address is reused mid-call)

    def record(name, x):
        if name in same_as:
            return
        first, _ = seen.setdefault(_input_key(x), (name, x))
        if make_stats is None and first != name and not stats[name].tokens:
            same_as[name] = first
            return
        stats[name].add(x, with_hessian)

    hooks = [m.register_forward_pre_hook(lambda _m, args, n=name: record(n, args[0])) for name, m in (layers or {}).items()]
    outputs = []
    try:
        for args, kwargs in calls:
            seen.clear()
            outputs.append(_hidden(block(*args, **kwargs)))
    finally:
        for h in hooks:
            h.remove()
    seen.clear()
    return outputs, {**stats, **{n: stats[first] for n, first in same_as.items()}}


@contextlib.contextmanager
def dequantized_once(block: torch.nn.Module) -> Iterator[None]:
    """Inside, every packed layer of ``block`` (a module with ``dequantized_weight``: QuantLinear, BlockLinear,
    LUTLinear) builds its dequantized weight once per dtype, on its first call, and reuses it for every later chunk of
    windows. It is the tensor the exact path builds on each call (same codes, same arithmetic), so the outputs are
    the same bit for bit, without unpacking and dequantizing once per chunk; paths that never ask for it (integer
    matmuls, device kernels) are untouched. The weights are held until the block leaves: at most the float weights
    the block held before it was quantized."""
    patched = []
    for m in block.modules():
        if not callable(getattr(m, "dequantized_weight", None)) or "dequantized_weight" in vars(m):
            continue
        built: dict[torch.dtype, torch.Tensor] = {}

        def once(dtype: torch.dtype = torch.float32, _build=m.dequantized_weight, _built=built) -> torch.Tensor:
            if dtype not in _built:
                _built[dtype] = _build(dtype)
            return _built[dtype]

        m.dequantized_weight = once  # an instance attribute: it shadows the method until deleted
        patched.append(m)
    try:
        yield
    finally:
        for m in patched:
            del m.dequantized_weight


def sequential(model: torch.nn.Module, layers: dict[str, torch.nn.Module], batches: torch.Tensor,
               quantize_block: Callable[[dict[str, torch.nn.Module], dict[str, LinearStats]], None],
               propagate: str = "quantized", with_hessian: bool = True, progress=None,
               make_stats: Callable[[str], LinearStats] | None = None, true_sequential: bool = False) -> None:
    """Group ``layers`` by decoder block and call ``quantize_block(block_layers, stats)`` block by block.

    One pass of the model records every block's arguments (:func:`block_inputs`); then each block runs once on its
    inputs: the statistics come from that run, and the next block's inputs are this block's outputs, computed again
    after quantizing it (``quantized``) or taken from the same full-precision run (``fp``). Only one block's
    statistics are held at a time, and a layer no token reached (an idle expert, a weight read directly) gets empty
    ones (``hessian`` None). Layers outside every block (``lm_head``) see one whole-model pass at the end
    (``quantized``) or at the start (``fp``). Quantized layers compute on the exact path meanwhile; in a block's
    re-forward each packed weight is dequantized once for all chunks (:func:`dequantized_once`). ``make_stats``
    builds each layer's statistics (GuidedQuant's saliency-weighted Hessians); blocks only then.

    ``true_sequential`` splits each block's layers into the groups :func:`_input_groups` finds and runs the block once
    per group, quantizing that group before the next one's statistics are taken (one block run per group, then the
    re-forward). It needs ``quantized`` propagation: ``fp`` would feed the next block outputs that no quantized block
    computes.

    A model under :mod:`~llmx.core.models.onload` keeps each block on the execution device for its statistics,
    quantization and re-forward (statistics and packed layers are made there), and writes it back to the CPU store
    after; the capture pass and the whole-model passes onload one block at a time.
    """
    groups: dict[int | None, dict[str, torch.nn.Module]] = {}
    for name, module in layers.items():
        groups.setdefault(block_of(name), {})[name] = module
    outside = groups.pop(None, {})
    if true_sequential and propagate != "quantized":
        raise ValueError("true_sequential recomputes inputs from quantized layers: it needs propagate='quantized'")
    blocks = decoder_blocks(model, layers)
    del layers  # from here each block's layers are held only until it is quantized
    if outside and make_stats is not None:
        raise ValueError(f"per-layer statistics need layers inside decoder blocks; {', '.join(outside)} is not")
    with exact():  # quantized blocks compute as the exact path does, on any CPU
        if outside and propagate == "fp":
            quantize_block(outside, collect(model, outside, batches, with_hessian))
            outside = {}
        if groups:
            first, last = min(groups), max(groups)
            calls = block_inputs(model, blocks, first, last, batches)
            hidden = None
            for idx in progress(range(first, last + 1), description="quantizing") if progress else range(first, last + 1):
                block, targets = blocks[idx], groups.pop(idx, None)
                mine = calls.pop(idx)
                if hidden is not None:
                    mine = [_with_hidden(c, h) for c, h in zip(mine, hidden, strict=True)]
                with onload.held(block, write_back=bool(targets)):  # on the device for all three, then back
                    parts = _input_groups(block, mine[0], targets) if targets and true_sequential else [targets]
                    for part in parts:
                        with dequantized_once(block):  # exact, and each packed weight unpacked once, not per chunk
                            hidden, stats = _run_block(block, mine, part, with_hessian, make_stats)
                        if part:
                            quantize_block(part, stats)
                        del stats
                    if targets and propagate == "quantized":
                        with dequantized_once(block):
                            hidden, _ = _run_block(block, mine)
                del parts, targets, mine
        if outside:
            quantize_block(outside, collect(model, outside, batches, with_hessian))
