"""How Parrot's gates separate languages: the same held-out images asked the same question in every language (after
training) or an evaluation's own questions (``mmmb``), the gates ``g`` of each prompt as generation computes them
(all prompt tokens), and a nearest-centroid language classifier on ``g`` fitted on half the images and scored on the
other half (chance 1/languages; the notes' check 4)."""

from __future__ import annotations

from typing import Any

import torch

from llmx.core.multimodal import languages as L


@torch.no_grad()
def gates(model, proc, prompts: list[str], images: list) -> torch.Tensor:
    """(n, experts): each rendered prompt's gates with its image (a PIL image, or anything with ``.image()``: a
    scene, an MMMB row's ``Picture``), the model in eval mode and left in the mode it was in."""
    from llmx.core.multimodal.batch import pixel_values
    from llmx.core.multimodal.model import text_tokenizer

    tok = text_tokenizer(proc)
    device, was = next(model.parameters()).device, model.training
    model.eval()
    out = []
    try:
        for prompt, image in zip(prompts, images, strict=True):
            ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]], device=device)
            pil = image.image() if hasattr(image, "image") else image
            embeds = model.get_input_embeddings()(ids)
            feats = model.image_features(pixel_values(proc, [pil]).to(device), embeds.dtype)
            moe = model.visual_adapter
            dtype = next(moe.parameters()).dtype
            out.append(moe.routing(feats.to(dtype), embeds.to(dtype), model.text_mask(ids, None, None)).float().cpu())
    finally:
        model.train(was)
    return torch.cat(out)


def metrics(report: dict[str, Any]) -> dict[str, Any]:
    """A report's figures for a stage's metrics."""
    return {"routing_language_accuracy": report["language_accuracy"], "routing_chance": report["chance"],
            "routing_top_expert": " ".join(f"{k}:{v}" for k, v in report["top_expert"].items())}


def rendered(model, proc, contents: list[str]) -> list[str]:
    """User turns (``<image>`` once) as generation renders them, ``<image>`` expanded to the model's image tokens."""
    from llmx.core.multimodal.model import IMAGE_TOKEN, image_tokens, text_tokenizer

    tok, n = text_tokenizer(proc), image_tokens(model)
    return [tok.apply_chat_template([{"role": "user", "content": c.replace(IMAGE_TOKEN, IMAGE_TOKEN * n)}],
                                    tokenize=False, add_generation_prompt=True) for c in contents]


def decode(g: torch.Tensor, langs: list[str], halves: list[int]) -> dict[str, Any]:
    """Per language (``langs[i]`` is row i's) the mean gates and the top expert; a nearest-centroid classifier of the
    language from the gates, its centroids from the rows of half 0, its accuracy on those of half 1 (every language
    needs rows in both)."""
    known = [lang for lang in L.LANGUAGES if lang in langs]
    by_lang = {lang: g[[k for k, x in enumerate(langs) if x == lang]] for lang in known}
    fit = [g[[k for k, x in enumerate(langs) if x == lang and halves[k] == 0]].mean(0) for lang in known]
    test = [k for k in range(len(langs)) if halves[k] == 1]
    guess = torch.cdist(g[test], torch.stack(fit)).argmin(1)
    right = sum(known[int(j)] == langs[k] for j, k in zip(guess, test, strict=True))
    return {"language_accuracy": right / len(test), "chance": 1 / len(known),
            "top_expert": {lang: int(v.mean(0).argmax()) for lang, v in by_lang.items()},
            "mean_gates": {lang: [round(float(x), 4) for x in v.mean(0)] for lang, v in by_lang.items()}}


def report(model, proc, count: int, seed: int) -> dict[str, Any]:
    """Per language the mean gates and the top expert; the held-out nearest-centroid language accuracy."""
    import random

    from llmx.core.multimodal import qa
    from llmx.core.multimodal.model import IMAGE_TOKEN
    from llmx.core.multimodal.scenes import scenes

    shown = scenes(count, "test", seed + 3000)
    contents, images, langs, halves = [], [], [], []
    for i, s in enumerate(shown):
        state = random.Random(f"routing:{seed}:{i}").getstate()
        for lang in L.LANGUAGES:
            rng = random.Random()
            rng.setstate(state)  # the same question and options in every language
            contents.append(f"{IMAGE_TOKEN}\n{qa.question(s, rng, lang, 'choice').question}")
            images.append(s)
            langs.append(lang)
            halves.append(i % 2)
    return decode(gates(model, proc, rendered(model, proc, contents), images), langs, halves)


def by_question(model, proc, contents: list[str], images: list, langs: list[str],
                questions: list[list[int]]) -> dict[str, Any] | None:
    """The report on an evaluation's own rows (``contents[i]``, the user turn of row i, about ``images[i]``): each
    question's gates averaged over its rows' distinct prompts (its rotated copies), its language decoded with each
    language's questions alternating between fitting the centroids and testing them; None with fewer than two
    languages or a language of fewer than two questions."""
    from collections import Counter

    asked = [langs[q[0]] for q in questions]
    counts = Counter(asked)
    if len(counts) < 2 or min(counts.values()) < 2:
        return None
    prompts, means = rendered(model, proc, contents), []
    for q in questions:
        distinct: dict[str, int] = {}
        for i in q:
            distinct.setdefault(contents[i], i)
        rows = list(distinct.values())
        means.append(gates(model, proc, [prompts[i] for i in rows], [images[i] for i in rows]).mean(0))
    seen: Counter = Counter()
    halves = []
    for lang in asked:
        halves.append(seen[lang] % 2)
        seen[lang] += 1
    return decode(torch.stack(means), asked, halves)
