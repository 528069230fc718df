"""Pasta-Lang (PASTA, ICML 2025): the tag language, its streaming parsers, and the program-annotated stdlib rows."""

from __future__ import annotations

import json
import re
import sysconfig
import textwrap
from pathlib import Path

import pytest

from llmx.errors import UsageError
from llmx.plugins.pasta import annotate as A
from llmx.plugins.pasta import lang


@pytest.fixture(scope="module")
def tok():
    from llmx.core.tokenizer import byte_tokenizer

    t = byte_tokenizer()
    lang.equip(t)
    return t


def encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def rows(tok):
    out, report = A.build(lambda s: encode(tok, s), A.Options(limit=30))
    assert len(out) == 30 and report.rows["train"] + report.rows["validation"] == 30
    return out


def _source(name: str) -> str:
    root, module = Path(sysconfig.get_paths()["stdlib"]), name.split(":")[0].replace(".", "/")
    path = root / f"{module}.py"
    return (path if path.exists() else root / module / "__init__.py").read_bytes().decode()


def test_rows_round_trip_to_the_exact_source(rows):
    for r in rows:
        parsed = lang.parse(r["response"])
        assert lang.strip(r["response"]) == r["plain"]
        assert lang.render(parsed.main, parsed.sync) == r["response"]
        source = _source(r["name"])
        assert r["plain"] in source and (r["prompt"].startswith("# ") or r["prompt"] + r["plain"] in source)
        assert parsed.sync == len(parsed.main) and r["response"].endswith(lang.SYNC)
        assert 2 <= r["chunks"] == len(parsed.promises) <= 6
    assert {r["split"] for r in rows} <= {"train", "validation"}
    assert any("@" in r["name"] for r in rows) and any("@" not in r["name"] for r in rows)


def test_tokens_count_the_chunk_positions(rows, tok):
    ids = lang.ids(tok)
    for r in rows:
        promises = lang.parse(r["response"]).promises
        assert r["chunk_tokens"] == [p.tokens for p in promises]
        assert [len(encode(tok, f"<async>{p.chunk}</async>")) for p in promises] == r["chunk_tokens"]
        seq = encode(tok, r["response"])  # inline, the chunk occupies exactly `tokens` positions
        opens = [i for i, t in enumerate(seq) if t == ids[lang.ASYNC_OPEN]]
        closes = [i for i, t in enumerate(seq) if t == ids[lang.ASYNC_CLOSE]]
        assert [c - o + 1 for o, c in zip(opens, closes, strict=True)] == r["chunk_tokens"]


SOURCE = textwrap.dedent('''\
    class Shape:
        """A shape."""

        sides = 0

        def __init__(self, w):
            self.w = w

        def area(self):
            return self.w * self.w

        # a comment between methods stays in the main stream
        def name(self):
            return "shape"

        def describe(self):
            return f"{self.name()} of {self.area()}"

        @property
        def size(self):
            return self.w

        @size.setter
        def size(self, value):
            self.w = value


    def one():
        return 1


    def two():
        return 2


    def three():
        return one() + two()
    ''')


def test_members_referring_to_siblings_stay_in_the_main_stream(tmp_path, tok):
    (tmp_path / "shapes.py").write_text(SOURCE)
    rows, _ = A.build(lambda s: encode(tok, s), A.Options(), root=tmp_path)
    by_name = {r["name"]: r for r in rows}
    cls = lang.parse(by_name["shapes:Shape"]["response"])
    assert [p.topic for p in cls.promises] == ["area", "name", "size"]
    main = "".join(p for p in cls.main if isinstance(p, str))
    assert "def describe" in main and "def __init__" in main and "@size.setter" in main
    assert "sides = 0" in main and "# a comment between methods" in main
    assert by_name["shapes:Shape"]["prompt"] == 'class Shape:\n    """A shape."""\n'
    funcs = lang.parse(by_name["shapes:one@28"]["response"])
    assert by_name["shapes:one@28"]["prompt"] == "# shapes.py\n"
    assert [p.topic for p in funcs.promises] == ["one", "two"] and "def three" in funcs.main[-1]


def test_min_chunks_skips_rows(tmp_path, tok):
    (tmp_path / "shapes.py").write_text(SOURCE)
    rows, report = A.build(lambda s: encode(tok, s), A.Options(min_chunks=3, functions=False), root=tmp_path)
    assert [r["name"] for r in rows] == ["shapes:Shape"]
    rows, report = A.build(lambda s: encode(tok, s), A.Options(min_chunks=4), root=tmp_path)
    assert rows == [] and report.skipped["few_chunks"] == 2


def _p(topic: str = "f", tokens: str = "3", chunk: str = "x") -> str:
    return f'<promise topic="{topic}" tokens="{tokens}"/><async>{chunk}</async>'


@pytest.mark.parametrize(("text", "message", "reason"), [
    (_p() + "</async>", "'</async>' outside a promise", "stray-tag"),
    ('<promise topic="f" tokens="3"/>', "text ends inside the promise 'f'", "unclosed"),
    ('<promise topic="f" tokens="3"/><async>abc', "text ends inside the <async> of 'f'", "unclosed"),
    ('<promise topic="f" tokens="3"/> <async>x</async>', "text between the promise 'f' and its <async>",
     "text-before-async"),
    (_p(chunk=_p()), "a nested promise inside the <async> of 'f'", "nested-promise"),
    ('<promise topic="a' + _p(), "a nested promise inside a promise's attributes", "nested-promise"),
    (_p(chunk="<async>"), "a nested <async>", "nested-async"),
    (_p(tokens="3.5"), "promise tokens must be a non-negative integer, not '3.5'", "bad-count"),
    (_p(tokens="-3"), "not '-3'", "bad-count"),
    (_p(tokens=""), "not ''", "bad-count"),
    (_p(topic=""), "a promise with an empty topic", "empty-topic"),
    (_p(topic='a"b'), "a promise topic contains", "quote-in-topic"),
    ("<sync/>" + _p(), "a promise after <sync/>", "promise-after-sync"),
    ("a<sync/>b<sync/>", "a second <sync/>", "second-sync"),
])
def test_bad_text_is_named(text, message, reason):
    with pytest.raises(lang.PastaSyntaxError) as e:
        lang.parse(text)
    assert message in e.value.message and "(at character " in e.value.message and e.value.reason == reason
    assert isinstance(e.value, UsageError)


def test_load_names_file_and_line(tmp_path, rows):
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    assert A.load(good) == rows[:3]
    for i, (bad, message) in enumerate([
        (rows[1] | {"response": rows[1]["response"].replace("<async>", "", 1)}, "text between the promise"),
        (rows[1] | {"chunk_tokens": [1] * rows[1]["chunks"]}, "'chunk_tokens' differs"),
        (rows[1] | {"plain": "x"}, "differs from 'plain'"),
        ({"prompt": "p"}, "string fields 'prompt' and 'response'"),
    ]):
        path = tmp_path / f"bad{i}.jsonl"
        path.write_text(json.dumps(rows[0]) + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(UsageError, match=f"^{re.escape(str(path))}:2: .*{message}"):
            A.load(path)
    (tmp_path / "junk.jsonl").write_text("{nope\n")
    with pytest.raises(UsageError, match="junk.jsonl:1: not valid JSON"):
        A.load(tmp_path / "junk.jsonl")


def test_stream_parser_reads_the_main_thread(rows, tok):
    ids = lang.ids(tok)
    for r in rows[:10]:
        parsed = lang.parse(r["response"])
        parser = lang.StreamParser(ids, tok.decode)
        events = [e for t in encode(tok, lang.render(parsed.main, parsed.sync, chunks=False))
                  if (e := parser.feed(t)) is not None]
        assert events == [lang.PromiseDone(p.topic, p.tokens) for p in parsed.promises] + [lang.Sync()]


@pytest.mark.parametrize(("text", "reason"), [
    ('x<promise topic="f" tokens="1x"/>', "bad-count"),
    ('<promise topic=" " tokens="1"/>', "empty-topic"),
    ('<promise topic="f<sync/>', "special-in-attributes"),
    ("<async>", "async-in-main"),
    ("<sync/>a<sync/>", "second-sync"),
    ('<sync/><promise topic="', "promise-after-sync"),
    ('<promise topic="' + "a" * 65, "runaway-attribute"),
])
def test_stream_parser_rejects(text, reason, tok):
    parser = lang.StreamParser(lang.ids(tok), tok.decode)
    with pytest.raises(lang.PastaSyntaxError) as e:
        for t in encode(tok, text):
            parser.feed(t)
    assert e.value.reason == reason


def test_equip_is_idempotent_and_grows_embeddings():
    import torch

    from llmx.core import models

    torch.manual_seed(0)
    model, tok = models.load("tiny:llama")
    assert lang.ids(tok) is None
    n = len(tok)
    old_in = model.get_input_embeddings().weight.detach().clone()
    old_out = model.get_output_embeddings().weight.detach().clone()
    ids = lang.equip(tok, model)
    assert sorted(ids.values()) == list(range(n, n + 6)) and list(ids) == list(lang.SPECIALS)
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert emb.shape[0] == head.shape[0] == n + 6 == model.config.vocab_size
    assert torch.equal(emb[:n], old_in) and torch.allclose(emb[n:], old_in.mean(0).expand(6, -1))
    assert torch.equal(head[:n], old_out) and torch.allclose(head[n:], old_out.mean(0).expand(6, -1))
    assert lang.equip(tok, model) == ids and len(tok) == n + 6 and emb.shape[0] == n + 6
    text = f"a{lang.promise_tag('f', 7)}b"
    assert encode(tok, text)[1:6] == [ids[lang.PROMISE_OPEN], encode(tok, "f")[0], ids[lang.PROMISE_MID],
                                      encode(tok, "7")[0], ids[lang.PROMISE_CLOSE]]
    out = model(torch.tensor([encode(tok, text)])).logits
    assert out.shape[-1] == n + 6 and torch.isfinite(out).all()


def test_params_and_cli(cli):
    from llmx.plugins.pasta.config import AnnotateParams

    with pytest.raises(ValueError, match="min_chunks"):
        AnnotateParams(min_chunks=4, max_chunks=3)
    r = cli("--json", "analyze", "--method", "pasta-annotate", "--model", "tiny:llama", "--set", "limit=5",
            "-o", "runs")
    assert r.code == 0, r.err
    metrics = r.json()["stages"][0]["metrics"]
    assert metrics["rows"] == 5
    data = Path(metrics["data_dir"])
    assert len(A.load(data / "train.jsonl")) == metrics["rows_train"]
