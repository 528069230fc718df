from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
TESTKIT = FIXTURES / "plugins"


@pytest.fixture(scope="session")
def prose() -> str:
    """English prose every Python ships (pydoc's topics), blank-line separated: text for user-file tests."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics.values())


@pytest.fixture
def notes(tmp_path, prose) -> Path:
    """A user's text file: 120k characters of that prose."""
    f = tmp_path / "notes.txt"
    f.write_text(prose[:120_000], encoding="utf-8")
    return f


@pytest.fixture(scope="session")
def zoo_cache(tmp_path_factory) -> Path:
    """One reference-model cache for the whole session: ``ref:*-test`` models are built once (``LLMX_TEST_CACHE``
    names a shared one instead, as the device check does for its parallel workers; builds there are locked)."""
    shared = os.environ.get("LLMX_TEST_CACHE")
    return Path(shared) if shared else tmp_path_factory.mktemp("llmx-cache")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path, zoo_cache):
    """Each test gets a fresh plugin host, its own cwd, no inherited LLMX_* variables and the session's cache."""
    for key in [k for k in os.environ if k.startswith("LLMX_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("LLMX_CACHE_DIR", str(zoo_cache))
    monkeypatch.syspath_prepend(str(TESTKIT))
    monkeypatch.chdir(tmp_path)
    from llmx.core import plugins

    plugins.configure([])
    yield
    plugins.configure([])


class Result:
    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err

    def json(self):
        import json

        return json.loads(self.out)


@pytest.fixture
def cli(capsys):
    """Run ``llmx`` in-process: ``cli("methods", "--json")`` -> Result(code, out, err)."""
    from llmx.cli.app import main

    def run(*args: str) -> Result:
        capsys.readouterr()
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def run_subprocess(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("LLMX_") or k == "LLMX_CACHE_DIR"}
    full_env.update(env or {})
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=full_env, cwd=cwd or ROOT,
                          timeout=120)


@pytest.fixture
def tiny_llava():
    """``make(path, text_arch="qwen2", strategy="full")``: a random LLaVA saved in the llava-hf layout (model and
    processor; a 32-pixel CLIP tower of 8-pixel patches, 16 patches), its text model with GQA and, for Qwen2, biased
    q/k/v. ``strategy: default`` drops CLS as llava-hf's LLaVA-1.5 folders do (16 image tokens, not 17)."""

    def make(path: Path, text_arch: str = "qwen2", strategy: str = "full") -> Path:
        import torch
        from transformers import LlavaForConditionalGeneration

        from llmx.core.models.archs import config
        from llmx.core.multimodal import model as M
        from llmx.core.tokenizer import byte_tokenizer

        tok = byte_tokenizer()
        image_id = M.add_image_token(tok)
        text = config(text_arch, len(tok), hidden=128, layers=2, heads=4, kv_heads=2)
        cfg = M.llava_config(text, M.vision_config(32, 8, 32, 2, 2), image_id)
        proc = M.processor(tok, 32, 8)
        if strategy == "default":
            cfg.vision_feature_select_strategy = proc.vision_feature_select_strategy = "default"
            cfg.image_seq_length = 16
        torch.manual_seed(0)
        LlavaForConditionalGeneration(cfg).save_pretrained(path)
        proc.save_pretrained(path)
        return path

    return make
