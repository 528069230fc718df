"""Parameters of ``analyze --method prosec`` (the pairs), ``align --method prosec`` (preference learning on them) and
``eval --method secure-code`` (vulnerable rates). No torch import here: method listings load this module."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from llmx.core.refs import DataFile, DataSource
from llmx.core.spec import Params
from llmx.core.train.align.params import AlignParams
from llmx.core.train.params import TrainParams

HABITS = "code-habits"  # SafeCoder's data drawn from the habit corpus's generator
KNOWN = (78, 89, 502, 338, 327, 377, 295)  # the elicitors in cwes.py


def _known(value: list[int]) -> list[int]:
    bad = [c for c in value if c not in KNOWN]
    if bad or not value:
        raise ValueError(f"no elicitor for CWE-{', CWE-'.join(map(str, bad)) or '(none given)'}; known: "
                         f"{', '.join(map(str, KNOWN))}")
    return value


class Sampling(Params):
    samples: int = Field(20, ge=1, description="Completions per scenario (official 20).")
    temperature: float = Field(0.8, gt=0, description="Sampling temperature (official 0.8).")
    completion: Literal["statement", "function"] = Field(
        "statement", description="What the model writes after a scenario's statement start (``cursor.execute(``): "
        "that statement only, cut at the end of its logical line (brackets balanced), or the rest of the function, "
        "cut at the function's end (the paper's whole answers). Either is parsed and scanned by bandit as part of "
        "the whole program (imports, signature, docstring). Statement is the default because it is what makes the "
        "pipeline measurable on a model this machine builds: a small model's whole-function completions mostly do not "
        "parse, and an unparsed sample never counts as vulnerable or yields a pair. Fixes are written the same way; "
        "benign answers are always whole functions.")
    max_new_tokens: int = Field(96, gt=0, description="Tokens per completion (official 1024 for a whole answer; the "
                                "completion is then cut as ``completion`` says).")
    batch_size: int = Field(16, gt=0)


class ProsecParams(Sampling):
    """The pairs ``{prompt, chosen, rejected, cwe, benign}`` from the train split's standard-library seeds."""

    cwes: list[int] = Field([78, 89, 502, 338], description="Python CWEs (elicitors: 78, 89, 502, 338, 327, 377, 295).")
    scenarios: int = Field(32, ge=1, description="Scenarios per CWE, one per KMeans cluster of the model's mean "
                           "hidden states (official 2,000).")
    seeds: int | None = Field(None, ge=1, description="Seed functions to splice (default: every train seed).")
    fix_samples: int = Field(4, ge=0, description="Fixes the model samples per vulnerable response (the rule-based "
                             "rewrite is tried only when none of them survives the filters).")
    utility: bool = Field(True, description="Mix in one utility pair per security pair (ProSec without them: false).")
    roles: Literal["paper", "swapped"] = Field("paper", description="Utility pairs: chosen = the model's own benign "
                                               "answer, rejected = the fixed code (paper: the notes' reading of the "
                                               "field names); swapped inverts them.")
    mix_seed: int = Field(42, description="The shuffle of the mixed rows (official 42).")

    _cwes = field_validator("cwes")(_known)


class SecureCodeParams(Sampling):
    """Vulnerable rates on scenarios from the held-out (validation) split's seeds, inducing and benign."""

    cwes: list[int] = Field([78, 89, 502, 338], description="Python CWEs to measure.")
    scenarios: int = Field(16, ge=1, description="Held-out scenarios per CWE.")
    samples: int = Field(10, ge=1, description="Completions per scenario.")

    _cwes = field_validator("cwes")(_known)


class ProsecAlignParams(AlignParams):
    """Preference learning on ProSec's pairs (``{prompt, chosen, rejected, cwe, benign}`` rows): SimPO by default, a
    recalled choice (the notes could not check the paper's objective), DPO or ConfPO (SimPO on the tokens below the
    response's mean probability) as options."""

    data: DataFile | None = Field(None, description="ProSec's pairs (.jsonl); default: the pairs of the run's "
                                  "latest analyze --method prosec.")
    empty: Literal["error", "skip"] = Field("error", description="No pairs to train on (a small model writes no "
                                            "parseable vulnerable code): error, or skip (the model is left as it is "
                                            "and the stage reports 0 steps).")
    loss: Literal["simpo", "dpo", "confpo"] = Field("simpo", description="The preference objective.")
    beta: float | None = Field(None, gt=0, description="Default by loss: 2.0 (simpo), 0.1 (dpo), 1.5 (confpo, its "
                               "official default).")
    gamma: float | None = Field(None, ge=0, description="Target margin of simpo and confpo; default 0.5 (simpo), 1.6 "
                                "(confpo).")

    @property
    def scale(self) -> float:
        return self.beta if self.beta is not None else {"simpo": 2.0, "dpo": 0.1, "confpo": 1.5}[self.loss]

    @property
    def margin(self) -> float:
        return self.gamma if self.gamma is not None else {"simpo": 0.5, "dpo": 0.0, "confpo": 1.6}[self.loss]


class SafeCoderParams(TrainParams):
    """SafeCoder-style security tuning (He & Vechev, 2024), ProSec's previous-work baseline: likelihood on the fixed
    functions, unlikelihood on the vulnerable functions' changed spans, mixed with ordinary code."""

    data: DataSource = Field("code-habits", description="SVEN-format pairs: a folder of cwe-*.jsonl or one file "
                             "(func_src_before, func_src_after, char_changes, file_name, vul_type; Python rows only), "
                             "or code-habits: functions of ref:llama-code's habit corpus written weak and then safe "
                             "(``habit_pairs`` of them, train seeds). SVEN (He & Vechev's curated fixes) is not "
                             "shipped.")
    habit_pairs: int = Field(1000, ge=1, description="Fix pairs drawn when data is code-habits.")
    cwes: list[int] = Field(list(KNOWN), description="The CWEs of the code-habits pairs (SVEN's rows are all kept).")
    likelihood: Literal["all", "changed"] = Field("all", description="Tokens of the fixed function trained: all of "
                                                  "them, or only its changed spans (SafeCoder's own masking).")
    ordinary: float = Field(1.0, ge=0, description="Ordinary standard-library functions per pair (1:1).")
    max_length: int = Field(384, gt=8, description="Tokens per function (longer ones are cut; a vulnerable function "
                            "whose changed spans fall past the cut keeps no unlikelihood tokens and is dropped).")
    batch_size: int = 8
    steps: int = 200
    lr: float = 1e-4

    _cwes = field_validator("cwes")(_known)

    @field_validator("data")
    @classmethod
    def _pairs(cls, value: str) -> str:
        """Of the datasets, only code-habits holds fix pairs (a path is checked, and rebased, as a referring field)."""
        from llmx.core.plugins import host

        if value != HABITS and value in host().datasets:
            raise ValueError(f"{value} is a text corpus, not fix pairs: give a SVEN folder or file, or {HABITS}")
        return value

