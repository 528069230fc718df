from llmx.core.spec import MethodSpec, Stage
from llmx.hookspecs import hookimpl

PAPER = "Xu et al., ProSec: Fortifying Code LLMs with Proactive Security Alignment, ICML 2025 (arXiv 2411.12882)"


@hookimpl
def llmx_methods():
    yield MethodSpec("prosec", (Stage.ANALYZE,), "llmx.plugins.prosec.method:analyze",
                     "llmx.plugins.prosec.config:ProsecParams", paper=PAPER,
                     summary="Security pairs from CWE-inducing scenarios the model fails, bandit-checked, plus utility.")
    yield MethodSpec("prosec", (Stage.ALIGN,), "llmx.plugins.prosec.objective:align",
                     "llmx.plugins.prosec.config:ProsecAlignParams", paper=PAPER,
                     summary="Preference learning on ProSec's pairs: SimPO (default), DPO or ConfPO.")
    yield MethodSpec("safecoder", (Stage.TRAIN,), "llmx.plugins.prosec.safecoder:train",
                     "llmx.plugins.prosec.config:SafeCoderParams",
                     paper="He & Vechev, CCS 2024 (baseline)",
                     summary="SafeCoder-style tuning on SVEN pairs: likelihood on fixes, unlikelihood on vulnerable spans.")
    yield MethodSpec("secure-code", (Stage.EVAL,), "llmx.plugins.prosec.method:evaluate",
                     "llmx.plugins.prosec.config:SecureCodeParams",
                     paper="evaluation (ProSec)",
                     summary="Vulnerable-code rate per CWE on held-out inducing and benign scenarios (bandit).")
