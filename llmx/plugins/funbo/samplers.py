"""Program samplers, one interface ``sample(prompt, n) -> list[str]`` of completions of the prompt's last header:
``hf`` (any local causal LM), ``openai`` (an OpenAI-compatible ``/v1/completions`` endpoint the user runs: vLLM,
llama.cpp), and two offline ones that are not models: ``mutate`` (``mutate.Mutator``) and ``scripted`` (the textbook
AFs of ``afs.TEXTBOOK`` in a fixed order). ``label`` says which one wrote a result."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from llmx.errors import UsageError
from llmx.plugins.funbo import afs
from llmx.plugins.funbo import prompt as P
from llmx.plugins.funbo.mutate import Mutator


class MutateSampler:
    label = "mutate (offline AST mutation and crossover; not an LLM)"

    def __init__(self, seed: int):
        self.mutator = Mutator(seed)

    def sample(self, prompt: str, n: int) -> list[str]:
        return self.mutator.sample(prompt, n)


class ScriptedSampler:
    """Proposes ``afs.TEXTBOOK``'s programs in order, whatever the prompt shows, then again (a second pass is all
    duplicates): what a search can choose among the textbook AFs it is told, by the same scores and selection."""

    label = "scripted (textbook EI, PI, LCB and variance AFs written as programs, in a fixed order; not a model)"

    def __init__(self) -> None:
        self.bodies = ["\n".join(P.body(source)) for source in afs.TEXTBOOK.values()]
        self.next = 0

    def sample(self, prompt: str, n: int) -> list[str]:
        out = [self.bodies[(self.next + i) % len(self.bodies)] for i in range(n)]
        self.next += n
        return out


class HFSampler:
    """Samples from a local causal LM; the prompt is cut from the left to the model's context."""

    def __init__(self, model: Any, tokenizer: Any, max_new_tokens: int, temperature: float, seed: int):
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.temperature, self.seed = max_new_tokens, temperature, seed
        self.label = f"hf ({getattr(model.config, '_name_or_path', '') or type(model).__name__})"

    def sample(self, prompt: str, n: int) -> list[str]:
        import torch

        ids = self.tokenizer(prompt, return_tensors="pt").input_ids
        room = getattr(self.model.config, "max_position_embeddings", 2048) - self.max_new_tokens
        if room < 8:
            raise UsageError(f"max_new_tokens {self.max_new_tokens} leaves no room for a prompt in the model's context")
        ids = ids[:, -room:].to(self.model.device)
        torch.manual_seed(self.seed)
        self.seed += 1
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                      temperature=self.temperature, max_new_tokens=self.max_new_tokens,
                                      num_return_sequences=n, pad_token_id=self.tokenizer.pad_token_id
                                      if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id)
        return [self.tokenizer.decode(row[ids.shape[1]:], skip_special_tokens=True) for row in out]


class OpenAISampler:
    """``POST {endpoint}/v1/completions`` with ``n`` completions of the prompt; ``probe`` checks the server first."""

    def __init__(self, endpoint: str, model: str, api_key: str | None, max_tokens: int, temperature: float,
                 timeout: float = 120.0):
        self.url = endpoint.rstrip("/").removesuffix("/v1")
        self.model, self.key, self.max_tokens, self.temperature, self.timeout = (model, api_key, max_tokens,
                                                                               temperature, timeout)
        self.label = f"openai ({self.url}, {model})"

    def _request(self, path: str, body: dict | None, timeout: float) -> dict:
        headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {self.key}"} if self.key else {})
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method="POST" if data else "GET")
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 -- the user's own endpoint
            reply = json.loads(resp.read())
        if not isinstance(reply, dict):
            raise ValueError(f"a {type(reply).__name__} where a JSON object was expected")
        return reply

    def _call(self, path: str, body: dict | None, timeout: float, tries: int = 2) -> dict:
        """One request, retried once on a timeout or a dropped connection; any failure as one line naming it."""
        for attempt in range(tries):
            try:
                return self._request(path, body, timeout)
            except urllib.error.HTTPError as e:
                detail = e.read().decode(errors="replace").strip().replace("\n", " ")[:200]
                raise UsageError(f"endpoint {self.url}{path}: HTTP {e.code} {e.reason}: {detail}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                if attempt + 1 == tries:
                    reason = getattr(e, "reason", e)
                    raise UsageError(f"endpoint {self.url} is unreachable ({reason})") from None
            except ValueError as e:
                raise UsageError(f"endpoint {self.url}{path}: not an OpenAI reply ({e})") from None
        raise AssertionError("unreachable")

    def probe(self) -> None:
        """The server answers ``/v1/models`` and lists ``model`` (when it lists any)."""
        listed = [m.get("id") for m in self._call("/v1/models", None, 5.0, tries=1).get("data", [])
                  if isinstance(m, dict)]
        if listed and self.model not in listed:
            raise UsageError(f"endpoint {self.url} serves {', '.join(map(str, listed[:5]))}, not '{self.model}': "
                             "set endpoint_model")

    def sample(self, prompt: str, n: int) -> list[str]:
        reply = self._call("/v1/completions", {"model": self.model, "prompt": prompt, "n": n,
                                               "max_tokens": self.max_tokens, "temperature": self.temperature},
                           self.timeout)
        return [c.get("text", "") if isinstance(c, dict) else "" for c in reply.get("choices", [])][:n]


def make(p, ctx) -> MutateSampler | ScriptedSampler | HFSampler | OpenAISampler:
    if p.sampler == "mutate":
        return MutateSampler(ctx.config.seed)
    if p.sampler == "scripted":
        return ScriptedSampler()
    if p.sampler == "openai":
        if not p.endpoint:
            raise UsageError("sampler openai needs --set endpoint=http://HOST:PORT")
        sampler = OpenAISampler(p.endpoint, p.endpoint_model, os.environ.get(p.api_key_env), p.max_new_tokens,
                                p.temperature)
        sampler.probe()
        return sampler
    if not ctx.config.model:
        raise UsageError("sampler hf samples from the run's model: give --model")
    return HFSampler(ctx.model, ctx.tokenizer, p.max_new_tokens, p.temperature, ctx.config.seed)
