"""Packed storage and QuantLinear: exact packing, layer math, W8A8 integer path, save -> reload -> same figures."""

from __future__ import annotations

import pytest
import torch

from llmx.core.quant.formats import IntFormat, dequantize, quantize
from llmx.core.quant.packing import pack, unpack
from llmx.core.quant.qlinear import QuantLinear, quantize_activation


@pytest.mark.parametrize("bits", range(1, 9))
def test_pack_round_trip_and_density(bits):
    codes = torch.randint(-(2 ** (bits - 1)), 2 ** (bits - 1), (5, 37))
    packed = pack(codes, bits, offset=2 ** (bits - 1))
    assert packed.dtype == torch.uint8 and packed.shape[-1] == 5 * bits  # 40 padded codes -> 5 * bits bytes
    assert torch.equal(unpack(packed, bits, 37, offset=2 ** (bits - 1)), codes.to(torch.int16))


def test_int4_layout_is_two_per_byte_low_nibble_first():
    assert pack(torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]]), 4).tolist() == [[0x21, 0x43, 0x65, 0x87]]
    with pytest.raises(ValueError):
        pack(torch.tensor([[16]]), 4)


@pytest.mark.parametrize("fmt", [IntFormat(4, 64), IntFormat(3, None, False), IntFormat(2, 32), IntFormat(4, 0)])
def test_quant_linear_computes_with_its_dequantized_weight(fmt):
    torch.manual_seed(0)
    lin = torch.nn.Linear(200, 48)
    codes, scale, zero = quantize(lin.weight.data, fmt)
    q = QuantLinear.from_codes(lin, codes, scale, zero, fmt)
    x = torch.randn(3, 5, 200)
    w = dequantize(codes, scale.half().float(), zero, fmt.group_size)
    assert torch.allclose(q(x), torch.nn.functional.linear(x, w, lin.bias), atol=1e-5)
    assert q.qweight.numel() == 48 * 25 * fmt.bits  # dense packing


def test_w8a8_integer_matmul_equals_simulated_quantization():
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 64)
    fmt = IntFormat(8, None)
    codes, scale, zero = quantize(lin.weight.data, fmt)
    q = QuantLinear.from_codes(lin, codes, scale, zero, fmt, act_bits=8)
    x = torch.randn(9, 256)
    xq, sx = quantize_activation(x, 8, None)
    simulated = torch.nn.functional.linear(xq * sx, dequantize(codes, scale.half().float(), zero, None), lin.bias)
    assert torch.allclose(q(x), simulated, atol=1e-4)
    assert q.qweight.dtype == torch.int8


@pytest.mark.parametrize("method,bits", [("rtn", "w4a16"), ("rtn", "w8a8"), ("gptq", "w3a16"), ("bnb", "w4a16"),
                                         ("bnb", "w8a8")])
def test_saved_model_reloads_and_evaluates_identically(cli, tmp_path, method, bits):
    r = cli("--json", "quantize", "--method", method, "--bits", bits, "--model", "ref:llama-test", "--eval", "perplexity",
            "--set", "perplexity.max_tokens=1024", *(["--set", "calib_samples=8"] if method == "gptq" else []),
            "-o", tmp_path / "q")
    assert r.code == 0, r.err
    start, quant, ppl = (r.json()["stages"][i]["metrics"] for i in range(3))
    ppl = ppl["perplexity"]
    assert start["perplexity"] != ppl  # the starting model is scored before the stage, beside the result
    assert quant["stored_weight_bytes"] > 0
    again = cli("--json", "eval", "--method", "perplexity", "--model", quant["model_dir"], "--set", "max_tokens=1024",
                "-o", tmp_path / "e")
    assert again.code == 0, again.err
    # bitsandbytes serialises its double-quantized statistics slightly rounded, so its reload differs in the 5th digit
    assert again.json()["stages"][0]["metrics"]["perplexity"] == pytest.approx(ppl, rel=1e-3 if method == "bnb" else 1e-6)


def test_w4_group128_takes_about_a_quarter_of_fp16():
    lin = torch.nn.Linear(512, 256)
    fmt = IntFormat(4, 128)
    q = QuantLinear.from_codes(lin, *quantize(lin.weight.data, fmt), fmt)
    stored = q.qweight.nbytes + q.scales.nbytes
    assert stored / (2 * 512 * 256) <= 0.27


def test_corrupted_quantized_folder_is_a_usage_error(cli, tmp_path):
    r = cli("--json", "quantize", "--method", "rtn", "--model", "tiny:llama", "-o", tmp_path / "q")
    folder = r.json()["stages"][0]["metrics"]["model_dir"]
    import json
    from pathlib import Path

    meta = Path(folder) / "llmx.json"
    data = json.loads(meta.read_text())
    data["llmx_modules"]["model.layers.0.mlp.up_proj"]["bits"] = 3  # spec no longer matches the tensors
    meta.write_text(json.dumps(data))
    from llmx.core import manifest

    manifest.write(Path(folder), manifest.SAVED)  # past the checksums: the spec check itself must catch it
    bad = cli("eval", "--method", "perplexity", "--model", folder, "-o", tmp_path / "e")
    assert bad.code == 2 and "does not match its stored spec" in bad.err


def test_a_saved_model_never_picks_the_code_that_loads_it(cli, tmp_path, capsys):
    import json
    import sys
    from pathlib import Path

    r = cli("--json", "quantize", "--method", "rtn", "--model", "tiny:llama", "-o", tmp_path / "q")
    folder = Path(r.json()["stages"][0]["metrics"]["model_dir"])
    meta = folder / "llmx.json"
    good = json.loads(meta.read_text())
    layer = "model.layers.0.mlp.up_proj"
    assert good["llmx_modules"][layer]["layer"] == "quant_linear"
    legacy = json.loads(meta.read_text())  # saved before layers were named: a registered builder still loads
    for spec in legacy["llmx_modules"].values():
        spec["builder"] = "llmx.core.quant.qlinear:QuantLinear.rebuild"
        del spec["layer"]
    meta.write_text(json.dumps(legacy))
    from llmx.core import manifest

    manifest.write(folder, manifest.SAVED)  # a crafted folder comes with a matching manifest: the builder check must hold alone
    assert cli("eval", "--method", "perplexity", "--model", folder, "--set", "max_tokens=256", "-o", tmp_path / "e").code == 0
    sys.modules.pop("this", None)
    for field, value, message in (("builder", "this:s", "no installed plugin registers"),
                                  ("layer", "evil", "provided by no installed plugin")):
        crafted = json.loads(json.dumps(legacy))
        crafted["llmx_modules"][layer] = {k: v for k, v in crafted["llmx_modules"][layer].items() if k != "builder"}
        crafted["llmx_modules"][layer][field] = value
        meta.write_text(json.dumps(crafted))
        manifest.write(folder, manifest.SAVED)
        bad = cli("eval", "--method", "perplexity", "--model", folder, "-o", tmp_path / "e")
        assert bad.code == 2 and message in bad.err, bad.err
        assert "this" not in sys.modules and "Beautiful is better" not in bad.out  # nothing imported, nothing ran


def test_flipped_packed_codes_are_found_on_load(cli, tmp_path):
    from pathlib import Path

    r = cli("--json", "quantize", "--method", "rtn", "--model", "tiny:llama", "-o", tmp_path / "q")
    folder = Path(r.json()["stages"][0]["metrics"]["model_dir"])
    assert (folder / "llmx-manifest.json").is_file()
    assert cli("eval", "--method", "perplexity", "--model", folder, "--set", "max_tokens=256", "-o", tmp_path / "a").code == 0
    weights = folder / "model.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-64] ^= 0x0F  # a packed code in the last tensor: the file still parses
    weights.write_bytes(bytes(blob))
    r = cli("eval", "--method", "perplexity", "--model", folder, "-o", tmp_path / "b")
    assert r.code == 2 and "model.safetensors does not match its checksum" in r.err
