"""Built-in plugins, one package per technique. This list is explicit: nothing is discovered by scanning."""

BUILTIN = (
    "llmx.plugins.builtin_models",
    "llmx.plugins.rtn.plugin",
    "llmx.plugins.gptq.plugin",
    "llmx.plugins.blockfp.plugin",
    "llmx.plugins.blockdialect.plugin",
    "llmx.plugins.guidedquant.plugin",
    "llmx.plugins.bnb.plugin",
    "llmx.plugins.train_stages.plugin",
    "llmx.plugins.clover.plugin",
    "llmx.plugins.align_baselines.plugin",
    "llmx.plugins.pipa.plugin",
    "llmx.plugins.confpo.plugin",
    "llmx.plugins.tasks.plugin",
    "llmx.plugins.lexico.plugin",
    "llmx.plugins.quamba2.plugin",
    "llmx.plugins.evals.plugin",
    "llmx.plugins.export.plugin",
    "llmx.plugins.llava.plugin",
    "llmx.plugins.lift.plugin",
    "llmx.plugins.overtraining.plugin",
)
