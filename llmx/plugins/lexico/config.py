from __future__ import annotations

from pydantic import Field

from llmx.core.refs import DataFile
from llmx.core.spec import Params


class KVEvalParams(Params):
    windows: int = Field(8, gt=0, description="Held-out windows (validation split of the run's data).")
    context_len: int = Field(192, gt=1, description="Tokens prefilled into the cache.")
    continuation_len: int = Field(64, gt=0, description="Tokens then decoded one at a time through the cache.")
    generate_tokens: int = Field(32, ge=0, description="Greedy tokens compared with the full cache's.")
    buffer_length: int = Field(32, ge=0, description="Most recent tokens kept exact (official Lexico: 128).")
    chunk: int = Field(1, gt=0, description="Tokens compressed at a time when the buffer overflows (official: 1 or 32).")


class LexicoDecodeParams(KVEvalParams):
    dictionary: DataFile | None = Field(None, description="Dictionaries file from `llmx train --method lexico`; default: "
                                   "the one an earlier lexico train stage of this run wrote.")
    sparsity: int | None = Field(None, gt=0, description="Atoms per vector (default: the sparsity it was trained for).")
    fp8: bool = Field(True, description="Store coefficients as float8 e4m3 (the method's format).")


class KIVIParams(KVEvalParams):
    bits: int = Field(2, ge=1, le=8)
    group: int = Field(32, gt=0, description="Tokens per key group (per channel) and channels per value group.")


class LexicoTrainParams(Params):
    atoms: int = Field(1024, gt=1, le=32767, description="Dictionary size (official default 4096).")
    sparsity: int = Field(8, gt=0, description="Atoms per vector during training (official 8).")
    steps: int = Field(300, gt=0)
    lr: float = Field(1e-3, gt=0, description="Adam (official 1e-4 over 20 epochs of WikiText-103; fewer steps here).")
    batch: int = Field(256, gt=0, description="Vectors per step.")
    windows: int = Field(64, gt=0, description="Training windows from the data's train split.")
    seq_len: int = Field(128, gt=1)


class WindowParams(KVEvalParams):
    window: int = Field(64, gt=0, description="Most recent tokens kept; older ones are evicted.")
    sinks: int = Field(4, ge=0, description="First tokens always kept (attention sinks).")
