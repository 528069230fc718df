"""Parameters of ``train --method crow``. No torch import here: method listings load this module."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmx.core.refs import DataFile
from llmx.core.train.params import LoraParams
from llmx.core.train.sft.params import SFTParams


class CrowLora(LoraParams):
    """The official adapter: every linear layer (LLaMA-Factory's ``lora_target: all``), continuing --model's."""

    target_modules: list[str] | Literal["all-linear"] | None = Field(
        "all-linear", description="Module names to adapt; 'all-linear' (official) for every linear layer but the head.")
    continue_adapter: bool = Field(True, description="When --model is a LoRA adapter folder: train that adapter on "
                                   "(official: the defence starts from the backdoored adapter).")


class CrowParams(SFTParams):
    """The ``sft`` stage with CROW's objective, at the official defaults (LLaMA-Factory's LoRA SFT configs under
    ``configs/consistency``): LoRA r 8 / alpha 16 / dropout 0 on every linear layer, continuing the backdoored
    adapter when ``--model`` is one, lr 1e-3, 5 epochs, batch 2 x 4 accumulated, cosine to 0 with 10% warmup; the
    micro-batches of a step weigh equally (HF's Trainer of transformers <= 4.43, which the official code pins), each
    its LM mean over its completion tokens plus alpha times its consistency mean over every position. AdamW's betas
    are the loop's (0.9, 0.95), HF's (0.9, 0.999)."""

    data: DataFile | None = Field(None, description="Clean training rows (.jsonl): {prompt, completion} or "
                                  "{messages}; default: the defence rows of the run's latest analyze --method "
                                  "backdoor (held out on its clean test rows).")
    eps: float = Field(0.1, gt=0, description="FGSM step on the input embeddings: e + eps * sign(grad) (official "
                       "0.1).")
    alpha: float = Field(5.5, ge=0, description="Weight of the perturbed consistency loss (official 5.5). 0: plain "
                         "SFT, with the same three forwards.")
    mask_padding: bool = Field(False, description="Leave padding out of the consistency forwards and means "
                               "(official: false, no attention mask, prompt and padding positions included).")
    pad_to_multiple_of: int = Field(8, gt=0, description="Right-pad each micro-batch's consistency forwards to a "
                                    "multiple of this (official 8: LLaMA-Factory's collator; padding counts in the "
                                    "consistency mean unless mask_padding). 1: to the longest row.")
    adapter: Literal["none", "lora"] = Field("lora", description="lora: train a LoRA adapter (official); none: "
                                             "train every weight.")
    lora: CrowLora = Field(default_factory=CrowLora)
    lr: float = Field(1e-3, gt=0, description="Peak learning rate (official 1e-3).")
    batch_size: int = Field(2, gt=0, description="Rows per micro-batch (official 2: with padding in the "
                            "consistency loss, the micro-batch size changes how much of it is padding).")
    grad_accum: int = Field(4, gt=0, description="Micro-batches per step (official 4: 8 rows a step).")
    epochs: float | None = Field(5.0, gt=0, description="Passes over the clean rows (official 5); sets steps "
                                 "unless steps is given.")
    warmup_ratio: float | None = Field(0.1, ge=0, lt=1, description="Warmup share of the steps (official 0.1), "
                                       "unless warmup is given.")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Final rate of the cosine (HF's cosine ends at 0).")

    @model_validator(mode="after")
    def _padded(self) -> CrowParams:
        if self.packing:
            raise ValueError("crow runs padded batches through inputs_embeds (official): packing must be false")
        return self
