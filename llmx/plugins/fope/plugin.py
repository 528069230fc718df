from llmx.core.compare.spec import Arm, ComparisonSpec
from llmx.core.spec import LayerSpec, MethodSpec, Stage
from llmx.hookspecs import hookimpl

PAPER = "Hua et al., ICML 2025 (arXiv 2412.17739)"


@hookimpl
def llmx_methods():
    yield MethodSpec("fope", (Stage.TRAIN,), "llmx.plugins.fope.method:train", "llmx.plugins.fope.config:FopeParams", paper=PAPER,
                     requires=("cupy",),
                     summary="FoPE: train a Llama-family model with Fourier position embedding (floor-clipped "
                     "frequencies, per-head Fourier series); position: rope | alibi as the baselines.")
    yield MethodSpec("length", (Stage.EVAL, Stage.ANALYZE), "llmx.plugins.fope.length:run",
                     "llmx.plugins.fope.config:LengthParams",
                     paper=PAPER, requires=("cupy",),
                     summary="Length generalisation: perplexity at 1x-8x the training length, loss by "
                     "position bucket, a copy probe; yarn_factor for RoPE + YaRN.")


@hookimpl
def llmx_layers():
    yield LayerSpec("fope_attention", "llmx.plugins.fope.attention:rebuild",
                    "Llama-family attention with FoPE tables or ALiBi biases")


# bench_fope.py's recipe (the official 60M config where it fits): the model's shape and tokenizer, weights drawn
# afresh, trained at T = 64 for 500 steps of 32 windows (the same data order per seed), AdamW 2e-3 after 50 warmup
# steps, cosine to 0.1x, weight decay 0.1.
TRAIN = {"init": "scratch", "train_len": 64, "batch_size": 32, "steps": 500, "lr": 2e-3, "warmup": 50,
         "schedule": "cosine", "min_lr_ratio": 0.1, "weight_decay": 0.1, "eval_windows": 32, "save": False}


def _arm(name: str, **position) -> Arm:
    return Arm(name, ({"method": "fope", "params": {**TRAIN, **position}},), family=name)


@hookimpl
def llmx_comparisons():
    yield ComparisonSpec(
        name="fope",
        summary="FoPE against RoPE and ALiBi trained from scratch on the same tokens at T = 64 (clip-only and "
                "Fourier-only ablations drawn): held-out windows of 8T, each window's mean NLL paired across arms.",
        paper=f"{PAPER}, Fig. 1 / Sec. 5 (perplexity as the window grows past the training length: FoPE against "
              "RoPE and ALiBi; Sec. 6 ablations)",
        target="fope", baselines=("rope", "alibi"),
        arms=(_arm("rope", position="rope"), _arm("alibi", position="alibi"),
              _arm("clip-only", position="fope", sigma=0.0), _arm("fourier-only", position="fope", floor_clip=False),
              _arm("fope", position="fope")),
        evaluation={"method": "length", "params": {"windows": 16, "copy_samples": 16}},
        cost="training tokens", cost_key="tokens_seen",
        kinds=("llama", "mistral", "qwen2"),  # attention.FAMILIES: the rotary step FoPE and ALiBi replace
        quick={"steps": 3, "warmup": 1, "batch_size": 4, "train_len": 16, "eval_windows": 2, "eval_every": 3,
               "max_tokens": 20000, "windows": 2, "copy_samples": 2},
        model="ref:llama-bench", data={"source": "stdlib", "seq_len": 64})
