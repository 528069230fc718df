"""The Python API and the CLI measure the same thing (issue 66): the README's snippet path (load, evaluate, quantize
in place, evaluate) gives the figures of the same recipe on the command line, and its W4 figure is the quantized
model's (not the FP one again)."""

from __future__ import annotations

import yaml

STEPS = [{"method": "perplexity", "params": {"max_tokens": 512}},
         {"method": "gptq", "params": {"bits": "w4a16", "calib_samples": 4, "calib_seq_len": 64}},
         {"method": "perplexity", "params": {"max_tokens": 512}}]


def test_api_and_cli_give_the_same_perplexity_before_and_after_gptq(cli, tmp_path):
    import llmx

    model, tok = llmx.load("tiny:llama")
    fp = llmx.evaluate(model, tokenizer=tok, method="perplexity", max_tokens=512)
    model, quant = llmx.quantize(model, tokenizer=tok, method="gptq", bits="w4a16", calib_samples=4,
                                 calib_seq_len=64, save=False)
    w4 = llmx.evaluate(model, tokenizer=tok, max_tokens=512)
    assert quant["layers"] > 0 and w4["perplexity"] != fp["perplexity"]  # the quantized model was evaluated

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"name": "cmp", "model": "tiny:llama", "pipeline": STEPS}))
    r = cli("--json", "run", recipe, "-o", tmp_path / "runs")
    assert r.code == 0, r.err
    stages = r.json()["stages"]
    assert stages[0]["metrics"]["perplexity"] == fp["perplexity"]
    assert stages[2]["metrics"]["perplexity"] == w4["perplexity"]
    assert stages[0]["metrics"]["tokens"] == fp["tokens"] == w4["tokens"]
