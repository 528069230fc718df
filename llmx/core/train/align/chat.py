"""Conversational preference rows as text: a prompt conversation and its response rendered with the tokenizer's
chat template (the response is what the template adds after the prompt with its generation prompt), or, without
one, with the plain template of the SFT stage (``role: content`` lines, then ``assistant: `` and the content)."""

from __future__ import annotations

from llmx.core.train.align.data import Text
from llmx.errors import UsageError


def templated(tok, prompt: Text, response: Text) -> bool:
    """Whether the pair is rendered by the tokenizer's chat template (which writes its own BOS)."""
    return (isinstance(prompt, list) or isinstance(response, list)) and bool(getattr(tok, "chat_template", None))


def render(tok, prompt: Text, response: Text) -> tuple[str, str]:
    """(prompt text, response text); plain strings pass through."""
    if isinstance(prompt, str) and isinstance(response, str):
        return prompt, response
    asked = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    answer = response if isinstance(response, list) else [{"role": "assistant", "content": response}]
    if templated(tok, prompt, response):
        head = tok.apply_chat_template(asked, tokenize=False, add_generation_prompt=True)
        full = tok.apply_chat_template(asked + answer, tokenize=False, add_generation_prompt=False)
        if not full.startswith(head):
            raise UsageError("the tokenizer's chat template does not render prompt + response as an extension of the "
                             "prompt, so the response cannot be located; use string rows")
        return head, full[len(head):]
    head = "".join(f"{m['role']}: {m['content']}\n" for m in asked) + "assistant: "
    rest = "".join(f"\n{m['role']}: {m['content']}" for m in answer[1:])
    return head, answer[0]["content"] + rest
