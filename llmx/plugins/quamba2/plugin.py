from llmx.core.compare.spec import Arm, ComparisonSpec
from llmx.core.spec import LayerSpec, MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec("quamba2", (Stage.QUANTIZE,), "llmx.plugins.quamba2.method:run", "llmx.plugins.quamba2.config:Quamba2Params",
                     summary="Quamba2: W8A8 / W4A8 / W4A16 for Mamba and Mamba2 (sort-and-cluster x, per-state-group "
                     "B/C, Hadamard rotations, GPTQ); recipe=quamba1|naive for the baselines.",
                     paper="Chiang et al., ICML 2025 (arXiv 2503.22879)", requires=("cupy",))


@hookimpl
def llmx_layers():
    yield LayerSpec("quamba2_mixer", "llmx.plugins.quamba2.mixers:rebuild", "W4A8/W8A8 Mamba mixer")
    yield LayerSpec("quamba2_head", "llmx.plugins.quamba2.head:QuantHead.rebuild", "packed lm_head (head-to-toe)")
    yield LayerSpec("quamba2_embedding", "llmx.plugins.quamba2.embedding:QuantEmbedding.rebuild", "group-quantized embedding")


def _recipe(bits: str, recipe: str) -> Arm:
    """One recipe at one format; every arm calibrates on the same windows (32 x 256 tokens of the run's data)."""
    return Arm(f"{recipe}-{bits}", ({"method": "quamba2", "params": {"bits": bits, "recipe": recipe, "save": False}},),
               family=recipe)


def _spec(bits: str, others: tuple[str, ...], name: str, summary: str) -> ComparisonSpec:
    """Quamba2 against Quamba1 and the naive per-tensor recipe at ``bits`` (judged); the same three at each of
    ``others`` and the float model drawn."""
    return ComparisonSpec(
        name=name, summary=summary,
        paper="Chiang et al., ICML 2025 (arXiv 2503.22879): the Mamba2 130M-8B rows at W8A8 and W4A8, Quamba2 "
              "against Quamba (the quamba1 recipe) and naive per-tensor static scales",
        target=f"quamba2-{bits}", baselines=(f"quamba1-{bits}", f"naive-{bits}"),
        arms=(Arm("float16", family="float", cost=16.0),
              *(_recipe(b, r) for b in (bits, *others) for r in ("naive", "quamba1", "quamba2"))),
        evaluation={"method": "perplexity", "params": {"max_tokens": 16384}},
        # sort-and-cluster and per-SSD-group B/C need Mamba2's SSD groups (on Mamba1 quamba2 is quamba1)
        kinds=("mamba2",),
        quick={"calib_samples": 2, "calib_seq_len": 64, "max_tokens": 512},
        model="ref:mamba2-bench", quick_model="ref:mamba2-test", data={"source": "stdlib", "seq_len": 128})


@hookimpl
def llmx_comparisons():
    yield _spec("w4a8", ("w8a8",), "quamba2",
                "Quamba2 (sort-and-cluster x, per-SSD-group B/C, Hadamard, GPTQ) against Quamba1 and naive per-tensor "
                "static W4A8 on a Mamba2 (W8A8 drawn): held-out perplexity windows paired across recipes.")
    yield _spec("w8a8", (), "quamba2-w8a8",
                "Quamba2 against Quamba1 and naive per-tensor static W8A8 on a Mamba2: held-out perplexity windows "
                "paired across recipes.")
