"""Load an exported folder with plain transformers and measure how far its logits are from the model's."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def quiet_library() -> Iterator[None]:
    """No tqdm bars or loguru lines from compressed-tensors while it loads and decompresses a folder (its bars go to
    whatever ``sys.stderr`` is when they start)."""
    from loguru import logger

    logger.disable("compressed_tensors")
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logger.enable("compressed_tensors")


def dequantizes_while_loading() -> bool:
    """Whether transformers dequantizes a compressed-tensors checkpoint weight by weight as it loads (a load operation
    of its quantizer, as 5.23 does) rather than by decompressing the loaded model in one step afterwards (5.17)."""
    from transformers.quantizers.quantizer_compressed_tensors import CompressedTensorsHfQuantizer

    return "get_load_operations" in vars(CompressedTensorsHfQuantizer)


def check_loads(folder: str | Path, arch: str) -> None:
    """Plain transformers accepts the folder: ``from_pretrained`` on the meta device (no memory, no compute) builds the
    architecture with compressed-tensors' layers and matches every stored tensor to them, so a folder it would refuse
    (an architecture whose loading code reads a packed layer's ``weight``, a tensor of the wrong shape) is refused
    here, before it is written."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from llmx.errors import UsageError

    try:
        with quiet_library():
            config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
            qconfig = getattr(config, "quantization_config", None) or {}
            if qconfig.get("dequantize") and not dequantizes_while_loading():
                # There (5.17) a ``dequantize`` folder loads into the same compressed layers as any other and the
                # whole model is decompressed afterwards, which compressed-tensors cannot do on the meta device: the
                # tensors are matched to the layers all the same without that last step (load_plain takes it).
                config.quantization_config = {**qconfig, "dequantize": False}
            _, info = AutoModelForCausalLM.from_pretrained(str(folder), config=config, device_map="meta",
                                                           output_loading_info=True, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever transformers raises, the folder is not written
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise UsageError(f"cannot export to compressed-tensors: plain transformers cannot load {arch} with "
                         f"compressed-tensors layers ({type(exc).__name__}: {first})") from exc
    wrong = {k: sorted(v)[:3] for k, v in info.items() if v}
    if wrong:
        raise UsageError(f"cannot export to compressed-tensors: plain transformers loads {arch} with {wrong}")



def load_plain(folder: str | Path, dtype: Any = None) -> Any:
    """``AutoModelForCausalLM.from_pretrained(folder)``, as any transformers user would, in eval mode."""
    from transformers import AutoModelForCausalLM

    with quiet_library():
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype or "auto", local_files_only=True)
    return model.eval()


def max_logit_difference(model: Any, folder: str | Path, *, batch: int = 2, seq_len: int = 32, seed: int = 0) -> float:
    """Largest absolute difference between the logits of ``model`` (on llmx's exact path, so the CPU kernels' bf16
    rounding does not hide an export error) and of ``folder`` loaded by plain transformers, on fixed random ids."""
    import torch

    from llmx.core.quant.cpu_kernels import exact

    device = next(model.parameters()).device
    plain = load_plain(folder, model.get_input_embeddings().weight.dtype).to(device)
    vocab = model.get_input_embeddings().num_embeddings
    ids = torch.randint(0, vocab, (batch, seq_len), generator=torch.Generator().manual_seed(seed)).to(device)
    with torch.no_grad(), quiet_library(), exact():
        return (model(ids).logits.float() - plain(ids).logits.float()).abs().max().item()
