from llmx.core.compare.spec import Arm, ComparisonSpec
from llmx.core.models.archs import ATTENTION_KINDS
from llmx.core.spec import LayerSpec, MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec(
        name="clover", stages=(Stage.PRUNE,), impl="llmx.plugins.clover.method:prune",
        config="llmx.plugins.clover.config:CloverPruneParams",
        summary="CLOVER: per-head SVD of the Q-K and V-O products; prune head dims by singular value.",
        paper="Meng et al., ICML 2025 (arXiv 2411.17426)",
    )
    yield MethodSpec(
        name="clover", stages=(Stage.TRAIN,), impl="llmx.plugins.clover.finetune:finetune",
        config="llmx.plugins.clover.config:CloverTrainParams",
        summary="CLOVER fine-tuning: r x r cores between frozen orthonormal vectors, merged back; LoRA / PiSSA "
                "baselines at the same budget.",
        paper="Meng et al., ICML 2025 (arXiv 2411.17426)",
        aliases=("clover-train",),  # a name of its own: the comparison runner looks a stage's params up by name
    )


@hookimpl
def llmx_layers():
    yield LayerSpec("clover_attention", "llmx.plugins.clover.attention:rebuild", "attention with CLOVER-pruned head dimensions")


PAPER = "Meng et al., ICML 2025 (arXiv 2411.17426)"
KINDS = tuple(k for k in ATTENTION_KINDS if k not in ("phi3", "qwen3"))  # attention.py: no fused qkv, no q/k norms
HELD_OUT = {"method": "perplexity", "params": {"max_tokens": 16384}}  # the validation split, windows of 128, stride 64


def _prune(criterion: str, **params) -> Arm:
    """Pruning 70% of every pair the architecture allows (Q-K and V-O without RoPE, V-O with it), uniform per head."""
    name = criterion if params.get("mode") != "global" else f"{criterion}-global"
    return Arm(name, ({"method": "clover", "params": {"ratio": 0.7, "criterion": criterion, "save": False,
                                                       **params}},), family=name)


def _tune(name: str, lr: float, **params) -> Arm:
    """100 steps on the target corpus' windows, each tuner at the rate bench_clover.py picked on ref:gpt2 (transfer
    to pydoc); LoRA and PiSSA at the largest rank within the CLOVER cores' trainable parameters (their default)."""
    return Arm(name, ({"method": "clover-train", "params": {"steps": 100, "lr": lr, "save": False, **params}},),
               family=name)


@hookimpl
def llmx_comparisons():
    yield ComparisonSpec(
        name="clover-prune",
        summary="CLOVER's SVD pruning of 70% of the head dims (no training) against vanilla norm-product and "
                "activation-norm pruning of the same dims: held-out perplexity windows paired across arms.",
        paper=f"{PAPER}, Fig. 3 (GPT-2 perplexity against Q-K dims pruned, CLOVER vs vanilla pruning)",
        target="clover", baselines=("vanilla", "activation"),
        arms=(Arm("unpruned", family="unpruned"), _prune("vanilla"), _prune("activation"), _prune("clover"),
              _prune("clover", mode="global")),
        evaluation=HELD_OUT, cost="parameters", cost_key="params_after", tolerance=0.01, relative=True,
        quick={"max_tokens": 1024, "calib_windows": 2, "calib_seq_len": 32, "seq_len": 32},
        model="ref:gpt2", quick_model="ref:gpt2-test", kinds=KINDS, data={"source": "stdlib", "seq_len": 128})
    yield ComparisonSpec(
        name="clover-finetune",
        summary="CLOVER's singular-value fine-tuning (r x r cores between frozen orthonormal vectors) against LoRA "
                "and PiSSA at the same trainable parameters and steps, on a corpus the model was not trained on: "
                "held-out perplexity windows of that corpus paired across arms.",
        paper=f"{PAPER}, Table 3 (CLOVER against LoRA, DoRA, HiRA and PiSSA at matched trainable parameters)",
        target="clover", baselines=("lora", "pissa"),
        arms=(Arm("start", family="start"), _tune("raw-cores", 3e-2, basis="raw"), _tune("lora", 1e-2, tuner="lora"),
              _tune("pissa", 3e-3, tuner="pissa"), _tune("clover", 1e-2)),
        evaluation=HELD_OUT, cost="trainable parameters", cost_key="trainable_params", tolerance=0.05, relative=True,
        quick={"steps": 2, "warmup": 1, "eval_windows": 2, "max_tokens": 1024, "seq_len": 32},
        model="ref:gpt2", quick_model="ref:gpt2-test", kinds=KINDS, data={"source": "pydoc", "seq_len": 128})
