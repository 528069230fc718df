from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl

PAPER = "Wei et al., ICML 2025 (arXiv 2504.07165)"


@hookimpl
def llmx_methods():
    yield MethodSpec("reper", (Stage.ALIGN,), "llmx.plugins.reper.method:align",
                     "llmx.plugins.reper.config:RPLParams", paper=PAPER,
                     summary="RePer's reflective unlikelihood on policy/critic dialogues (RPL), beside SFT on every "
                     "or the best answer, DPO and LiPO, on the same rows.")
    yield MethodSpec("reper", (Stage.ANALYZE,), "llmx.plugins.reper.method:build",
                     "llmx.plugins.reper.config:BuildParams", paper=PAPER, aliases=("reper-build",),
                     summary="Build reflection dialogues: 8 captions per scene, scored by a critic, worst to best "
                     "with its feedback between.")
    yield MethodSpec("reper", (Stage.DECODE,), "llmx.plugins.reper.method:decode",
                     "llmx.plugins.reper.config:TurnsParams", paper=PAPER, aliases=("reper-decode",),
                     summary="Multi-turn reflective inference: policy answers, critic replies, up to max_trials; "
                     "caption F1 and hallucination per turn.")


@hookimpl
def llmx_comparisons():
    from llmx.core.compare.spec import Arm, ComparisonSpec

    captioner = {"method": "llava", "params": {"stage": 2, "steps": 600, "lr": 1e-3, "batch_size": 16, "save": False,
                                               "keep": True, "eval_rows": 0,  # trained once per seed, all arms
                                               "scenes": {"count": 4000, "formats": {"caption": 1.0}}}}
    build = {"method": "reper-build", "stage": "analyze", "params": {"scenes": 2500}}
    budget = {"steps": 150, "lr": 2e-4, "batch_size": 8, "warmup": 7, "save": False}
    decode = {"method": "reper-decode", "stage": "decode", "params": {"scenes": 100, "max_trials": 3}}

    def trained(objective: str, feedback: str | None = None, **params) -> tuple[dict, ...]:
        """From the captioner, build the dialogues, train on them, answer in 3 turns; ``feedback`` the critic's in
        building and answering."""
        critic = {"feedback": feedback} if feedback else {}
        return (captioner, {**build, "params": {**build["params"], **critic}},
                {"method": "reper", "stage": "align", "params": {**budget, "objective": objective, **params}},
                {**decode, "params": {**decode["params"], **critic}})

    yield ComparisonSpec(
        name="reper",
        summary="RePer's reflective unlikelihood (RPL, alpha 8) against the base captioner (ref:llava after LLaVA "
                "stage 2 on English captions, 600 steps, in every arm: ref:llava itself captions nothing the critic "
                "scores above 1), SFT on every turn, SFT on "
                "the best caption, DPO and LiPO-lambda (both at a tenth of the rate, DPO's better tuning) on the same "
                "dialogues (the policy's own captions, 8 temperatures, the rule critic, gap 4) at the same steps and "
                "batch, and against RPL whose critic names only each error's kind (rpl-kind, in building and "
                "answering: its gap to rpl is what naming the answer in the feedback is worth): each held-out "
                "scene's caption F1 after 3 policy/critic turns with the rule critic.",
        paper="Wei et al., ICML 2025, README preference-method table (base, +DPO, +LiPO, +RPL) and turn-wise CAPTURE",
        target="rpl", baselines=("base", "sft-all", "sft-best", "dpo", "lipo", "rpl-kind"),
        arms=(Arm("base", (captioner, decode), family="base", cost=0.0),
              Arm("sft-all", trained("sft_all"), family="sft"),
              Arm("sft-best", trained("sft_best"), family="sft-best"),
              Arm("dpo", trained("dpo", lr=2e-5), family="dpo"),
              Arm("lipo", trained("lipo", lr=2e-5), family="lipo"),
              Arm("rpl", trained("rpl", alpha=8.0), family="rpl"),
              Arm("rpl-kind", trained("rpl", "kind", alpha=8.0), family="rpl-kind")),
        evaluation=None,  # each arm answers with its own critic (rpl-kind's names no object)
        items="items.jsonl", metric="final_f1", higher_is_better=True,
        cost="optimizer steps after the captioner", cost_key="reper.steps",
        quick={"reper-build.scenes": 6, "reper-decode.scenes": 6, "llava.scenes": {"count": 16, "formats": {
            "caption": 1.0}}, "candidates": "corrupt", "temperatures": [0.0, 0.6, 1.2], "max_new_tokens": 24,
               "steps": 2, "batch_size": 2, "max_trials": 2},  # a test-preset captioner's own captions all score 1
        model="ref:llava", quick_model="ref:llava-test", kinds=("llava",),
        data={"source": "stdlib", "seq_len": 128}, corpus=False)
