"""The stage cache's key: what determines a stage's output, files named in its params included."""

from __future__ import annotations

from types import SimpleNamespace

from llmx.core import stagecache
from llmx.core.spec import Params


class _P(Params):
    data: str | None = None
    steps: int = 3


def _ctx(seed=0):
    config = SimpleNamespace(model="tiny:llama", pipeline=[], seed=seed, dtype="float32")
    return SimpleNamespace(stage=SimpleNamespace(index=0), config=config, device="cpu")


def test_the_key_follows_the_params_the_seed_and_the_content_of_a_file_they_name(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"a": 1}\n')
    key = stagecache.key(_ctx(), _P(data=str(rows)))
    assert key == stagecache.key(_ctx(), _P(data=str(rows)))
    assert key != stagecache.key(_ctx(1), _P(data=str(rows))) and key != stagecache.key(_ctx(), _P(data=str(rows),
                                                                                                   steps=4))
    rows.write_text('{"a": 2}\n')  # edited in place: same name, other rows
    assert stagecache.key(_ctx(), _P(data=str(rows))) != key
