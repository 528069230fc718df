"""``llmx export``: a saved quantized model as a folder other tools load (compressed-tensors for transformers/vLLM)."""

from __future__ import annotations

from typing import Annotated

import typer

from llmx.cli.app import examples
from llmx.cli.output import emit, stdout, table


def export(
    source: Annotated[str, typer.Argument(help="A saved llmx model folder (the `model` artifact of a quantize run), or "
                                          "the run folder that saved it.", show_default=False)],
    target: Annotated[str, typer.Argument(help="The folder to write (it must not exist, unless --force).",
                                          show_default=False)],
    fmt: Annotated[str, typer.Option("--format", "-f", help="Output format: compressed-tensors (W4A16 and other "
                                     "weight-only ints: pack-quantized; W8A8: int-quantized).")] = "compressed-tensors",
    force: Annotated[bool, typer.Option("--force", help="Replace TARGET if it exists.")] = False,
    verify: Annotated[bool, typer.Option("--verify", help="Reload TARGET with plain transformers and report the "
                                         "largest logit difference from llmx's model.")] = False,
    device: Annotated[str, typer.Option("--device", help="Where to load the model (cpu, cuda, cuda:N).")] = "cpu",
) -> None:
    """Export a quantized model for the ecosystem; a layer the format cannot express is an error and nothing is
    written."""
    from llmx.core.export import export_saved

    data = export_saved(source, target, fmt=fmt, force=force, verify=verify, device=device)

    def render() -> None:
        rows = [[k, data[k]] for k in ("format", "compression", "layers", "stored_weight_bytes",
                                       "dequantize_on_load", "max_abs_logit_diff") if k in data]
        rows += [[f"scheme {name}", n] for name, n in data["schemes"].items()]
        table(None, ["export", "value"], rows)
        stdout().print(f"written: {data['model_dir']}", highlight=False)

    emit({"ok": True, **data}, render)


def register(app: typer.Typer) -> None:
    app.command(epilog=examples(
        "llmx quantize --method rtn --bits w4a16 --set group_size=32 --model ref:llama -o runs",
        "llmx export runs/<run> w4-ct --format compressed-tensors",
        "llmx export runs/<run>/artifacts/0_rtn/model w4-ct --force --verify",
        "llmx --json export runs/<run> w8a8-ct"))(export)
