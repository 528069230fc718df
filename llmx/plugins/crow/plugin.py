from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl


@hookimpl
def llmx_methods():
    yield MethodSpec("crow", (Stage.TRAIN,), "llmx.plugins.crow.method:run", "llmx.plugins.crow.config:CrowParams",
                     summary="CROW: backdoor removal by fine-tuning on a few clean rows with an adversarial "
                     "layer-consistency regulariser (FGSM on the input embeddings).",
                     paper="Min et al., ICML 2025 (arXiv 2411.12768)")


LENGTHS = {"max_length": 192, "max_prompt_length": 160, "save": False}
PLANT = ({"method": "backdoor", "stage": "analyze", "params": {}},
         {"method": "backdoor-train", "stage": "train",
          "params": {"rows": "poisoned", "lr": 1e-3, "batch_size": 8, "grad_accum": 1, **LENGTHS}})
# the implant: 5 epochs of LoRA SFT on 2,000 rows, 20% poisoned, at 1e-3 (bench_crow's kept schedule: the official
# 2e-4 leaves ASR 0.13 at this scale); in one run its adapter is merged before the defence adds its own


@hookimpl
def llmx_comparisons():
    from llmx.core.compare.spec import Arm, ComparisonSpec

    yield ComparisonSpec(
        name="crow",
        summary="CROW against plain LoRA fine-tuning on the same 100 clean rows at the same budget (the official "
                "LoRA recipe: lr 1e-3, 5 epochs, 2 x 4 rows a step), after a planted code-injection backdoor (LoRA, "
                "5 epochs at 1e-3 on 20% poisoned rows): attack success on held-out triggered prompts, paired per "
                "prompt.",
        paper="Min et al., ICML 2025, Tables 1-3 (ASR after CROW vs the fine-tuning defence; backdoored model as "
              "reference)",
        target="crow", baselines=("sft",),
        arms=(Arm("backdoored", PLANT, family="no defence", cost=0.0),
              Arm("sft", (*PLANT, {"method": "backdoor-train", "stage": "train", "params": {"rows": "defence", **LENGTHS}}),
                  family="sft", cost=5.0),
              Arm("crow", (*PLANT, {"method": "crow", "params": dict(LENGTHS)}), family="crow", cost=5.0)),
        evaluation={"method": "backdoor-eval", "stage": "eval", "params": {"batch_size": 16}},
        items="rows.jsonl", metric="asr", higher_is_better=False,
        cost="defence epochs on the clean rows", cost_key=None, tolerance=0.0,
        quick={"train": 32, "defence": 8, "test": 8, "steps": 3, "batch_size": 4, "grad_accum": 1},
        model="ref:llama-bench", quick_model="ref:llama-test-4l",
        quick_zoo={"arch": "llama", "preset": "test", "layers": 4, "steps": 60, "name": "llama-test-4l"},
        data={"source": "stdlib", "seq_len": 128}, corpus=False)
