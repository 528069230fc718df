"""Sequential onloading: a model larger than the device runs with its decoder blocks' weights in CPU memory, each block
moved to the execution device for its forward and back after it (as accelerate's ``cpu_offload`` hooks do, and
llm-compressor's sequential pipeline for calibration).

What is outside the blocks (embeddings, final norm, head, rotary tables) stays on the device: peak device memory is
that, one block and the activations. An offloaded block holds meta tensors; its real ones sit in a CPU store, so a
block whose tensors are not meta is exactly a block on the device. Each block's ``forward`` is wrapped: it onloads
the block, runs, and drops the device copies (weights are read-only in a forward). Code that changes a block (a
quantizer installing packed layers) holds it onloaded with :func:`held` and ``write_back``: the block's tensors, new
ones included, go back to the store when it leaves. Forward pre-hooks run before the wrapped forward, so a hook that
stops a pass before a block (calibration's input capture) never onloads that block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_ATTR = "_llmx_onload"
CPU = torch.device("cpu")


def _slots(block: torch.nn.Module) -> Iterator[tuple[str, dict, str]]:
    """``(key, dict, name)`` of every parameter and buffer slot of ``block`` that holds a tensor."""
    for prefix, m in block.named_modules():
        for table in (m._parameters, m._buffers):
            for name, t in table.items():
                if t is not None:
                    yield f"{prefix}.{name}", table, name


def _like(t: torch.Tensor, data: torch.Tensor) -> torch.Tensor:
    return torch.nn.Parameter(data, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else data


class Onload:
    """One block's store and state: onloaded while ``depth > 0``; ``live`` holds what onloading put in each slot."""

    def __init__(self, block: torch.nn.Module, device: torch.device):
        self.block, self.device = block, device
        self.store: dict[str, torch.Tensor] = {}
        self.live: dict[str, tuple[dict, str, torch.Tensor]] = {}
        self.depth, self.write_back = 0, False

    @staticmethod
    def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
        return t if t.device == device else _like(t, t.detach().to(device))

    def onload(self) -> None:
        for key, table, name in _slots(self.block):
            table[name] = t = self._to(self.store[key], self.device)
            self.live[key] = (table, name, t)

    def offload(self, write_back: bool) -> None:
        """Meta tensors in the block. The store keeps a slot's tensor unless it is written back or was replaced
        while onloaded (a layer installed, a buffer reassigned): those go to the CPU; slots gone leave the store.
        A module taken out of the block meanwhile (a float layer a quantizer replaced, still referenced by its
        caller) loses its device tensors too."""
        store: dict[str, torch.Tensor] = {}
        for key, table, name in _slots(self.block):
            t = table[name]
            if t.is_meta:
                store[key] = self.store[key]
                continue
            same = key in self.live and self.live[key][2] is t
            store[key] = self.store[key] if same and not write_back else self._to(t, CPU)
            table[name] = _like(t, torch.empty_like(t, device="meta"))
        for table, name, t in self.live.values():
            if table.get(name) is t:
                table[name] = _like(t, torch.empty_like(t, device="meta"))
        self.store, self.live = store, {}

    @contextlib.contextmanager
    def held(self, write_back: bool = False) -> Iterator[None]:
        if self.depth == 0:
            self.onload()
        self.depth += 1
        self.write_back |= write_back
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0:
                self.offload(self.write_back)
                self.write_back = False

    def forward(self, original, *args, **kwargs):
        with self.held():
            return original(*args, **kwargs)


def attach(model: torch.nn.Module, device: str | torch.device) -> torch.nn.Module:
    """Keep ``model``'s decoder blocks in CPU memory and onload each to ``device`` for its forward; everything else
    moves to ``device``. Idempotent."""
    from llmx.core.models.blocks import decoder_blocks

    device = torch.device(device)
    blocks = decoder_blocks(model)
    inside = {id(m) for b in blocks for m in b.modules()}
    for m in model.modules():
        if id(m) not in inside and m is not blocks:
            m._apply(lambda t: t.to(device), recurse=False)
    for block in blocks:
        if handle(block) is not None:
            continue
        h = Onload(block, device)
        block._apply(lambda t: t.to(CPU))
        h.offload(write_back=True)
        original = block.forward
        block.forward = lambda *a, _h=h, _f=original, **k: _h.forward(_f, *a, **k)
        setattr(block, _ATTR, h)
    return model


def handle(block: torch.nn.Module) -> Onload | None:
    return getattr(block, _ATTR, None)


def attached(model: torch.nn.Module) -> bool:
    return any(handle(m) is not None for m in model.modules())


def held(block: torch.nn.Module, write_back: bool = False) -> contextlib.AbstractContextManager:
    """Inside, ``block`` is on the execution device (a no-op for a block not onloaded); with ``write_back`` its
    tensors, as they then are, return to the CPU store after."""
    h = handle(block)
    return h.held(write_back) if h is not None else contextlib.nullcontext()


@contextlib.contextmanager
def resident(model: torch.nn.Module) -> Iterator[None]:
    """Inside, every onloaded block holds its real tensors from the CPU store (no device copies): for saving the
    model or reading its state dict."""
    hs = [h for m in model.modules() if (h := handle(m)) is not None and h.depth == 0]
    for h in hs:
        for key, table, name in _slots(h.block):
            table[name] = h.store[key]
    try:
        yield
    finally:
        for h in hs:
            h.offload(write_back=False)
