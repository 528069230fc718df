from llmx.core.compare.spec import Arm, ComparisonSpec
from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec("overtraining", (Stage.ANALYZE,), "llmx.plugins.overtraining.method:run",
                     "llmx.plugins.overtraining.config:OvertrainingParams",
                     summary="Catastrophic overtraining over a checkpoint series: Gaussian sensitivity S(T, gamma), "
                     "fine-tuning forgetting at fixed rates, turning points T*.",
                     paper="Springer et al., ICML 2025 (arXiv 2503.19206)")


# The controlled study (§3, bench_overtraining.py's recipe): the model's shape and tokenizer pre-trained from scratch
# on the standard-library corpus at a constant rate after 50 warmup steps (so the shorter budget is a checkpoint of
# the longer run: the same data order and rates up to it), batch 32 x 128; then both fine-tuned the same way (100
# steps of 8 x 128 on the pydoc prose, constant 1e-3 after 10 warmup steps) and scored on held-out pre-training text.
PRETRAIN = {"init": "scratch", "batch_size": 32, "seq_len": 128, "lr": 2e-3, "warmup": 50, "schedule": "constant",
            "weight_decay": 0.1, "eval_every": None, "save": False}
FINETUNE = {"method": "lm", "params": {"data": "pydoc", "steps": 100, "batch_size": 8, "seq_len": 128, "lr": 1e-3,
                                       "warmup": 10, "schedule": "constant", "weight_decay": 0.0, "eval_every": None,
                                       "save": False}}


def _arm(name: str, steps: int) -> Arm:
    return Arm(name, ({"method": "lm", "params": {**PRETRAIN, "steps": steps}}, FINETUNE), family="pre-trained")


@hookimpl
def llmx_comparisons():
    yield ComparisonSpec(
        name="overtraining",
        summary="Catastrophic overtraining: the same recipe pre-trained 4x longer against its 1x checkpoint, both "
                "fine-tuned identically on another corpus, then scored on held-out pre-training text (behind: "
                "the longer pre-training forgot more): perplexity windows paired across arms.",
        paper="Springer et al., ICML 2025 (arXiv 2503.19206), Sec. 3 / Fig. 3 (pre-training loss after fine-tuning "
              "with a fixed recipe, against the pre-training budget)",
        target="4x", baselines=("1x",),
        arms=(_arm("1x", 1000), _arm("4x", 4000)),
        evaluation={"method": "perplexity", "params": {"max_tokens": 16384}},
        cost="pre-training tokens", cost_key="tokens_seen",
        quick={"steps": 3, "warmup": 1, "batch_size": 4, "seq_len": 32, "max_tokens": 1024},
        model="ref:llama-bench", data={"source": "stdlib", "seq_len": 128})
