from __future__ import annotations

from pydantic import Field

from llmx.core.spec import Params


class CompressedTensorsParams(Params):
    verify: bool = Field(False, description="Reload the exported folder with plain transformers and report the largest "
                         "logit difference from the model (max_abs_logit_diff).")
