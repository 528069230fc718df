from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from llmx.core.refs import DataFile
from llmx.core.spec import Params
from llmx.plugins.lexico.buffers import KIVIRule, LexicoRule


class KVEvalParams(Params):
    windows: int = Field(8, gt=0, description="Held-out windows (validation split of the run's data).")
    context_len: int = Field(192, gt=1, description="Tokens prefilled into the cache.")
    continuation_len: int = Field(64, gt=0, description="Tokens then decoded one at a time through the cache.")
    generate_tokens: int = Field(32, ge=0, description="Greedy tokens compared with the full cache's.")
    recall_tokens: int = Field(16, ge=0, description="Recall task: tokens to continue after the cue (0: skip it; "
                               "skipped by default when the context is too short for it).")
    recall_cue: int = Field(32, gt=0, description="Recall task: the context's first tokens, repeated at its end.")
    buffer_length: int = Field(128, ge=1, description="Recent tokens kept exact (official Lexico: 128; KIVI's "
                               "residual length R; the window's size for kv-window is `window`).")
    chunk: int = Field(32, gt=0, description="Tokens Lexico compresses at a time (official approximation_length: 32 in "
                       "the cache config, 1 model-side; by default at most buffer_length); also the at_least rule's "
                       "step.")
    amortize_batch: int = Field(8, gt=0, description="Sequences the dictionaries are shared by, for the amortised "
                                "memory figure.")

    @model_validator(mode="after")
    def _recall_fits(self):
        if self.recall_tokens and self.recall_cue + self.recall_tokens >= self.context_len - self.recall_cue:
            if not {"recall_tokens", "recall_cue"} & self.model_fields_set:
                self.recall_tokens = 0  # the defaults do not fit a short context: the task is skipped
                return self
            raise ValueError(f"recall_cue + recall_tokens ({self.recall_cue} + {self.recall_tokens}) must fit well "
                             f"inside context_len ({self.context_len}); lower them or set recall_tokens=0")
        return self


class CompressedParams(KVEvalParams):
    attention: Literal["codes", "dense"] = Field("codes", description="codes: attend over the compressed tokens "
                                                 "without rebuilding them (Lexico: gathered scores; KIVI: a block "
                                                 "dequantized at a time); dense: rebuild them per layer (reference).")
    buffer: Literal["official", "at_least"] = Field("official", description="official: the exact buffer as the "
                                                    "method's code keeps it (Lexico: buffer_length - chunk + 1 to "
                                                    "buffer_length tokens; KIVI: keys 0 to R-1, values R); at_least: "
                                                    "llmx's earlier rule, buffer_length to buffer_length + chunk - 1.")


class LexicoDecodeParams(CompressedParams):
    dictionary: DataFile | None = Field(None, description="Dictionaries file from `llmx train --method lexico`; default: "
                                   "the one an earlier lexico train stage of this run wrote.")
    sparsity: int | None = Field(None, gt=0, description="Atoms per key vector (default: the sparsity it was "
                                 "trained for).")
    value_sparsity: int | None = Field(None, gt=0, description="Atoms per value vector (default: as keys).")
    fp8: bool = Field(True, description="Store coefficients as float8 e4m3 (the method's format).")
    tol: float | None = Field(None, gt=0, lt=1, description="Stop a vector's OMP once its relative residual is at most "
                              "this (official error_threshold); the slots stay stored (fixed-width layout).")

    @model_validator(mode="after")
    def _rule_fits(self):
        if "chunk" not in self.model_fields_set:
            self.chunk = min(self.chunk, self.buffer_length)  # the default fits a short buffer
        if self.buffer == "official":
            LexicoRule(self.buffer_length, self.chunk)  # its ValueError is the config's
        return self

    def pipeline_problem(self, earlier) -> str | None:
        """No dictionary given and no lexico train stage before this one to write it: refused before any work."""
        if self.dictionary is None and not any(s.spec.name == "lexico" and s.stage.value == "train" for s in earlier):
            return ("lexico decode needs --set dictionary=FILE (from llmx train --method lexico) or a lexico train "
                    "stage earlier in the run")
        return None


class KIVIParams(CompressedParams):
    bits: Literal[1, 2, 4, 8] = Field(2, description="Bits per code, packed 8 / bits to a byte.")
    group: int = Field(32, gt=0, description="Tokens per key group (per channel) and channels per value group (by "
                       "default 32, or the largest divisor of both 32 and an official residual that 32 does not "
                       "divide).")

    @model_validator(mode="after")
    def _rule_fits(self):
        if self.buffer == "official":
            if "group" not in self.model_fields_set:
                self.group = math.gcd(self.group, self.buffer_length)  # the default fits a short residual
            KIVIRule(self.buffer_length, self.group)  # its ValueError is the config's
        return self


class LexicoTrainParams(Params):
    atoms: int = Field(1024, gt=1, le=32767, description="Dictionary size (official default 4096).")
    sparsity: int = Field(8, gt=0, description="Atoms per vector during training (official 8).")
    steps: int = Field(1000, gt=0, description="Adam steps, the learning rate annealed to 0 by a cosine (official).")
    lr: float = Field(3e-3, gt=0, description="Adam (official 1e-4 over 20 epochs of WikiText-103; fewer steps here).")
    batch: int = Field(256, gt=0, description="Vectors per step.")
    windows: int = Field(64, gt=0, description="Training windows from the data's train split.")
    seq_len: int = Field(128, gt=1)
    held_out_windows: int = Field(8, gt=0, description="Validation windows the reported dictionary error is "
                                  "measured on (vectors the dictionary never saw).")
    transfer_data: str | None = Field(None, description="Another corpus (e.g. pydoc) to measure the dictionary's "
                                      "error on as well: the paper's universality claim.")


class WindowParams(KVEvalParams):
    window: int = Field(64, gt=0, description="Most recent tokens kept; older ones are evicted.")
    sinks: int = Field(4, ge=0, description="First tokens always kept (attention sinks).")
