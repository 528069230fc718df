from __future__ import annotations

from llmx.core.quant.params import WeightQuantParams


class RTNParams(WeightQuantParams):
    """Round to nearest: no extra parameters beyond the shared weight-quantization ones."""
