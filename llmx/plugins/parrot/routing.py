"""How Parrot's gates separate languages: the same held-out images asked the same question in every language, the
gates ``g`` of each prompt as generation computes them (all prompt tokens), and a nearest-centroid language
classifier on ``g`` fitted on half the scenes and scored on the other half (chance 1/languages; the notes' check 4)."""

from __future__ import annotations

from typing import Any

import torch

from llmx.core.multimodal import languages as L


@torch.no_grad()
def gates(model, proc, prompts: list[str], images: list) -> torch.Tensor:
    """(n, experts): each rendered prompt's gates with its image (a PIL image or a scene)."""
    from llmx.core.multimodal.batch import pixel_values
    from llmx.core.multimodal.model import text_tokenizer

    tok = text_tokenizer(proc)
    device = next(model.parameters()).device
    out = []
    for prompt, image in zip(prompts, images, strict=True):
        ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]], device=device)
        pil = image.image() if hasattr(image, "image") else image
        embeds = model.get_input_embeddings()(ids)
        feats = model.image_features(pixel_values(proc, [pil]).to(device), embeds.dtype)
        moe = model.visual_adapter
        dtype = next(moe.parameters()).dtype
        out.append(moe.routing(feats.to(dtype), embeds.to(dtype), model.text_mask(ids, None, None)).float().cpu())
    return torch.cat(out)


def report(model, proc, count: int, seed: int) -> dict[str, Any]:
    """Per language the mean gates and the top expert; the held-out nearest-centroid language accuracy."""
    import random

    from llmx.core.multimodal import qa
    from llmx.core.multimodal.model import IMAGE_TOKEN, image_tokens, text_tokenizer
    from llmx.core.multimodal.scenes import scenes

    tok, n = text_tokenizer(proc), image_tokens(model)
    shown = scenes(count, "test", seed + 3000)
    prompts, images, langs, halves = [], [], [], []
    for i, s in enumerate(shown):
        state = random.Random(f"routing:{seed}:{i}").getstate()
        for lang in L.LANGUAGES:
            rng = random.Random()
            rng.setstate(state)  # the same question and options in every language
            asked = qa.question(s, rng, lang, "choice").question
            prompts.append(tok.apply_chat_template([{"role": "user", "content": f"{IMAGE_TOKEN * n}\n{asked}"}],
                                                   tokenize=False, add_generation_prompt=True))
            images.append(s)
            langs.append(lang)
            halves.append(i % 2)
    g = gates(model, proc, prompts, images)
    by_lang = {lang: g[[k for k, x in enumerate(langs) if x == lang]] for lang in L.LANGUAGES}
    fit = {lang: g[[k for k, x in enumerate(langs) if x == lang and halves[k] == 0]].mean(0) for lang in L.LANGUAGES}
    test = [k for k in range(len(langs)) if halves[k] == 1]
    centroids = torch.stack([fit[lang] for lang in L.LANGUAGES])
    guess = torch.cdist(g[test], centroids).argmin(1)
    right = sum(L.LANGUAGES[int(j)] == langs[k] for j, k in zip(guess, test, strict=True))
    return {"language_accuracy": right / len(test), "chance": 1 / len(L.LANGUAGES),
            "top_expert": {lang: int(v.mean(0).argmax()) for lang, v in by_lang.items()},
            "mean_gates": {lang: [round(float(x), 4) for x in v.mean(0)] for lang, v in by_lang.items()}}
