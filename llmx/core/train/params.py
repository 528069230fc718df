"""Parameters every training stage shares (the loop, precision, checkpoints, adapters). No torch import here:
method listings load this module."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from llmx.core.refs import ExistingPath
from llmx.core.spec import Params


class LoraParams(Params):
    """A LoRA adapter through the ``peft`` library (Hu et al. 2022), or PiSSA's initialisation of it (Meng et al.
    2024: the adapter starts as the principal singular components, the base keeps the residual)."""

    r: int = Field(8, gt=0, description="Rank of each adapter.")
    alpha: float = Field(16.0, gt=0, description="Scale numerator: the update is (alpha / r) * B A.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapter's input.")
    target_modules: list[str] | Literal["all-linear"] | None = Field(
        None, description="Module names to adapt; 'all-linear' for every linear layer but the output head; "
        "default: PEFT's choice for the architecture (q_proj, v_proj for Llama).")
    init: Literal["lora", "pissa"] = Field("lora", description="lora: B = 0 (the adapter starts as a no-op); pissa: "
                                           "A, B from the weight's top-r SVD, the base keeps the residual (PEFT's "
                                           "exact-SVD pissa init).")
    merge: bool = Field(False, description="Save the merged full model instead of the adapter folder.")
    continue_adapter: bool = Field(False, description="When --model is a LoRA adapter folder (and no earlier stage "
                                   "replaced it): train that adapter on (LLaMA-Factory's adapter_name_or_path) "
                                   "instead of merging it and adding a new one; r and alpha are then the folder's.")


class LoopParams(Params):
    """The optimiser, schedule, batching, precision and checkpointing of the shared loop (``core/train/loop.py``)."""

    steps: int = Field(100, gt=0, description="Optimizer steps.")
    lr: float = Field(1e-4, gt=0, description="Peak learning rate (AdamW).")
    warmup: int = Field(10, ge=0, description="Linear warmup steps.")
    schedule: Literal["cosine", "linear", "constant", "wsd"] = Field(
        "cosine", description="After warmup: cosine or linear decay to min_lr_ratio * lr, constant, or wsd "
        "(warmup-stable-decay: constant, then a decay over the last decay_fraction of the steps).")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Final rate of the decaying schedules, as a fraction.")
    decay_fraction: float = Field(0.2, gt=0, le=1, description="wsd: fraction of the steps spent decaying.")
    decay_shape: Literal["linear", "cosine", "sqrt"] = Field("linear", description="wsd: shape of the decay "
                                                             "(sqrt: 1 - sqrt, Hägele et al. 2024).")
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float | None = Field(1.0, gt=0, description="Clip the global gradient norm (null: no clipping).")
    batch_size: int = Field(8, gt=0, description="Examples per micro-batch (per process under torchrun).")
    grad_accum: int = Field(1, gt=0, description="Micro-batches per optimizer step and process.")
    precision: Literal["fp32", "bf16-mixed"] = Field(
        "fp32", description="bf16-mixed: the forward and backward under bfloat16 autocast, fp32 master weights "
        "and optimizer state.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in the backward (less memory).")
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp", description="Data parallelism under torchrun. ddp: every process holds the whole model and gradients "
        "are all-reduced in buckets during the backward (torch DistributedDataParallel, composable replicate). "
        "fsdp: parameters, gradients and optimizer state are sharded across the processes (FSDP2 fully_shard, one "
        "unit per decoder layer); with precision bf16-mixed it gathers parameters in bfloat16 and reduces gradients "
        "in float32. One process: ddp is plain training, fsdp shards over a world of one.")
    offload: bool = Field(False, description="fsdp: keep parameters, gradients and optimizer state in CPU memory "
                          "(FSDP2 CPUOffloadPolicy: each unit is copied to the device for its forward and backward; "
                          "the optimizer step runs on the CPU).")
    checkpoint_every: int | None = Field(None, gt=0, description="Save a resumable checkpoint every N steps.")
    keep_checkpoints: int | None = Field(None, gt=0, description="Keep only the newest N resumable checkpoints.")
    resume: ExistingPath | None = Field(None, description="A checkpoint file or folder (its 'latest') to resume from.")
    stop_after: int | None = Field(None, gt=0, description="End after this many steps with a checkpoint (a "
                                   "planned preemption: resume it later).")

    @model_validator(mode="after")
    def _offload_shards(self) -> LoopParams:
        if self.offload and self.strategy != "fsdp":
            raise ValueError("offload keeps FSDP's shards in CPU memory: set strategy: fsdp")
        return self

    def unsupported(self) -> str | None:
        """Why this stage cannot run as configured (checked before any work: exit 3); None when it can."""
        import os

        if self.strategy == "fsdp" and "WORLD_SIZE" not in os.environ:
            return ("trains under strategy fsdp only inside torchrun (one process too: torchrun --nproc-per-node 1 "
                    "-m llmx ...)")
        return None

    def loop_config(self, **overrides: Any):
        """The loop's ``TrainConfig`` for these params (``overrides`` win)."""
        from llmx.core.train.loop import TrainConfig

        values = dict(steps=self.steps, lr=self.lr, warmup=self.warmup, schedule=self.schedule,
                      min_lr_ratio=self.min_lr_ratio, decay_steps=round(self.decay_fraction * self.steps),
                      decay_shape=self.decay_shape, weight_decay=self.weight_decay, grad_clip=self.grad_clip,
                      grad_accum=self.grad_accum, precision=self.precision, checkpoint_every=self.checkpoint_every,
                      keep_checkpoints=self.keep_checkpoints, stop_after=self.stop_after)
        return TrainConfig(**{**values, **overrides})


class TrainParams(LoopParams):
    """A training stage that updates the model: the loop, plus an optional LoRA adapter and saving."""

    adapter: Literal["none", "lora"] = Field("none", description="none: train every weight; lora: train a LoRA "
                                             "adapter through PEFT (settings under lora).")
    lora: LoraParams = Field(default_factory=LoraParams)
    save: bool = Field(True, description="Save the trained model (or adapter) as a run artifact.")

    @model_validator(mode="after")
    def _pissa_saves_merged(self) -> TrainParams:
        if self.adapter == "lora" and self.lora.init == "pissa" and self.save and not self.lora.merge:
            raise ValueError("a PiSSA adapter rewrites its base weights, so its folder does not load on the original "
                             "base: set lora.merge=true (or save=false)")
        return self

    def requirements(self) -> tuple[str, ...]:
        """Python packages these params need (checked before the run: exit 3 when absent)."""
        return ("peft",) if self.adapter == "lora" else ()
