from llmx.core.compare.spec import Arm, ComparisonSpec
from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl

PAPER = "Aglietti et al., ICML 2025 (PMLR 267:639-661)"


@hookimpl
def llmx_methods():
    yield MethodSpec("funbo", (Stage.ANALYZE,), "llmx.plugins.funbo.method:analyze", "llmx.plugins.funbo.config:FunboParams",
                     summary="FunBO: evolve a Bayesian-optimisation acquisition function as code (FunSearch's islands "
                     "and prompt, a sandboxed BO evaluator); samplers hf, openai, or offline: mutation, or scripted textbook "
                     "AFs (neither is a model).", paper=PAPER)
    yield MethodSpec("acquisition", (Stage.EVAL,), "llmx.plugins.funbo.method:acquisition",
                     "llmx.plugins.funbo.config:AcquisitionParams",
                     summary="Score an acquisition function (a .py file or EI, UCB, PI, mean, MES, random) by BO on "
                     "a function set: normalised regret, FunBO's score, paired wins and a Wilcoxon p.",
                     paper="evaluation")


# OOD-Bench's test set: 9 functions x 50 seeded scale/shift instances none of the search saw (it trains on 1-D Ackley,
# Levy and Schwefel and validates on shifted 1-D Rosenbrock and Rastrigin). Every arm runs the same GP, grid, initial
# point and T; MES through BoTorch (qMaxValueEntropy, about 8 s a 2-D problem on one CPU thread).
TEST = {"functions": "ood-test", "instances": 50, "instance_seed": 1000, "against": None}
SEARCH = {"samples": 160, "islands": 4}


def _score(af: str) -> dict:
    return {"method": "acquisition", "params": {"af": af, **TEST}}


@hookimpl
def llmx_comparisons():
    yield ComparisonSpec(
        name="funbo",
        summary="The acquisition function FunBO finds against EI, UCB, PI, the posterior mean, MES and random "
                "search, and against the "
                "same search choosing among textbook AFs: final normalised regret per held-out OOD-Bench problem at "
                "T = 30. No LLM writes programs here: funbo's sampler is the offline AST mutator (--set "
                "funbo.sampler=hf for a model), funbo-scripted's proposes textbook EI, PI, LCB and variance AFs.",
        paper="Aglietti et al., ICML 2025, Fig. 3 (OOD-Bench: the OOD AF against EI, UCB, PI, MEAN, random; MES is "
              "this comparison's addition)",
        target="funbo", baselines=("ei", "ucb", "pi", "mean", "mes", "random", "funbo-scripted"),
        arms=(Arm("funbo", ({"method": "funbo", "params": SEARCH}, _score("found"))),
              Arm("funbo-scripted", ({"method": "funbo", "params": {**SEARCH, "sampler": "scripted"}},
                                     _score("found")), family="funbo, scripted textbook AFs"),
              *(Arm(af, (_score(af),), family=af) for af in ("ei", "ucb", "pi", "mes", "mean", "random"))),
        evaluation=None, items="problems.jsonl", metric="final_regret", higher_is_better=False,
        cost="BO trials", cost_key="trials",
        quick={"samples": 1, "samples_per_prompt": 1, "islands": 2, "train": "ackley-1d", "grid_points": 64,
               "functions": "branin,sphere-2d", "instances": 2, "trials": 10},
        model="ref:llama-test", data={"source": "stdlib", "seq_len": 64}, corpus=False)
