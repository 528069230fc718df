"""``llmx zoo build|list|rm``: the trained reference models."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from llmx.cli.app import examples
from llmx.cli.output import emit, info, state, stdout, table

zoo_app = typer.Typer(help="Build, list and remove the reference models trained from real text (ref:NAME).",
                      no_args_is_help=True)


@zoo_app.command("build", epilog=examples(
    "llmx zoo build llama", "llmx zoo build mamba2 --preset bench", "llmx zoo build qwen2 --preset long",
    "llmx zoo build llama --preset icl",
    "llmx zoo build llama --data pydoc --name llama-prose",
    "llmx zoo build llava",
    "llmx zoo build llama --data notes.txt --layers 6 --hidden 384 --heads 6 --seq-len 512 --tokens 2000000 --name notes",
    "llmx zoo build gpt2 --data corpus.jsonl --tokenizer ref:llama --name mine",
    "llmx zoo build llama --data sentences.txt --text-split lines --validation-percent 20 --name sentences",
    "llmx --json zoo build moe --force"))
def build(
    arch: Annotated[str, typer.Argument(help="gpt2, llama, llava, mamba, mamba2, moe, opt or qwen2.")],
    preset: Annotated[str, typer.Option("--preset", help="small (default), bench, long (1024 tokens), medium, "
                                        "icl (in-context episodes) or test (seconds).")] = "small",
    data: Annotated[Optional[str], typer.Option("--data", help="stdlib (default; icl-episodes for --preset icl), "
                                                "pydoc, a .txt/.jsonl file, hf:NAME or a plugin dataset.")] = None,
    text_split: Annotated[str, typer.Option("--text-split", help="How a local file splits into train and validation: "
                                            "auto (blank-line blocks, or lines), blocks, lines (each by a hash of "
                                            "its text) or legacy (a .txt's last percent).")] = "auto",
    validation_percent: Annotated[int, typer.Option("--validation-percent",
                                                    help="A local file's share held out.")] = 10,
    name: Annotated[Optional[str], typer.Option("--name", help="Make the entry addressable as ref:NAME.")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", help="Maximum training steps (default: the preset's).")] = None,
    tokens: Annotated[Optional[int], typer.Option("--tokens", help="Training budget in tokens, instead of --steps.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed: the same seed gives identical weights.")] = 0,
    layers: Annotated[Optional[int], typer.Option("--layers", help="Shape, over the preset: blocks (decoder or "
                                                  "Mamba layers).")] = None,
    hidden: Annotated[Optional[int], typer.Option("--hidden", help="Shape: model width.")] = None,
    heads: Annotated[Optional[int], typer.Option("--heads", help="Shape: attention heads.")] = None,
    kv_heads: Annotated[Optional[int], typer.Option("--kv-heads", help="Shape: key/value heads (GQA).")] = None,
    vocab: Annotated[Optional[int], typer.Option("--vocab", help="Shape: BPE vocabulary trained on the corpus.")] = None,
    seq_len: Annotated[Optional[int], typer.Option("--seq-len", help="Shape: training context length.")] = None,
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="Use this model's tokenizer (ref:NAME, a "
                                                     "folder or a hub id) instead of training one.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if a verified entry exists.")] = False,
) -> None:
    """Train (or reuse) a reference model on a corpus and report its figures."""
    from llmx.core import zoo

    req = zoo.RefRequest(arch=arch.removeprefix("ref:"), preset=preset, seed=seed, steps=steps, data=data, tokens=tokens,
                         text_split=text_split, validation_percent=validation_percent,
                         layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, vocab=vocab, seq_len=seq_len,
                         tokenizer=tokenizer, name=name)
    path, built = zoo.provide(req, force=force, show_progress=state.show_progress)
    data_ = {"path": str(path), "built": built, **zoo.info(path), "name": req.ref_name}
    keys = (("name", "arch", "preset", "params", "vocab", "build_seconds", "text_val_perplexity", "text_qa_accuracy",
             "probe_accuracy", "stage1_caption_loss_before", "stage1_caption_loss", "image_tokens")
            if data_.get("arch") == "llava" else
            ("name", "arch", "preset", "params", "vocab", "steps_run", "best_step", "train_seconds", "val_perplexity",
             "unigram_perplexity"))
    emit(data_, lambda: (table(None, ["figure", "value"], [[k, _cell(data_.get(k))] for k in keys]),
                         stdout().print(f"{'built' if built else 'reused'}: {path}", highlight=False)))


def _cell(value):
    """A figure for the table: nested figures (per language, per probe target) on one line."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {_cell(v)}" for k, v in value.items())
    return f"{value:.3f}" if isinstance(value, float) else value


@zoo_app.command("list", epilog=examples("llmx zoo list", "llmx --json zoo list"))
def list_() -> None:
    """List cached reference models: names, corpus, shape and validation figures."""
    from llmx.core import zoo

    data = zoo.entries()

    def shape(d: dict) -> str | None:
        s = d.get("preset_spec") or {}
        return s and f"{s.get('layers')}x{s.get('hidden')} h{s.get('heads', 4)} ctx{s.get('seq_len')}"

    emit(data, lambda: table(f"zoo ({zoo.cache_root()})",
                             ["entry", "names", "ok", "corpus", "shape", "params", "val ppl", "unigram ppl", "seconds"],
                             [[d["entry"], ", ".join(d["names"]), d["problem"] or "ok", (d.get("corpus") or {}).get("source"),
                               shape(d), d.get("params"), d.get("val_perplexity"), d.get("unigram_perplexity"),
                               d.get("train_seconds")] for d in data]))


@zoo_app.command("rm", epilog=examples("llmx zoo rm ref:notes", "llmx zoo rm llama-test-s0-3f2a9c1d4e5b",
                                        "llmx --json zoo rm ref:llama-test"))
def rm(targets: Annotated[list[str], typer.Argument(help="ref:NAME, a name, or an entry folder from `llmx zoo list`.")]
       ) -> None:
    """Remove cached reference models and the names pointing to them."""
    from llmx.core import zoo

    removed = zoo.remove(targets)
    emit({"removed": removed}, lambda: info("removed " + ", ".join(removed)))


def register(app: typer.Typer) -> None:
    app.add_typer(zoo_app, name="zoo")
