from llmx.core.compare.spec import Arm, ComparisonSpec
from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl

PAPER = "Liu et al., ICML 2025 (arXiv 2506.00772)"


@hookimpl
def llmx_methods():
    yield MethodSpec("lift", (Stage.TRAIN,), "llmx.plugins.lift.method:run", "llmx.plugins.lift.config:LiftParams",
                     summary="LIFT: sparse fine-tuning of the principal weights (top-k of a rank-f SVD filter) at a "
                     "LoRA-sized budget; magnitude and random supports as baselines.",
                     paper=PAPER)


# bench_lift.py's recipe: 2,000 tracing programs, 3 epochs at batch 16 (375 steps), linear decay after a 3% warmup
# (the official schedule), loss on the answer only; the supports refresh every 100 steps. Each arm at the rate
# bench_lift.py picked for it on ref:llama-bench (validation exact match).
TRAIN = {"steps": 375, "batch_size": 16, "warmup": 11, "schedule": "linear", "min_lr_ratio": 0.0, "max_length": 64,
         "max_prompt_length": 60, "rank": 8, "update_interval": 100, "save": False}


def _arm(name: str, family: str, **params) -> Arm:
    return Arm(name, ({"method": "lift", "params": {**TRAIN, **params}},), family=family)


@hookimpl
def llmx_comparisons():
    yield ComparisonSpec(
        name="lift",
        summary="LIFT's principal-weight sparse fine-tuning against magnitude and random sparse fine-tuning at the "
                "same LoRA-rank-8 budget (dense fine-tuning of the same weights drawn beside them), on tracing "
                "programs: each held-out test program's greedy exact match paired across arms.",
        paper=f"{PAPER}, Tables 1-2 (LIFT against Full FT and sparse / low-rank PEFT at matched trainable parameters)",
        target="lift", baselines=("magnitude", "random"),  # dense trains ~5x the parameters: drawn, not judged
        arms=(_arm("dense", "dense (decoder linears)", mask="magnitude", rank=1_000_000, update_interval=0, lr=3e-4),
              _arm("random", "random support", mask="random", lr=1e-2),
              _arm("magnitude", "magnitude support", mask="magnitude", lr=1e-2),
              _arm("lift", "lift", lr=1e-2)),
        evaluation={"method": "tracing", "params": {"split": "test", "limit": 500}}, items="rows.jsonl",
        metric="score", higher_is_better=True, cost="trainable parameters", cost_key="trainable_params",
        tolerance=0.01, relative=True,
        quick={"tracing_rows": 32, "steps": 2, "batch_size": 4, "warmup": 0, "update_interval": 0, "limit": 8},
        model="ref:llama-bench", data={"source": "stdlib", "seq_len": 128}, corpus=False)
