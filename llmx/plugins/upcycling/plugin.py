from llmx.core.compare.spec import Arm, ComparisonSpec
from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl

PAPER = "Liew, Kato, Takase, ICML 2025 (arXiv 2502.03009)"


@hookimpl
def llmx_methods():
    yield MethodSpec("upcycle", (Stage.TRAIN,), "llmx.plugins.upcycling.method:run",
                     "llmx.plugins.upcycling.config:UpcycleParams",
                     summary="Sparse upcycling: a dense Llama/Qwen2 becomes a top-k MoE of FFN copies (logits "
                     "checked), then trained through the lm stage.", paper=PAPER)
    yield MethodSpec("upcycling-law", (Stage.ANALYZE,), "llmx.plugins.upcycling.analyze:run",
                     "llmx.plugins.upcycling.config:LawParams",
                     summary="The upcycling law L(D1, D2) with the D1xD2 interaction: fit, intervals, held-out "
                     "error, power, and budget guidance against MoE/dense from scratch.", paper=PAPER)


# bench_upcycling.py's phase 2: D2 = 244 steps of 32 x 128 tokens (1M), AdamW at a constant peak after 10 warmup
# steps, measured after a linear cooldown to 0 over the last 10% (wsd); 8 experts, top-2, Switch's 0.01 balancing.
# The MoE from scratch at its own rate (the best of 1e-3..8e-3 in bench_upcycling.py's sweep), the others at 2e-3.
PHASE = {"steps": 244, "batch_size": 32, "seq_len": 128, "warmup": 10, "schedule": "wsd", "decay_fraction": 0.1,
         "min_lr_ratio": 0.0, "weight_decay": 0.1, "eval_every": None, "save": False}
MOE = {"num_experts": 8, "top_k": 2, "aux_loss_coef": 0.01}


@hookimpl
def llmx_comparisons():
    yield ComparisonSpec(
        name="upcycling",
        summary="The dense model upcycled to an 8-expert top-2 MoE and trained D2 tokens, against the same MoE "
                "trained from scratch on the same tokens (the dense model trained on them drawn): held-out "
                "perplexity windows paired across arms.",
        paper=f"{PAPER}, Fig. 1 / Sec. 4 (upcycling against training the MoE from scratch at equal tokens)",
        target="upcycled", baselines=("moe-scratch",),
        arms=(Arm("start", family="dense", cost=0.0),
              Arm("dense-continued", ({"method": "lm", "params": {**PHASE, "lr": 2e-3}},), family="dense"),
              Arm("moe-scratch", ({"method": "upcycle", "params": {**PHASE, **MOE, "init": "scratch", "lr": 4e-3}},),
                  family="moe from scratch"),
              Arm("upcycled", ({"method": "upcycle", "params": {**PHASE, **MOE, "lr": 2e-3}},), family="upcycled")),
        evaluation={"method": "perplexity", "params": {"max_tokens": 16384}},
        cost="training tokens", cost_key="tokens_seen",
        quick={"steps": 3, "batch_size": 4, "seq_len": 32, "warmup": 1, "eval_windows": 2, "max_tokens": 1024,
               "num_experts": 4},
        kinds=("llama", "mistral", "qwen2"),
        model="ref:llama", data={"source": "stdlib", "seq_len": 128})
