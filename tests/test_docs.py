"""The documentation's generated pages are current: regenerating them gives exactly the committed docs/methods and
docs/comparisons pages and mkdocs.yml's nav (so a changed param default or description, a new method or comparison,
or a newly published figure fails here until `make docs` is run), every method and comparison has a page, and the
parameter tables render cell for cell. The strict site build (`mkdocs build --strict`) runs in `make test` after
pytest (`make docs`)."""

from __future__ import annotations

import json
import shutil
import sys
from html.parser import HTMLParser

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import gen_docs  # noqa: E402

from llmx.core import params_table  # noqa: E402

STALE = "the docs are stale: run `python scripts/gen_docs.py` (or `make docs`) and commit docs/ and mkdocs.yml"


def committed() -> dict[str, str]:
    pages = {p.relative_to(gen_docs.DOCS).as_posix(): p.read_text()
             for section in gen_docs.SECTIONS for p in sorted((gen_docs.DOCS / section).glob("*.md"))}
    return {**pages, "results.md": (gen_docs.DOCS / "results.md").read_text()}


def test_regenerated_pages_are_the_committed_ones(tmp_path):
    generated = gen_docs.pages()
    gen_docs.write(tmp_path, generated)
    fresh = {p.relative_to(tmp_path).as_posix(): p.read_text() for p in sorted(tmp_path.rglob("*.md"))}
    assert fresh == generated
    have = committed()
    assert sorted(have) == sorted(fresh), f"{STALE}; pages missing: {sorted(set(fresh) - set(have))}, " \
                                          f"no longer generated: {sorted(set(have) - set(fresh))}"
    stale = [rel for rel in fresh if have[rel] != fresh[rel]]
    assert not stale, f"{STALE}; differing: {stale}"
    text = gen_docs.MKDOCS.read_text()
    assert gen_docs.mkdocs_with(text, gen_docs.nav(generated)) == text, f"{STALE} (mkdocs.yml's nav)"


def test_every_method_and_comparison_has_a_page_in_the_nav():
    from llmx.core.plugins import host

    h = host()
    nav = gen_docs.MKDOCS.read_text()
    assert len(h.methods) > 40 and len(h.comparisons) > 20
    for spec in h.methods:
        page = gen_docs.DOCS / "methods" / f"{spec.name}.md"
        assert page.is_file(), f"no page for method {spec.name}: {STALE}"
        assert f"llmx {spec.stages[0].value} --method {spec.name}" in page.read_text() or \
            spec.stages[0].value == "export"
        assert f"methods/{spec.name}.md" in nav
    for name in h.comparisons:
        assert (gen_docs.DOCS / "comparisons" / f"{name}.md").is_file(), f"no page for comparison {name}: {STALE}"
        assert f"comparisons/{name}.md" in nav
    for page in ("index.md", "getting-started.md", "concepts.md", "exit-codes.md", "usage.md", "models-and-data.md",
                 "evaluation.md", "sandbox.md", "training.md", "export.md", "gpu.md", "python-api.md",
                 "writing-a-plugin.md", "development.md", "methods-overview.md", "results.md"):  # the hand-written ones
        assert (gen_docs.DOCS / page).is_file() and f" {page}" in nav


def test_a_changed_default_or_description_changes_the_page():
    from pydantic import Field, create_model

    from llmx.core.plugins import host

    spec = host().methods.get("rtn", "quantize")
    _, comparisons = gen_docs.plugins()
    names = {"rtn": "rtn"}
    page = gen_docs.method_page("rtn", [spec], comparisons, names)
    assert page == (gen_docs.DOCS / "methods" / "rtn.md").read_text(), STALE
    field = spec.config.model_fields["group_size"]
    for changed in ({"default": 64, "description": field.description}, {"default": field.default, "description": "x"}):
        model = create_model("Changed", __base__=spec.config, group_size=(field.annotation, Field(**changed)))
        other = gen_docs.method_page("rtn", [_with_config(spec, model)], comparisons, names)
        assert other != page


def test_a_method_page_includes_its_prose_and_a_changed_prose_changes_it(tmp_path):
    """docs/prose/NAME.md (hand-written) is appended to the generated page: the committed pages hold it, and editing
    it without regenerating fails test_regenerated_pages_are_the_committed_ones."""
    prose = sorted(gen_docs.PROSE.glob("*.md"))
    assert len(prose) >= 20, "the method sections moved out of the README"
    for path in prose:
        page = gen_docs.DOCS / "methods" / path.name
        assert page.is_file(), f"docs/prose/{path.name} names no method"
        assert page.read_text().rstrip("\n").endswith(gen_docs.portable(path.read_text()).strip("\n")), STALE
    from llmx.core.plugins import host

    spec = host().methods.get("gptq", "quantize")
    _, comparisons = gen_docs.plugins()
    names = {"gptq": "gptq"}
    page = gen_docs.method_page("gptq", [spec], comparisons, names)
    assert page == (gen_docs.DOCS / "methods" / "gptq.md").read_text(), STALE
    (tmp_path / "gptq.md").write_text("## Notes\n\nChanged.\n")
    changed = gen_docs.method_page("gptq", [spec], comparisons, names, tmp_path)
    assert changed != page and changed.endswith("## Notes\n\nChanged.\n")
    (tmp_path / "gptq.md").write_text("No heading.\n")
    assert "## About the technique" in gen_docs.method_page("gptq", [spec], comparisons, names, tmp_path)
    assert "## Notes" not in gen_docs.method_page("gptq", [spec], comparisons, names, tmp_path / "none")


def _with_config(spec, config):
    import dataclasses

    return dataclasses.replace(spec, config=config)


def test_a_changed_published_figure_changes_the_page(tmp_path):
    published = sorted(gen_docs.PUBLISHED.glob("*.json"))
    assert published, "no published comparison result to check the pages against"
    source = published[0]
    spec = next(c for c in gen_docs.plugins()[1] if c.name == source.stem)
    names = gen_docs.page_names(gen_docs.grouped(gen_docs.plugins()[0]))
    page = gen_docs.comparison_page(spec, names, gen_docs.PUBLISHED)
    assert page == (gen_docs.DOCS / "comparisons" / source.name.replace(".json", ".md")).read_text(), STALE
    result = json.loads(source.read_text())
    verdict = result["verdicts"][0]
    assert f"{verdict['improvement']:+.4f}" in page  # the figure is on the page
    verdict["improvement"] += 0.01
    (tmp_path / source.name).write_text(json.dumps(result))
    assert gen_docs.comparison_page(spec, names, tmp_path) != page
    shutil.rmtree(tmp_path)
    tmp_path.mkdir()
    assert "None published yet" in gen_docs.comparison_page(spec, names, tmp_path)


class _Cells(HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows: list[list[str]] = []
        self.cell: str | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.rows[-1].append(self.cell)
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def test_every_params_table_renders_cell_for_cell():
    """Python-Markdown (what mkdocs renders with) reads each generated table back as exactly its rows: no pipe,
    bracket or backtick in a type, default or description splits a cell or vanishes as HTML."""
    import markdown  # mkdocs' own renderer: the dev and docs extras install it

    from llmx.core.plugins import host

    count = 0
    for spec in host().methods:
        rows = params_table.rows(spec.config)
        parsed = _Cells()
        parsed.feed(markdown.markdown(params_table.markdown(rows), extensions=["tables"]))
        assert parsed.rows[0] == list(params_table.COLUMNS)
        assert len(parsed.rows) == len(rows) + 1, spec.name
        for row, cells in zip(rows, parsed.rows[1:], strict=True):
            assert cells == [*row[:3], row.description.replace("`", "")], (spec.name, row)
            count += 1
    assert count > 1000


def test_params_rows_expand_nested_models_with_their_own_defaults():
    from pydantic import BaseModel, Field

    class Inner(BaseModel):
        r: int = Field(8, gt=0, description="Rank.")

    class Outer(BaseModel):
        lora: Inner = Field(default_factory=lambda: Inner(r=4), description="Adapter | settings <here>.")
        data: str = Field(description="Rows.")

    rows = params_table.rows(Outer)
    assert rows == [("lora", "Inner", "(lora.* below)", "Adapter | settings <here>."),
                    ("lora.r", "int, > 0", "4", "Rank."), ("data", "str", params_table.REQUIRED, "Rows.")]
    assert "Adapter \\| settings &lt;here&gt;." in params_table.markdown(rows)


@pytest.mark.parametrize("name", ["rtn", "clover"])
def test_methods_show_prints_the_docs_rows(cli, monkeypatch, name):
    monkeypatch.setenv("COLUMNS", "400")
    from llmx.core.plugins import host

    r = cli("methods", "show", name)
    assert r.code == 0, r.err
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in r.out.splitlines() if line.startswith("│")]
    for spec in host().methods.variants(name):
        for row in params_table.rows(spec.config):
            assert [row.name, row.type, row.default] in [c[:3] for c in cells], row


# --- docs/results.md: generated from benchmarks/results/ and benchmarks/results_notes.yaml ---------------------------


def test_the_results_page_is_current():
    """docs/results.md is exactly what gen_docs writes from the results files, the scripts' docstrings and the
    notes: a figure typed into the page, or a results file rewritten without `make docs`, fails here."""
    page = (gen_docs.DOCS / "results.md").read_text()
    fresh = gen_docs.results_page()
    assert fresh == page, f"{STALE} (docs/results.md)"
    figure = next(m for m in gen_docs.FIGURE.finditer(page) if m.group() not in ("0", "1"))
    typed = page[:figure.start()] + figure.group() + "1" + page[figure.end():]
    assert typed != fresh  # what the comparison above catches: one figure retyped


def test_every_figure_on_the_results_page_comes_from_a_results_file():
    """Every number on the page lies in a part generated from a results file (and occurs in that file), in a
    script's docstring or command (and occurs in the script or its JSON), or in the published comparisons' summary;
    the hand-written prose (benchmarks/results_notes.yaml) holds none, an issue's number excepted."""
    parts = gen_docs.results_parts()
    assert "".join(p.text for p in parts) == (gen_docs.DOCS / "results.md").read_text(), STALE
    assert gen_docs.untraced(parts) == []
    kinds = {p.kind for p in parts}
    assert kinds == {"prose", "result", "code", "judged"}
    assert sum(len(gen_docs.figures(p.text)) for p in parts if p.kind == "result") > 5000
    # the check fails on a hand-typed figure in the prose, and on a figure a results file does not hold
    i = next(i for i, p in enumerate(parts) if p.kind == "prose" and "What the figures show" in p.text)
    typed = [*parts[:i], gen_docs.Part(parts[i].text + "GPTQ is 0.42x RTN.", "prose"), *parts[i + 1:]]
    assert gen_docs.untraced(typed) == ["'0.42' in hand-written text: " + repr(typed[i].text.strip()[:80])]
    j = next(i for i, p in enumerate(parts) if p.kind == "result" and "| " in p.text)
    changed = gen_docs.Part(parts[j].text.replace("| ", "| 987654.321 ", 1), "result", parts[j].sources)
    assert gen_docs.untraced([changed]) == [f"'987654.321' not in {[s.name for s in parts[j].sources]}"]
    assert gen_docs.untraced([gen_docs.Part("at issue 67, W4A16 on mamba2, GPT-2 and KIVI-2", "prose")]) == []


def test_a_changed_results_file_changes_the_results_page(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(gen_docs.RESULTS, results, ignore=shutil.ignore_patterns("*.png", "*.csv", "compare"))
    page = gen_docs.results_page(results)
    assert page == (gen_docs.DOCS / "results.md").read_text(), STALE
    table = (results / "sft_ref_llama.md").read_text()
    assert "| 0.4749 |" in table and "| 0.4749 |" in page
    (results / "sft_ref_llama.md").write_text(table.replace("| 0.4749 |", "| 0.4750 |"))
    changed = gen_docs.results_page(results)
    assert changed != page and "| 0.4750 |" in changed and "| 0.4749 |" not in changed
    (results / "new_bench.json").write_text("{}")  # a results file the notes do not place fails the generator
    with pytest.raises(SystemExit, match="new_bench"):
        gen_docs.results_page(results)


def test_the_results_page_labels_what_comparisons_supersede():
    """A benchmark whose comparison is published says it is superseded and links the comparison; the ones issue 67
    flagged (training split, GPTQ below its strongest, KIVI's dense rebuild, Quamba2's clustering) say so."""
    import yaml

    page = (gen_docs.DOCS / "results.md").read_text()
    sections = {s.split("\n", 1)[0]: s for s in page.split("\n## ")[1:]}
    groups = yaml.safe_load(gen_docs.NOTES.read_text())["groups"]
    published = {p.stem for p in gen_docs.PUBLISHED.glob("*.json")}
    assert {"align", "gptq", "clover-prune", "clover-finetune"} <= published
    for g in groups:
        text = sections[g["title"]]
        done = [c for c in g.get("comparisons", []) if c in published]
        for c in done:
            assert f"[{c}](comparisons/{c}.md)" in text.split("\n\n", 2)[1], g["title"]
        if done or g.get("flagged"):
            assert text.split("\n\n", 2)[1].startswith('!!! warning "Superseded"'), g["title"]
        for stem in g["files"]:
            assert f'??? note "`{stem}.' in text
    for title, words in (("GuidedQuant and LNQ", "training split"), ("Alignment at matched KL", "comparisons/align.md"),
                         ("Block formats: BlockDialect against MXFP4 and NVFP4", "training split"),
                         ("Weight quantization: RTN, GPTQ and NF4", "comparisons/gptq.md"), ("CLOVER", "clover-prune"),
                         ("KV-cache compression: Lexico and KIVI", "dense rebuild"), ("Quamba2", "clustering")):
        assert words in sections[title].split("\n\n", 2)[1], title
