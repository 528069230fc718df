"""Data read once: the standard library's index, the token cache (reuse, invalidation, damaged files, one file per
tokenizer, concurrent writers), random windows drawn without tokenising the corpus, and perplexity's figure equal
to a plain loop's."""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from llmx.core import data
from llmx.core.data import stdlib, tokens
from llmx.core.tokenizer import byte_tokenizer, train_bpe

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_eval_speed import plain_loop  # noqa: E402  the loop anyone would write, which the benchmark times too


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A fresh cache folder and nothing loaded in this process: as a new process with an empty cache."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("LLMX_CACHE_DIR", str(folder))
    tokens._loaded.clear()
    yield folder / "data" / "tokens"
    tokens._loaded.clear()


def new_process() -> None:
    """What a new process starts without: the in-process index and loaded token files."""
    tokens._loaded.clear()
    stdlib._index.cache_clear()
    stdlib.corpus.cache_clear()


@pytest.fixture
def fake_stdlib(tmp_path, monkeypatch) -> Path:
    """A small standard library (stdlib_root points at it): files in both splits, skipped folders and names."""
    root = tmp_path / "lib"
    for i in range(40):
        sub = root / ("pkg" if i % 3 else "pkg-x") if i % 2 else root
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"mod{i:02d}.py").write_text(f"def f{i}(x):\n    return x + {i}  # {'pad ' * (i % 7)}\n" * (3 + i % 5))
    for skipped in ("test/mod.py", "pkg/tests/t.py", "__pycache__/c.py", "pkg/test_mod.py", "_sysconfigdata_x.py"):
        (root / skipped).parent.mkdir(parents=True, exist_ok=True)
        (root / skipped).write_text("skip = 1\n")
    monkeypatch.setattr(stdlib, "stdlib_root", lambda: root)
    new_process()
    yield root
    new_process()


def _rglob_files(root: Path) -> list[Path]:
    """The index as llmx built it before: a full rglob, sorted, skipped folders filtered out."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if stdlib.SKIP_DIRS & set(rel.parts[:-1]) or rel.name.startswith(("test_", "_sysconfigdata")):
            continue
        out.append(path)
    return out


def test_the_index_is_the_full_walks_files_in_its_order(fake_stdlib):
    real = Path(sysconfig.get_paths()["stdlib"])
    assert stdlib.files(real) == _rglob_files(real)  # the real one: same files, same order, so the same streams
    assert stdlib.files(fake_stdlib) == _rglob_files(fake_stdlib)
    names = [p.relative_to(fake_stdlib).as_posix() for p in stdlib.files(fake_stdlib)]
    assert names.index("pkg/mod01.py") < names.index("pkg-x/mod03.py")  # part by part, as Path sorts
    assert not any("test" in n or "sysconfigdata" in n for n in names)
    train, val = stdlib.corpus("train", fake_stdlib), stdlib.corpus("validation", fake_stdlib)
    assert len(train.paths) + len(val.paths) == 40 and not set(train.paths) & set(val.paths) and val.paths
    assert stdlib.corpus("train", fake_stdlib) is train  # once per process


def test_token_stream_is_the_documents_joined(cache, fake_stdlib):
    tok = byte_tokenizer()
    for split, cap in (("validation", 500), ("validation", None), ("train", 3000), ("train", None)):
        expected = data.join_documents(tok, data.documents("stdlib", split), cap)
        assert torch.equal(data.token_stream(tok, "stdlib", split, cap), expected)
        tokens._loaded.clear()
        assert torch.equal(data.token_stream(tok, "stdlib", split, cap), expected)  # from the file


def test_a_second_call_reads_no_stdlib_file_and_tokenizes_nothing(cache, monkeypatch):
    tok = byte_tokenizer()
    first = data.token_stream(tok, "stdlib", "validation", 20_000)
    calls = data.random_windows(tok, "stdlib", 8, 64, seed=3)
    new_process()
    root = stdlib.stdlib_root()
    reads, made = [], []
    real_read = Path.read_text

    def counting_read(self, *a, **kw):
        if root in self.parents:
            reads.append(self)
        return real_read(self, *a, **kw)

    monkeypatch.setattr(Path, "read_text", counting_read)
    real_new = tokens.DocumentTokens.get

    def counting_get(self, i):
        before = self.tokenized
        out = real_new(self, i)
        made.extend([i] * (self.tokenized - before))
        return out

    monkeypatch.setattr(tokens.DocumentTokens, "get", counting_get)
    assert torch.equal(data.token_stream(tok, "stdlib", "validation", 20_000), first)
    assert torch.equal(data.random_windows(tok, "stdlib", 8, 64, seed=3), calls)
    assert reads == [] and made == []


def test_the_key_changes_with_the_corpus_and_the_python(cache, fake_stdlib, monkeypatch):
    tok = byte_tokenizer()
    key = stdlib.corpus("validation", fake_stdlib).key
    before = data.token_stream(tok, "stdlib", "validation")
    files = sorted(cache.iterdir())
    target = stdlib.corpus("validation", fake_stdlib).paths[0]

    target.write_text(target.read_text() + "# edited\n")  # an edit: size and time
    new_process()
    edited = data.token_stream(tok, "stdlib", "validation")
    assert stdlib.corpus("validation", fake_stdlib).key != key
    assert len(edited) == len(before) + len("# edited\n") and sorted(cache.iterdir()) != files

    keys = {stdlib.corpus("validation", fake_stdlib).key}
    stat = target.stat()
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched only: a new key too (safe)
    new_process()
    keys.add(stdlib.corpus("validation", fake_stdlib).key)
    train_key = stdlib.corpus("train", fake_stdlib).key
    names = [f"pkg/added{i}.py" for i in range(100)]
    (fake_stdlib / next(n for n in names if not data.in_validation(n))).write_text("x = 1\n")
    new_process()
    assert stdlib.corpus("validation", fake_stdlib).key in keys  # a file added to train: validation's cache stays
    assert stdlib.corpus("train", fake_stdlib).key != train_key
    (fake_stdlib / next(n for n in names if data.in_validation(n))).write_text("y = 2\n")
    new_process()
    keys.add(stdlib.corpus("validation", fake_stdlib).key)
    target.unlink()
    new_process()
    keys.add(stdlib.corpus("validation", fake_stdlib).key)
    monkeypatch.setattr(sys, "version", sys.version + " (another build)")
    new_process()
    keys.add(stdlib.corpus("validation", fake_stdlib).key)
    assert len(keys) == 5


def test_a_damaged_cache_file_is_ignored_and_rebuilt(cache):
    tok = byte_tokenizer()
    good = data.token_stream(tok, "stdlib", "validation", 8000)
    (path,) = cache.iterdir()
    whole = path.read_bytes()
    damages = {"truncated": whole[:-7], "half": whole[:len(whole) // 2], "empty": b"", "garbage": b"\x00" * 64,
               "payload flipped": whole[:-4] + bytes(b ^ 0xFF for b in whole[-4:]),
               "header": whole.replace(b'"format": 1', b'"format": 9')}
    for name, damaged in damages.items():
        path.write_bytes(damaged)
        tokens._loaded.clear()
        docs = data.document_tokens(tok, "stdlib", "validation")
        assert docs.tokenized == 0 and len(docs._ids) == 0, name  # nothing trusted
        assert torch.equal(data.token_stream(tok, "stdlib", "validation", 8000), good), name
        assert path.read_bytes() == whole, name  # rewritten whole
    assert not list(cache.glob(".*.tmp"))


def test_the_cache_is_per_tokenizer_and_never_mixes_them(cache):
    byte, again = byte_tokenizer(), byte_tokenizer()
    bpe = train_bpe(data.documents("stdlib", "validation")[:5], 400)
    assert tokens.tokenizer_key(byte) == tokens.tokenizer_key(again)  # the same tokenizer, rebuilt: one key
    assert tokens.tokenizer_key(byte) != tokens.tokenizer_key(bpe)
    a = data.token_stream(byte, "stdlib", "validation", 3000)
    b = data.token_stream(bpe, "stdlib", "validation", 3000)
    assert len(list(cache.iterdir())) == 2 and not torch.equal(a[:100], b[:100])
    tokens._loaded.clear()
    assert torch.equal(data.token_stream(bpe, "stdlib", "validation", 3000), b)
    assert torch.equal(data.token_stream(byte, "stdlib", "validation", 3000), a)
    grown = byte_tokenizer()
    grown.add_tokens(["def "])  # same class, one token more: another key
    assert tokens.tokenizer_key(grown) not in (tokens.tokenizer_key(byte), None)
    stream = data.token_stream(grown, "stdlib", "validation", 3000)
    assert torch.equal(stream, data.join_documents(grown, data.documents("stdlib", "validation"), 3000))
    assert len(list(cache.iterdir())) == 3


def test_a_tokenizer_without_a_serialisation_is_not_cached(cache):
    class Slow:
        eos_token_id = 2

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [3 + b for b in text.encode()[:50]]}

    assert tokens.tokenizer_key(Slow()) is None
    stream = data.token_stream(Slow(), "stdlib", "validation", 500)
    assert len(stream) == 500 and not cache.exists()


def test_concurrent_writers_merge_and_an_unwritable_cache_is_skipped(cache, tmp_path, monkeypatch):
    tok = byte_tokenizer()
    a = data.document_tokens(tok, "stdlib", "validation")
    tokens._loaded.clear()  # b as another process, started before a wrote
    b = data.document_tokens(tok, "stdlib", "validation")
    a.get(0), a.get(1)
    b.get(2)
    a.save()
    b.save()  # merges a's documents, does not drop them
    tokens._loaded.clear()
    c = data.document_tokens(tok, "stdlib", "validation")
    assert sorted(c._ids) == [0, 1, 2]
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("LLMX_CACHE_DIR", str(blocked))
    tokens._loaded.clear()
    stream = data.token_stream(tok, "stdlib", "validation", 2000)  # warns, goes on
    assert torch.equal(stream, data.join_documents(tok, data.documents("stdlib", "validation"), 2000))


class Counting:
    """A tokenizer that counts what it is asked to tokenize (and is not cached: it has no serialisation)."""

    def __init__(self):
        self.inner, self.calls, self.tokens = byte_tokenizer(), 0, 0
        self.eos_token_id = self.inner.eos_token_id

    def __call__(self, text, add_special_tokens=False):
        out = self.inner(text, add_special_tokens=add_special_tokens)
        self.calls += 1
        self.tokens += len(out["input_ids"])
        return out


def test_random_windows_tokenize_a_few_times_what_they_return(cache, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": f"row {i}: " + "word " * (20 + i % 40)}) + "\n" for i in range(2000)))
    tok = Counting()
    n, seq = 6, 32
    windows = data.random_windows(tok, str(rows), n, seq, seed=1)
    longest = max(len(t) for t in data.documents(str(rows), "train")) + 1
    assert windows.shape == (n, seq) and tok.tokens <= data.POOL_FACTOR * n * seq + longest
    assert tok.calls < 0.05 * len(data.documents(str(rows), "train"))  # before: every row up to 200k tokens
    assert torch.equal(data.random_windows(Counting(), str(rows), n, seq, seed=1), windows)
    assert not torch.equal(data.random_windows(Counting(), str(rows), n, seq, seed=2), windows)
    docs = [tok.inner(d, add_special_tokens=False)["input_ids"] for d in data.documents(str(rows), "train")]
    for row in windows.tolist():  # each window is a run of the split's documents joined by EOS
        pieces = _split(row, tok.eos_token_id)
        assert all(any(_contains(d, p) for d in docs) for p in pieces if p)
        assert all(any(d[:len(p)] == p for d in docs) for p in pieces[1:] if p)  # a document's start after EOS

    tok = Counting()
    data.random_windows(tok, "stdlib", 16, 128, seed=0)
    biggest = max(p.stat().st_size for p in stdlib.corpus("train", stdlib.stdlib_root()).paths)
    assert tok.tokens <= data.POOL_FACTOR * 16 * 128 + biggest  # byte tokens: at most one per byte
    assert tok.calls < len(stdlib.corpus("train", stdlib.stdlib_root()).paths) // 4


def test_random_windows_are_seeded_and_the_cache_does_not_change_them(cache):
    tok = byte_tokenizer()
    first = data.random_windows(tok, "stdlib", 8, 64, seed=5, split="validation")
    tokens._loaded.clear()
    from_file = data.random_windows(tok, "stdlib", 8, 64, seed=5, split="validation")
    uncached = data.random_windows(Counting(), "stdlib", 8, 64, seed=5, split="validation")
    assert torch.equal(first, from_file) and torch.equal(first, uncached)
    assert not torch.equal(first, data.random_windows(tok, "stdlib", 8, 64, seed=6, split="validation"))


def _split(ids: list[int], eos: int) -> list[list[int]]:
    out, cur = [], []
    for i in ids:
        if i == eos:
            out.append(cur)
            cur = []
        else:
            cur.append(i)
    return [*out, cur]


def _contains(haystack: list[int], needle: list[int]) -> bool:
    return any(haystack[i:i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))


def test_eval_gives_the_plain_loops_figure(cache):
    import llmx
    from llmx.core.eval.lm import sequence_nll

    model, tok = llmx.load("tiny:llama")
    m = llmx.evaluate(model, tokenizer=tok, method="perplexity", max_tokens=400, seq_len=64, batch_size=3)
    stream = data.token_stream(tok, "stdlib", "validation", 400)
    total, count = plain_loop(model, stream, 64, 32, 3)
    assert m["tokens"] == count == 399 and m["nll"] == pytest.approx(total / count, rel=1e-6, abs=0)

    class NoKeep(torch.nn.Module):  # a model without logits_to_keep: every position's logits, the same figure
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, input_ids):
            return self.inner(input_ids=input_ids)

    for seq, stride, batch in ((64, 32, 3), (50, 7, 4), (40, 40, 2)):
        kept = sequence_nll(model, stream, seq, stride, batch)
        assert kept == sequence_nll(NoKeep(), stream, seq, stride, batch)
        assert kept[0] == pytest.approx(plain_loop(model, stream, seq, stride, batch)[0], rel=1e-6, abs=0)
