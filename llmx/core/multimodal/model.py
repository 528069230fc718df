"""The LLaVA layout llmx builds and loads: ``LlavaForConditionalGeneration`` (a CLIP vision tower read at layer -2,
an ``mlp2x_gelu`` projector, a causal LM) with its ``LlavaProcessor``. ``vision_feature_select_strategy: full``
keeps the CLS token, so an image is (size / patch)^2 + 1 tokens; ``default`` drops it, as LLaVA-1.5 does."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

IMAGE_TOKEN = "<image>"
# LLaVA-1.5's vicuna_v1 turns without the system line: "USER: <image>\n... ASSISTANT: ...</s>". Content is a string
# (llmx's rows) or a list of image/text parts (transformers' multimodal messages).
CHAT_TEMPLATE = ("{% for m in messages %}{% if m['content'] is string %}{% set c = m['content'] %}{% else %}"
                 "{% set c = namespace(t='') %}{% for p in m['content'] %}{% if p['type'] == 'image' %}"
                 "{% set c.t = c.t + '<image>\n' %}{% else %}{% set c.t = c.t + p['text'] %}{% endif %}{% endfor %}"
                 "{% set c = c.t %}{% endif %}{% if m['role'] == 'assistant' %}ASSISTANT: {{ c }}</s>"
                 "{% else %}USER: {{ c }} {% endif %}{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}")


def user_turn(content: str) -> str:
    """A user turn as the chat template renders it, for text-only documents in the same format."""
    return f"USER: {content} "


def assistant_turn(content: str) -> str:
    return f"ASSISTANT: {content}</s>"


def is_vision_language(path: str | Path) -> bool:
    """Whether a model folder holds a LLaVA model (``model_type: llava``; other vision-language layouts such as
    LLaVA-NeXT or Qwen2-VL are not loaded as LLaVA)."""
    import json

    f = Path(path) / "config.json"
    if not f.is_file():
        return False
    try:
        return json.loads(f.read_text()).get("model_type") == "llava"
    except (json.JSONDecodeError, AttributeError):
        return False


def vision_language(model, proc, name: str | None = None):
    """``(model, processor)``, or a usage error when ``model`` is not a vision-language model with a processor."""
    if not hasattr(model.config, "vision_config") or not hasattr(proc, "image_processor"):
        from llmx.errors import UsageError

        raise UsageError(f"{name or 'the model'} is not a vision-language model with a processor (a LLaVA folder, "
                         "ref:llava or ref:llava-test)")
    return model, proc


def vision_config(image_size: int, patch: int, hidden: int, layers: int, heads: int):
    from transformers import CLIPVisionConfig

    return CLIPVisionConfig(hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                            num_attention_heads=heads, image_size=image_size, patch_size=patch, projection_dim=hidden)


def llava_config(text_config, vision: Any, image_token_id: int):
    from transformers import LlavaConfig

    tokens = (vision.image_size // vision.patch_size) ** 2 + 1
    return LlavaConfig(vision_config=vision, text_config=text_config, image_token_index=image_token_id,
                       projector_hidden_act="gelu", vision_feature_select_strategy="full", vision_feature_layer=-2,
                       image_seq_length=tokens, multimodal_projector_bias=True, tie_word_embeddings=False)


def processor(tok, image_size: int, patch: int):
    """A ``LlavaProcessor`` for a CLIP tower of this geometry (CLIP's normalisation; ``padding``'s square, resized to
    the tower's size), expanding ``<image>`` to patches + CLS."""
    from transformers import LlavaImageProcessorPil, LlavaProcessor

    images = LlavaImageProcessorPil(do_pad=True, size={"shortest_edge": image_size},
                                    crop_size={"height": image_size, "width": image_size})
    return LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=patch, vision_feature_select_strategy="full",
                          num_additional_image_tokens=1, image_token=IMAGE_TOKEN, chat_template=CHAT_TEMPLATE)


def padding(images):
    """An image processor that pads each image to a square of its longer side with its mean colour before resizing
    (LLaVA-1.5's and Parrot's ``image_aspect_ratio: pad``, ``expand2square``), so a wide image keeps its edges where
    CLIP's processor would crop them: ``images`` itself when it pads, else a ``LlavaImageProcessorPil`` with its
    settings and ``do_pad``. Saved with the model, it gives plain transformers llmx's pixels."""
    from transformers import LlavaImageProcessorPil

    if getattr(images, "do_pad", False):
        return images
    settings = {k: v for k, v in images.to_dict().items()
                if k not in ("image_processor_type", "processor_class") and not k.startswith("_")}
    return LlavaImageProcessorPil(**{**settings, "do_pad": True})


def add_image_token(tok) -> int:
    """Register ``<image>`` as a special token (and the chat template); returns its id."""
    if IMAGE_TOKEN not in tok.get_vocab():
        tok.add_tokens([IMAGE_TOKEN], special_tokens=True)
    tok.chat_template = CHAT_TEMPLATE
    return tok.convert_tokens_to_ids(IMAGE_TOKEN)


def image_tokens(model) -> int:
    """How many ``<image>`` placeholders one image fills in ``model``."""
    v = model.config.vision_config
    grid = (v.image_size // v.patch_size) ** 2
    return grid + (1 if model.config.vision_feature_select_strategy == "full" else 0)


def load(path: str | Path, dtype, device: str, local: bool = True) -> tuple[Any, Any]:
    """A LLaVA folder or hub id: the model (with its visual adapter, where the folder stores one) and its processor."""
    from transformers import AutoConfig, AutoProcessor, LlavaForConditionalGeneration

    from llmx.core.multimodal.adapter import attach_saved

    config = AutoConfig.from_pretrained(str(path), local_files_only=local)
    if hasattr(config, "transformers_weights"):  # the marker turning plain transformers away (adapter.ADAPTED_ONLY)
        if not local:  # the adapter is rebuilt from a local folder only: without it the model would answer differently
            from llmx.errors import UsageError

            raise UsageError(f"{path}: an llmx-only folder (its visual adapter, e.g. Parrot's MoE, is not loaded from "
                             "the hub): download it and give the local folder")
        delattr(config, "transformers_weights")
    model = LlavaForConditionalGeneration.from_pretrained(str(path), config=config, dtype=dtype, local_files_only=local)
    if local:
        model = attach_saved(model, Path(path), dtype)
    proc = AutoProcessor.from_pretrained(str(path), local_files_only=local)
    proc.image_processor = padding(proc.image_processor)
    return model.to(device), proc


def text_tokenizer(tok_or_processor) -> Any:
    """The text tokenizer of a processor (or the tokenizer itself), rendering conversations in LLaVA-1.5's format.
    A llava-hf folder's own template wants list content; llmx renders the vicuna_v1 turns itself, as LLaVA's
    training code does (``conversation.py``), so every model is trained and asked in the same format."""
    tok = getattr(tok_or_processor, "tokenizer", tok_or_processor)
    if getattr(tok, "chat_template", None) == CHAT_TEMPLATE:
        return tok
    tok = copy.copy(tok)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def embed(model, input_ids: torch.Tensor, pixel_values: torch.Tensor | None) -> torch.Tensor:
    """Input embeddings with the projected image features scattered into the ``<image>`` positions: what LLaVA's
    forward computes from pixels, exposed so a method can change the features (Parrot's MoE) before the LM."""
    embeds = model.get_input_embeddings()(input_ids)
    if pixel_values is None:
        return embeds
    feats = model.model.get_image_features(pixel_values=pixel_values.to(embeds.dtype),
                                           vision_feature_layer=model.config.vision_feature_layer,
                                           vision_feature_select_strategy=model.config.vision_feature_select_strategy)
    feats = torch.cat(list(feats.pooler_output), 0).to(embeds.dtype)
    mask = (input_ids == model.config.image_token_id).unsqueeze(-1).expand_as(embeds)
    if int(mask[..., 0].sum()) != feats.shape[0]:
        raise ValueError(f"{int(mask[..., 0].sum())} image tokens for {feats.shape[0]} image features")
    return embeds.masked_scatter(mask, feats)
