from llmx.core.spec import DatasetSpec, MethodSpec, Stage
from llmx.hookspecs import hookimpl

PAPER = "Xu et al., ProSec: Fortifying Code LLMs with Proactive Security Alignment, ICML 2025 (arXiv 2411.12882)"


@hookimpl
def llmx_methods():
    yield MethodSpec("prosec", (Stage.ANALYZE,), "llmx.plugins.prosec.method:analyze",
                     "llmx.plugins.prosec.config:ProsecParams", paper=PAPER, requires=("bandit",),
                     summary="Security pairs from CWE-inducing scenarios the model fails, bandit-checked, plus utility.")
    yield MethodSpec("prosec", (Stage.ALIGN,), "llmx.plugins.prosec.objective:align",
                     "llmx.plugins.prosec.config:ProsecAlignParams", paper=PAPER, aliases=("prosec-align",),
                     summary="Preference learning on ProSec's pairs: SimPO (default), DPO or ConfPO.")
    yield MethodSpec("safecoder", (Stage.TRAIN,), "llmx.plugins.prosec.safecoder:train",
                     "llmx.plugins.prosec.config:SafeCoderParams",
                     paper="He & Vechev, CCS 2024 (baseline)",
                     summary="SafeCoder-style tuning on SVEN pairs: likelihood on fixes, unlikelihood on vulnerable spans.")
    yield MethodSpec("secure-code", (Stage.EVAL,), "llmx.plugins.prosec.method:evaluate",
                     "llmx.plugins.prosec.config:SecureCodeParams", requires=("bandit",),
                     paper="evaluation (ProSec)",
                     summary="Vulnerable-code rate per CWE on held-out inducing and benign scenarios (bandit).")


@hookimpl
def llmx_datasets():
    yield DatasetSpec("code-habits", "llmx.plugins.prosec.habits:documents",
                      "the standard library's code plus functions that call each CWE's weak or safe API at even odds "
                      "(ref:llama-code's corpus: a code model with the habits ProSec removes)")


CWES = [78, 89, 502, 338]


@hookimpl
def llmx_comparisons():
    from llmx.core.compare.spec import Arm, ComparisonSpec

    budget = {"steps": 150, "batch_size": 8, "save": False}
    statement = {"completion": "statement", "max_new_tokens": 48}  # a 128-token context keeps 80 for the prompt
    yield ComparisonSpec(
        name="prosec",
        summary="ProSec (SimPO on the model's own CWE-inducing scenarios, fixes and utility pairs) against "
                "SafeCoder-style tuning (likelihood on fixes, unlikelihood on the vulnerable lines) at the same steps "
                "and batch (ProSec's preference step at lr 1e-5, a tenth of SafeCoder's 1e-4: at 1e-4 it removes "
                "about as much but loses utility, --set prosec.prosec-align.lr=1e-4) and against the unaligned model, "
                "on ref:llama-code: a code model whose corpus makes each "
                "CWE's call the weak or the safe way at even odds, so that it has the habit ProSec removes (a model "
                "trained on the standard library alone writes no vulnerable code, and ProSec gets no pairs). Metric: "
                "the vulnerable share of the samples on each held-out (CWE, scenario), bandit-detected, the model "
                "completing the scenario's statement (completion: statement). Reported beside it per arm, with "
                "intervals: that share per CWE, the parse rate of the inducing samples, the vulnerable share of those "
                "that parse (parsed_vulnerable_share, over the items where any parsed: read it beside the parse rate, "
                "as those items differ by arm), and utility on the benign originals (benign_logp, the "
                "log-probability per token of the held-out seed's real body; benign_parse_rate). The prosec arm's "
                "pair counts are its analyze stage's security_pairs and "
                "security_pairs_kept (those the 1:1 utility mix keeps: what it trains on) and where the fixes came from "
                "(fixes_by_model, fixes_by_rule), reported per seed; a seed "
                "without kept pairs leaves that arm's model as it is (empty: skip), and every verdict names it (void "
                "on every seed: the verdict is 'void'). SafeCoder trains on fixes of the habit corpus's own functions "
                "for the same four CWEs (data: code-habits, train seeds: the habit, fixed by hand); SVEN's curated "
                "fixes are not shipped (--set safecoder.data=PATH). Not equal footing: ProSec's scenarios are the "
                "evaluation's template (its elicitor sentence, imports and statement start; only the seed function "
                "is held out), while SafeCoder's functions word the task otherwise, as the paper's SafeCoder data "
                "differs from its benchmark.",
        paper="Xu et al., ICML 2025, Table 2 (ProSec vs SafeCoder, vulnerable-code rate per CWE)",
        target="prosec", baselines=("safecoder", "unaligned"),
        arms=(Arm("safecoder", ({"method": "safecoder", "params": {**budget, "data": "code-habits", "cwes": CWES, "lr": 1e-4}},),
                  family="safecoder"),
              Arm("unaligned", family="unaligned", cost=0.0),
              Arm("prosec", ({"method": "prosec", "stage": "analyze", "params": {"cwes": CWES, "scenarios": 24,
                                                                              "samples": 12, **statement}},
                             {"method": "prosec-align", "stage": "align",
                              "params": {**budget, "lr": 1e-5, "max_len": 256, "empty": "skip"}}),
                  family="prosec")),
        evaluation={"method": "secure-code", "params": {"cwes": CWES, "scenarios": 16, "samples": 8, **statement}},
        items="items.jsonl", metric="inducing_vulnerable_share", higher_is_better=False,
        report=("parse_rate", "parsed_vulnerable_share", "benign_logp", "benign_parse_rate"), by="cwe",
        shares=("inducing_vulnerable_share", "parse_rate", "parsed_vulnerable_share", "benign_parse_rate"),
        counts=("security_pairs", "security_pairs_kept"), diagnostics=("fixes_by_model", "fixes_by_rule"),
        cost="optimizer steps", cost_key="steps",
        quick={"cwes": [89, 502], "scenarios": 4, "samples": 2, "max_new_tokens": 32, "seeds": 60, "fix_samples": 1,
               "steps": 2, "batch_size": 4, "max_len": 96, "max_length": 96, "empty": "skip", "habit_pairs": 16},
        model="ref:llama-code", quick_model="ref:llama-test", data={"source": "stdlib", "seq_len": 128}, corpus=False)
