"""A LLaVA model whose projected image features pass through a text-conditioned module before the language model
(Parrot's language-conditioned MoE is one). ``LlavaForConditionalGeneration``'s projector never sees the text, so
swapping ``multi_modal_projector`` cannot condition on it: ``AdaptedLlava`` embeds the tokens itself, runs
``visual_adapter(features, text, mask)`` on each image's features with its own row's text embeddings, scatters the
result into the ``<image>`` positions and hands ``inputs_embeds`` to the real HF forward (``generate`` included: the
prefill carries the pixels, later steps are plain tokens).

The text a row conditions on is every non-image, non-padding token whose label is ignored: in training all but the
answer tokens, at inference the whole prompt (Parrot's ``prepare_inputs_labels_for_multimodal``; generating without
a cache re-reads the grown text at every step, as the official forward would). In training a row
without an image still runs the adapter on a blank image and adds its zero-length slice, so every data-parallel rank
uses the adapter's parameters.

Saved, the folder is a LLaVA folder plus ``visual_adapter.json`` (the stored layer type and its configuration) and
``visual_adapter.safetensors``; llmx's loader rebuilds the adapter through the plugin that registered the layer type,
and a configuration or tensor that does not match the model is an error, never a silent re-initialisation. Plain
``from_pretrained`` would load the LLaVA model without the adapter and answer differently, so the config names a
``transformers_weights`` file that is not one (``ADAPTED_ONLY``, as llmx's packed-layer folders do,
``models.mark_llmx_only``): transformers refuses the folder with that message, llmx's loader drops the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import LlavaForConditionalGeneration

from llmx.errors import UsageError

SPEC_FILE = "visual_adapter.json"
WEIGHTS_FILE = "visual_adapter.safetensors"
PREFIX = "visual_adapter."
IGNORE = -100
ADAPTED_ONLY = ("llmx-only folder: its visual adapter (visual_adapter.json, e.g. Parrot's MoE) runs in llmx; plain "
                "transformers would load the LLaVA model without it and answer differently. Load it with llmx "
                "(llmx.load(folder), --model folder)")


class AdaptedLlava(LlavaForConditionalGeneration):
    """``LlavaForConditionalGeneration`` with ``visual_adapter``: ``(features (B, N, d), text (B, T, d), mask (B, T))
    -> (B, N, d)``, and ``adapter_spec() -> dict`` naming its stored layer type and configuration."""

    visual_adapter: torch.nn.Module

    @classmethod
    def adopt(cls, model: LlavaForConditionalGeneration, adapter: torch.nn.Module) -> AdaptedLlava:
        """``model`` itself (no copy of its weights) as an ``AdaptedLlava`` carrying ``adapter`` (replacing any)."""
        if not isinstance(model, LlavaForConditionalGeneration):
            raise UsageError(f"a visual adapter needs a LLaVA model, not {type(model).__name__}")
        model.__class__ = cls
        p = next(model.parameters())
        model.visual_adapter = adapter.to(device=p.device, dtype=p.dtype)
        return model

    def text_mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                  labels: torch.Tensor | None) -> torch.Tensor:
        """(B, T) bool: the tokens the adapter reads (not image, not padding, not a trained answer token)."""
        mask = input_ids != self.config.image_token_id
        if attention_mask is not None:
            mask &= attention_mask.bool()
        if labels is not None:
            mask &= labels == IGNORE
        return mask

    def image_features(self, pixel_values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """(images, N, d): the projected features, CLS first under the ``full`` strategy."""
        feats = self.model.get_image_features(pixel_values=pixel_values.to(dtype),
                                              vision_feature_layer=self.config.vision_feature_layer,
                                              vision_feature_select_strategy=self.config.vision_feature_select_strategy)
        return torch.stack(list(feats.pooler_output)).to(dtype)

    def adapt(self, features: torch.Tensor, text: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The adapter in its own (master-weight) dtype, the result in the features' dtype."""
        dtype = next(self.visual_adapter.parameters()).dtype
        return self.visual_adapter(features.to(dtype), text.to(dtype), mask).to(features.dtype)

    def adapted_embeds(self, input_ids: torch.Tensor, pixel_values: torch.Tensor | None,
                       attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Input embeddings with each image's adapted features in its row's ``<image>`` positions."""
        embeds = self.get_input_embeddings()(input_ids)
        text = self.text_mask(input_ids, attention_mask, labels)
        placeholders = input_ids == self.config.image_token_id
        rows = placeholders.any(1)
        if pixel_values is not None:
            feats = self.image_features(pixel_values, embeds.dtype)
            if feats.shape[0] != int(rows.sum()) or feats.shape[0] * feats.shape[1] != int(placeholders.sum()):
                raise ValueError(f"{int(placeholders.sum())} image tokens in {int(rows.sum())} rows for "
                                 f"{feats.shape[0]} images of {feats.shape[1]} features (one image per row)")
            out = self.adapt(feats, embeds[rows], text[rows])
            embeds = embeds.masked_scatter(placeholders.unsqueeze(-1), out)
        elif rows.any():
            raise ValueError("image tokens without pixel_values")
        if self.training and not rows.all():
            embeds = embeds + self._blank_slice(embeds[~rows], text[~rows])
        return embeds

    def _blank_slice(self, embeds: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """The adapter run on a blank image for text-only rows, as a zero-length slice summed: exactly 0, in the graph."""
        size = self.config.vision_config.image_size
        blank = torch.zeros(1, 3, size, size, device=embeds.device, dtype=embeds.dtype)
        feats = self.image_features(blank, embeds.dtype).expand(embeds.shape[0], -1, -1)
        return self.adapt(feats, embeds, text)[:, :0].sum()

    def forward(self, input_ids: torch.Tensor | None = None, pixel_values: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                past_key_values: Any = None, inputs_embeds: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, logits_to_keep: int | torch.Tensor = 0, **kwargs: Any):
        """LLaVA's forward with the adapted features; ``labels`` also say which tokens are answers (the adapter never
        reads them), so pass them whenever a forward scores answers. No ``mm_encoder_outputs``: precomputed features
        would skip the adapter (``generate`` sees the parameter missing and passes pixels)."""
        common = {"attention_mask": attention_mask, "position_ids": position_ids, "past_key_values": past_key_values,
                  "labels": labels, "logits_to_keep": logits_to_keep, **kwargs}
        if inputs_embeds is not None or input_ids is None or (pixel_values is None and not self.training):
            if pixel_values is not None:
                raise ValueError("a visual adapter needs input_ids with pixel_values (it reads the row's text)")
            return super().forward(input_ids=input_ids, inputs_embeds=inputs_embeds, **common)
        embeds = self.adapted_embeds(input_ids, pixel_values, attention_mask, labels)
        return super().forward(inputs_embeds=embeds, **common)

    def save_pretrained(self, save_directory, *args, state_dict: dict | None = None, **kwargs) -> None:
        """A LLaVA folder (architecture ``LlavaForConditionalGeneration``) that plain transformers refuses, plus the
        adapter's two files."""
        from safetensors.torch import save_file

        state = state_dict if state_dict is not None else self.state_dict()
        super().save_pretrained(save_directory, *args, state_dict={k: v for k, v in state.items()
                                                                   if not k.startswith(PREFIX)}, **kwargs)
        folder = Path(save_directory)
        config = folder / "config.json"
        data = json.loads(config.read_text())
        data["architectures"] = [LlavaForConditionalGeneration.__name__]
        data["transformers_weights"] = ADAPTED_ONLY
        config.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        (folder / SPEC_FILE).write_text(json.dumps(self.visual_adapter.adapter_spec(), indent=2) + "\n")
        save_file({k[len(PREFIX):]: v.detach().contiguous().cpu() for k, v in state.items() if k.startswith(PREFIX)},
                  str(folder / WEIGHTS_FILE))


def attach_saved(model: LlavaForConditionalGeneration, path: Path, dtype: torch.dtype) -> LlavaForConditionalGeneration:
    """``model`` with the adapter stored in ``path`` (when there is one), rebuilt by the plugin that registered its
    layer type (a name read from a file never picks the code that runs)."""
    spec_file = Path(path) / SPEC_FILE
    if not spec_file.is_file():
        return model
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from llmx.core.plugins import host
    from llmx.core.spec import load_object

    try:
        spec = json.loads(spec_file.read_text())
        tensors = load_file(str(Path(path) / WEIGHTS_FILE))
    except (OSError, ValueError, SafetensorError) as exc:  # JSONDecodeError is a ValueError
        raise UsageError(f"{path}: cannot read the visual adapter ({exc})") from exc
    layers = host().layers
    if spec.get("layer") not in layers:
        raise UsageError(f"{spec_file}: visual adapter type {spec.get('layer')!r} is provided by no installed plugin",
                         hint=f"Known: {', '.join(sorted(layers))}.")
    try:
        adapter = load_object(layers[spec["layer"]].builder)(spec, tensors, dtype, model.config)
    except (RuntimeError, KeyError, ValueError, TypeError) as exc:
        said = " ".join(x.strip() for x in str(exc).strip().splitlines())
        raise UsageError(f"{path}: the visual adapter does not match this model ({said[:240]})") from exc
    return AdaptedLlava.adopt(model, adapter)
