"""Building ``ref:llava`` as LLaVA is built, at toy scale: (1) a Llama pre-trained on text only (code plus scene
descriptions and QA in six languages, so it is multilingual before it sees an image, as Parrot's Qwen is); (2) a
CLIP tower trained contrastively on English captions, then frozen; (3) stage 1, the projector alone on English
captions. Reported: text-only QA accuracy per language, linear-probe accuracy of the frozen tower's layer -2 on digit,
colour and cell, and the held-out stage-1 caption loss."""

from __future__ import annotations

import math
import time
from functools import partial
from typing import Any

import torch

from llmx.core.zoo.corpus import Corpus
from llmx.core.zoo.request import RefRequest

PROBE_TARGETS = ("digit", "colour", "cell")


def build(req: RefRequest, corp: Corpus, tok: Any, show: bool) -> tuple[Any, Any, dict[str, Any]]:
    """Train every part: the model, its processor and the build's figures."""
    from transformers import AutoModelForCausalLM, LlavaForConditionalGeneration

    from llmx.core.data import join_documents
    from llmx.core.models.archs import config
    from llmx.core.multimodal import model as M
    from llmx.core.progress import note, track
    from llmx.core.tokenizer import train_bpe
    from llmx.core.zoo.build import weights_step
    from llmx.core.zoo.corpus import special_ids
    from llmx.core.zoo.train import pretrain

    spec = req.spec
    t0 = time.perf_counter()
    tok = tok if tok is not None else train_bpe(corp.train, spec.vocab)
    image_id = M.add_image_token(tok)
    train_ids, val_ids = join_documents(tok, corp.train), join_documents(tok, corp.validation)
    torch.manual_seed(req.seed)
    lm = AutoModelForCausalLM.from_config(config("llama", len(tok), spec.hidden, spec.layers, heads=spec.heads,
                                                 kv_heads=spec.kv_heads, special_ids=special_ids(tok)))
    if show:
        note(f"building {req.ref_name or 'llava'} ({req.preset} preset), once: text model, CLIP tower, stage 1")
    progress = partial(track, enabled=show)
    text = pretrain(lm, train_ids, val_ids, spec, req.seed, req.max_steps, progress=progress)
    instruct_loss = instruct(lm, tok, spec, req.seed, progress)
    text_qa = text_accuracy(lm, tok, spec, req.seed, progress)
    vision = M.vision_config(spec.image_size, spec.patch, spec.vision_hidden, spec.vision_layers, spec.vision_heads)
    clip, clip_loss = train_clip(tok, vision, spec, req.seed, progress)
    probe = linear_probe(clip.vision_model, spec, req.seed)
    torch.manual_seed(req.seed)
    model = LlavaForConditionalGeneration(M.llava_config(lm.config, vision, image_id))
    model.model.language_model.load_state_dict(lm.model.state_dict())
    model.lm_head.load_state_dict(lm.lm_head.state_dict())
    model.model.vision_tower.load_state_dict(clip.vision_model.state_dict())
    proc = M.processor(tok, spec.image_size, spec.patch)
    before, after = stage1(model, proc, spec, req.seed, progress)
    figures = {"text_val_perplexity": math.exp(text.best_eval), "instruct_loss": instruct_loss, "text_qa_accuracy": text_qa,
               "clip_final_loss": clip_loss, "probe_accuracy": probe,
               "stage1_caption_loss_before": before, "stage1_caption_loss": after,
               "image_tokens": M.image_tokens(model), "train_tokens": len(train_ids), "val_tokens": len(val_ids),
               "steps_run": text.steps, "best_step": text.best_step,
               "weights_step": weights_step(text, spec.patience), "best_val_nll": text.best_eval,
               "tokens_seen": text.steps * spec.batch * spec.seq_len,
               "build_seconds": round(time.perf_counter() - t0, 1)}
    return model.eval(), proc, figures


def _text_questions(count: int, split: str, seed: int, languages: dict, formats: dict) -> list:
    """Questions with the caption in place of the image (``qa.as_text``)."""
    from llmx.core.multimodal.qa import as_text, conversations

    return [as_text(c) for c in conversations(count, split, seed, languages, formats)]


def instruct(lm, tok, spec, seed: int, progress) -> float:
    """Text-only instruction tuning, as Vicuna and Qwen-chat are tuned before LLaVA / Parrot see an image: questions
    about captioned train scenes in the six languages, loss on the answers. At this scale pre-training alone does not
    teach the model to read its context (text QA stays at chance after 2500 steps); this stage does."""
    from llmx.core.multimodal import languages as L
    from llmx.core.multimodal import train as T
    from llmx.core.multimodal.batch import examples
    from llmx.core.train.loop import TrainConfig, train

    rows = _text_questions(spec.instruct_rows, "train", seed, dict.fromkeys(L.LANGUAGES, 1.0),
                           {"open": 1.0, "choice": 1.0})
    items = examples(tok, rows, 0, 4 * spec.seq_len)
    pad = tok.pad_token_id
    result = train(lm, dict(lm.named_parameters()), T.loss_fn(lm, items, spec.batch * 2, seed, pad),
                   TrainConfig(steps=spec.instruct_steps, lr=spec.lr, warmup=max(1, round(0.03 * spec.instruct_steps)),
                               weight_decay=0.1), progress=progress, weight=T.weights(items, spec.batch * 2, seed))
    return result.last_loss


def text_accuracy(lm, tok, spec, seed: int, progress) -> dict[str, Any]:
    """Held-out scenes (unseen handwriting, another seed), the caption in place of the image: open and
    multiple-choice accuracy per language of the text model alone."""
    from llmx.core.multimodal import languages as L
    from llmx.core.multimodal.answer import generate, judge, per_language

    out: dict[str, Any] = {}
    for fmt in ("open", "choice"):
        convs = [c for lang in L.LANGUAGES for c in _text_questions(spec.qa_questions, "test", seed + 1,
                                                                        {lang: 1.0}, {fmt: 1.0})]
        replies = generate(lm.eval(), tok, convs, 0, max_new_tokens=6)
        scores = [judge(c, r) for c, r in zip(convs, replies, strict=True)]
        table = per_language([c.meta["language"] for c in convs], scores)
        out[fmt] = {lang: round(v["accuracy"], 4) for lang, v in table.items()}
    return out


def _captions(count: int, split: str, seed: int, objects: int | None = None) -> list:
    from llmx.core.multimodal.qa import conversations

    return conversations(count, split, seed, {"en": 1.0}, {"caption": 1.0}, objects)


def train_clip(tok, vision, spec, seed: int, progress) -> tuple[Any, float]:
    """A tiny ``CLIPModel`` trained with the symmetric InfoNCE loss on English captions of train scenes (rows with
    the same caption are all positives of each other). The text side pools the last real token itself
    (transformers' CLIP pools at ``argmax(input_ids)`` when eos is id 2)."""
    from transformers import CLIPConfig, CLIPModel, CLIPTextConfig

    from llmx.core.data.sampling import EpochOrder
    from llmx.core.multimodal.batch import pixel_values
    from llmx.core.multimodal.model import processor
    from llmx.core.train.loop import TrainConfig, train

    text = CLIPTextConfig(vocab_size=len(tok), hidden_size=spec.vision_hidden, intermediate_size=4 * spec.vision_hidden,
                          num_hidden_layers=2, num_attention_heads=spec.vision_heads, max_position_embeddings=256,
                          projection_dim=spec.vision_hidden, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    clip = CLIPModel(CLIPConfig(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                projection_dim=spec.vision_hidden))
    proc = processor(tok, spec.image_size, spec.patch)
    rows = _captions(spec.clip_batch * 100, "train", seed, spec.clip_objects)
    pixels = pixel_values(proc, [c.pil() for c in rows])
    ids = [tok(c.messages[1]["content"], add_special_tokens=False)["input_ids"][:255] + [tok.eos_token_id]
           for c in rows]
    captions = [c.messages[1]["content"] for c in rows]
    order = EpochOrder(len(rows), seed)

    def loss(i: int) -> torch.Tensor:  # each row once per epoch; rows with equal captions are positives
        pick = order.batch(i, spec.clip_batch)
        width = max(len(ids[k]) for k in pick)
        x = torch.zeros(len(pick), width, dtype=torch.long, device=pixels.device)
        mask = torch.zeros_like(x)
        for r, k in enumerate(pick):
            x[r, :len(ids[k])], mask[r, :len(ids[k])] = torch.tensor(ids[k], device=x.device), 1
        hidden = clip.text_model(input_ids=x, attention_mask=mask).last_hidden_state
        t = clip.text_projection(hidden[torch.arange(len(pick), device=hidden.device), mask.sum(1) - 1])
        v = clip.visual_projection(clip.vision_model(pixel_values=pixels[pick]).pooler_output)
        t, v = torch.nn.functional.normalize(t, dim=-1), torch.nn.functional.normalize(v, dim=-1)
        logits = clip.logit_scale.exp() * v @ t.T
        same = torch.tensor([[captions[a] == captions[b] for b in pick] for a in pick], dtype=logits.dtype,
                            device=logits.device)
        target = same / same.sum(1, keepdim=True)  # one-digit scenes share captions (480 distinct): all positives
        return (torch.nn.functional.cross_entropy(logits, target) + torch.nn.functional.cross_entropy(logits.T, target)) / 2

    result = train(clip, clip.parameters(), loss, TrainConfig(steps=spec.clip_steps, lr=spec.clip_lr, warmup=10,
                                                              weight_decay=0.1), progress=progress)
    clip.eval()
    for p in clip.parameters():
        p.requires_grad_(False)
    return clip, result.last_loss


@torch.no_grad()
def probe_features(vision_model, pixels: torch.Tensor) -> torch.Tensor:
    """What LLaVA reads: layer -2 of the tower, as CLS and the mean of the patch tokens side by side."""
    hidden = vision_model(pixel_values=pixels, output_hidden_states=True).hidden_states[-2]
    return torch.cat([hidden[:, 0], hidden[:, 1:].mean(1)], -1)


def linear_probe(vision_model, spec, seed: int) -> dict[str, float]:
    """Logistic-regression accuracy on one-digit test scenes (unseen handwriting) of the frozen tower's features."""
    from sklearn.linear_model import LogisticRegression

    from llmx.core.multimodal.batch import pixel_values
    from llmx.core.multimodal.model import processor
    from llmx.core.multimodal.scenes import scenes
    from llmx.core.tokenizer import byte_tokenizer

    proc = processor(byte_tokenizer(), spec.image_size, spec.patch)
    data = {}
    for split, n in (("train", spec.probe_scenes), ("test", spec.probe_scenes // 2)):
        sc = scenes(n, split, seed + 7, objects=1)
        feats = probe_features(vision_model, pixel_values(proc, [s.image() for s in sc])).cpu().numpy()
        data[split] = (feats, {t: [getattr(s.objects[0], t) for s in sc] for t in PROBE_TARGETS})
    out = {}
    for t in PROBE_TARGETS:
        clf = LogisticRegression(max_iter=3000, C=1.0).fit(data["train"][0], data["train"][1][t])
        out[t] = float(clf.score(data["test"][0], data["test"][1][t]))
    return out


def stage1(model, proc, spec, seed: int, progress) -> tuple[float, float]:
    """LLaVA stage 1 (feature alignment): the projector alone on English captions; held-out loss before and after."""
    from llmx.core.multimodal import train as T
    from llmx.core.multimodal.batch import examples
    from llmx.core.multimodal.model import image_tokens
    from llmx.core.train.loop import TrainConfig, train

    n = image_tokens(model)
    items = examples(proc, _captions(spec.stage1_batch * 50, "train", seed), n, 256)
    held = examples(proc, _captions(48, "test", seed), n, 256)
    pad = proc.tokenizer.pad_token_id
    params = T.trainable(model, 1)
    before = T.heldout_loss(model, held, pad)
    train(model, params, T.loss_fn(model, items, spec.stage1_batch, seed, pad),
          TrainConfig(steps=spec.stage1_steps, lr=spec.stage1_lr, warmup=max(1, round(0.03 * spec.stage1_steps)),
                      min_lr_ratio=0.0, betas=(0.9, 0.999)), progress=progress,
          weight=T.weights(items, spec.stage1_batch, seed))
    for p in model.parameters():
        p.requires_grad_(False)
    return before, T.heldout_loss(model, held, pad)
