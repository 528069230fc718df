"""Option types shared by the commands that build a RunConfig."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

Configs = Annotated[Optional[list[Path]], typer.Option("--config", "-c", help="YAML config file(s), merged in order.")]
Sets = Annotated[Optional[list[str]], typer.Option("--set", "-s", help="Override KEY=VALUE (dotted keys; highest precedence).")]
Method = Annotated[Optional[str], typer.Option("--method", "-m", help="Method name (see `llmx methods`).")]
Model = Annotated[Optional[str], typer.Option("--model", help="Local folder, HF id, tiny:NAME or ref:NAME.")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="Random seed.")]
Device = Annotated[Optional[str], typer.Option("--device", help="cpu, cuda, cuda:N or auto.")]
Onload = Annotated[Optional[str], typer.Option(
    "--onload", help="none or cpu: keep the decoder blocks' weights in CPU memory and move one block at a time to "
    "--device (a model larger than the GPU), e.g. --device cuda --onload cpu --dtype bfloat16.")]
Dtype = Annotated[Optional[str], typer.Option("--dtype", help="float32, float16 or bfloat16.")]
Data = Annotated[Optional[str], typer.Option("--data", help="Text source: stdlib or a .txt/.jsonl file.")]
Name = Annotated[Optional[str], typer.Option("--name", help="Run name (part of the run folder's name).")]
OutputDir = Annotated[Optional[str], typer.Option("--output-dir", "-o", help="Where run folders go (default runs/).")]
Bits = Annotated[Optional[str], typer.Option("--bits", help="Quantization format w<N>a<M>, e.g. w4a16, w8a8.")]
Evals = Annotated[Optional[list[str]],
                  typer.Option("--eval", help="Eval method(s) or task(s) (llmx tasks) to run after the stage.")]
