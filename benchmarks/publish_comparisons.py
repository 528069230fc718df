"""Publish ``llmx compare`` results as the repository's figures: each full-form ``result.json`` found under the
folders given (default ``comparisons/``) is copied with its Markdown and plot to ``benchmarks/results/compare/`` as
``NAME.json``, ``NAME.md`` and ``NAME.png`` (only each comparison's own form: its model, seeds and params; quick
forms are CI checks), and the README's table between its ``comparisons`` markers is regenerated from every
published file (``tests/test_readme.py`` fails when the two differ), as are the docs' comparison pages.
``make compare`` runs the comparisons and this."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from llmx.core.compare import summary

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "benchmarks" / "results" / "compare"
README = ROOT / "README.md"
BEGIN, END = "<!-- comparisons:begin (benchmarks/publish_comparisons.py) -->", "<!-- comparisons:end -->"


def table() -> str:
    return summary.markdown(summary.load([PUBLISHED])) if any(PUBLISHED.glob("*.json")) else "(none yet)\n"


def readme_with(text: str, block: str) -> str:
    head, rest = text.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{block}{END}{rest.split(END, 1)[1]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sources", nargs="*", default=["comparisons"], help="folders holding llmx compare results")
    args = ap.parse_args(argv)
    PUBLISHED.mkdir(parents=True, exist_ok=True)
    for result in summary.load(args.sources):
        if result["quick"]:
            continue
        if "options" not in result:
            print(f"not published: {result['_path']} predates recorded options: rerun it")
            continue
        variant = {k: v for k, v in result["options"].items() if k not in ("device", "onload")}
        if variant or result["model"] != result["default_model"]:
            print(f"not published: {result['_path']} is a variant (model {result['model']}, options {variant}); "
                  "the repository's figures are each comparison's own form")
            continue
        src = Path(result["_path"])
        for suffix in (".json", ".md", ".png"):
            if src.with_suffix(suffix).is_file():
                shutil.copyfile(src.with_suffix(suffix), PUBLISHED / f"{result['comparison']}{suffix}")
        print(f"published {result['comparison']} ({result['model']}, seeds {result['seeds']})")
    README.write_text(readme_with(README.read_text(), table()))
    import subprocess

    subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py")], check=True)  # the comparisons' pages
    return 0


if __name__ == "__main__":
    sys.exit(main())
