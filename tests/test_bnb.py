"""bitsandbytes as a baseline: the stage reports the stored bits per weight that ``llmx compare`` matches arms on."""

from __future__ import annotations

import pytest


# 4-bit codes plus an 8-bit absmax per block of 64, plus per-layer tables (a large share of tiny:llama's 64-wide
# layers); int8 codes plus a float scale per row
@pytest.mark.parametrize("bits,low,high", [("w4a16", 4 + 8 / 64, 6.0), ("w8a8", 8.0, 9.0)])
def test_the_stage_reports_stored_bits_per_weight(bits, low, high):
    import llmx

    model, metrics = llmx.quantize("tiny:llama", method="bnb", bits=bits, save=False)
    assert metrics["weight_bits_per_element"] == pytest.approx(8 * metrics["quantized_bytes"] /
                                                               metrics["quantized_params"])
    assert low < metrics["weight_bits_per_element"] < high
