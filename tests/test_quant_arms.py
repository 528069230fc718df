"""The quantization comparisons' arms: no judged baseline stores more bits per weight (codes, scales and zeros as
stored) than the target on the comparison model's widths, and GPTQ runs at its strongest setting (issue 67)."""

from __future__ import annotations

import copy

import pytest
import torch


@pytest.mark.parametrize("name", ["gptq", "quant", "guidedquant"])
def test_bits_are_matched_from_below_and_gptq_is_at_its_strongest(name):
    from transformers import AutoModelForCausalLM

    import llmx
    from llmx.core import models
    from llmx.core.models.archs import config
    from llmx.core.plugins import host
    from llmx.core.zoo.presets import PRESETS

    spec = host().comparison(name)
    arch, _, preset = spec.model.removeprefix("ref:").partition("-")
    shape = PRESETS[preset or "small"][arch]
    tok = models.load("tiny:llama")[1]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config(arch, len(tok), shape.hidden, layers=1, heads=shape.heads))

    def bits(arm: str) -> float:
        (stage,) = spec.arm(arm).stages
        calib = {"calib_samples": 2, "calib_seq_len": 32} if stage["method"] in ("gptq", "guidedquant") else {}
        if stage["method"] == "guidedquant":  # the stored format does not depend on how long LNQ searches
            calib |= {"iterations": 1, "cd_cycles": 1, "num_groups": 1}
        _, metrics = llmx.quantize(copy.deepcopy(model), tokenizer=tok, method=stage["method"],
                                   **{**stage["params"], **calib})
        return metrics["weight_bits_per_element"]

    target = bits(spec.target)
    assert {a: bits(a) <= target for a in spec.judged} == dict.fromkeys(spec.judged, True)
    gptq = [s["params"] for a in spec.arms for s in a.stages if s["method"] == "gptq"]
    assert gptq and all(p["actorder"] and p["true_sequential"] and not p["symmetric"] for p in gptq)
