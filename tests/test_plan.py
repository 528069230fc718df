"""``llmx plan`` and ``llmx.core.train.plan``: per-rank memory of a training stage from a config folder with no
weights, checked against parameter counts worked out by hand from the architectures' shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmx.core.models.meta import model_config
from llmx.core.train.plan import ALIGN, plan_stage

LLAMA3_8B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
             "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False, "hidden_act": "silu"}
MIXTRAL_8X7B = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_size": 4096,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
                "max_position_embeddings": 32768, "tie_word_embeddings": False, "hidden_act": "silu"}


def hand_count(c: dict) -> int:
    """Embeddings and head, then per layer q/o (d x d), k/v (d x kv), the SwiGLU MLP (3 d f) per expert, the
    router (d x experts) and two RMSNorms; a final norm."""
    d, f, layers, kv = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["num_key_value_heads"]
    kv_width = kv * d // c["num_attention_heads"]
    experts = c.get("num_local_experts", 1)
    layer = 2 * d * d + 2 * d * kv_width + experts * 3 * d * f + (d * experts if experts > 1 else 0) + 2 * d
    return 2 * c["vocab_size"] * d + layers * layer + d


def folder(tmp_path: Path, config: dict, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture
def llama(tmp_path) -> Path:
    return folder(tmp_path, LLAMA3_8B, "llama-3-8b")


def sft(**params):
    from llmx.core.train.sft.params import SFTParams

    return SFTParams(**{"data": "rows.jsonl", "max_length": 2048, "batch_size": 1, **params})


def dpo(**params):
    from llmx.plugins.align_baselines.config import DPOParams

    return DPOParams(**{"data": "pairs.jsonl", "max_len": 1024, "batch_size": 1, **params})


def test_llama3_8b_full_finetune_fp32_holds_weights_gradients_and_two_moments(llama):
    count = hand_count(LLAMA3_8B)
    assert count == 8_030_261_248
    p = plan_stage(model_config(str(llama)), sft(), 1)
    assert p.parameters == p.trainable == count
    assert p.part("weights").device == p.part("gradients").device == 4 * count  # ~32 GB each
    assert p.part("optimizer").device == 8 * count  # ~64 GB
    assert p.part("reference").device == p.part("collectives").device == p.part("casts").device == 0
    assert p.part("step").device == 4 * count  # AdamW's foreach temporaries
    assert p.total()[0] == sum(x.device for x in p.parts) and p.total()[1] == 0
    # the step phase (weights, moments, gradients, temporaries) is larger than forward + backward at 1 x 2048
    assert p.peak()[0] == 20 * count


def test_fsdp_divides_by_the_world_size_and_offload_moves_the_shards_to_cpu(llama):
    config = model_config(str(llama))
    one = plan_stage(config, sft(), 1)
    eight = plan_stage(config, sft(strategy="fsdp"), 8)
    for name in ("weights", "gradients", "optimizer", "step"):  # every Llama-3-8B dim 0 divides by 8: no padding
        assert eight.part(name).device * 8 == one.part(name).device
    assert eight.part("activations").device == one.part("activations").device  # batch_size is per process
    gathered = eight.part("collectives").device
    layer = 4 * (hand_count({**LLAMA3_8B, "num_hidden_layers": 1}) - hand_count({**LLAMA3_8B, "num_hidden_layers": 0}))
    embed, root = 4 * 128256 * 4096, 4 * (128256 * 4096 + 4096)  # the embeddings' unit; the root: head, final norm
    assert embed > layer
    assert gathered == root + root + (embed + layer) + embed  # root and its grads, two largest units, one's grads
    off = plan_stage(config, sft(strategy="fsdp", offload=True), 8)
    for name in ("weights", "gradients", "optimizer"):
        assert off.part(name).device == 0 and off.part(name).cpu == eight.part(name).device
    assert off.part("collectives").device == gathered  # the gathered units still compute on the device
    mixed = plan_stage(config, sft(strategy="fsdp", precision="bf16-mixed"), 8)
    assert mixed.part("collectives").device == (root + embed + layer) // 2 + root // 2 + embed  # gathered in bf16
    assert mixed.part("weights").device == eight.part("weights").device  # float32 master shards either way


def test_fsdp_pads_a_dimension_the_world_size_does_not_divide(tmp_path):
    config = model_config(str(folder(tmp_path, {**LLAMA3_8B, "vocab_size": 128257}, "odd-vocab")))
    p = plan_stage(config, sft(strategy="fsdp"), 8)
    even = plan_stage(model_config(str(folder(tmp_path, {**LLAMA3_8B, "vocab_size": 128264}, "padded"))), sft(), 1)
    assert p.part("weights").device * 8 == even.part("weights").device  # 128257 rows shard as 8 x 16033


def test_lora_trains_exactly_peft_s_adapter_tensors(llama):
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    lora = {"adapter": "lora", "lora": {"r": 16, "target_modules": ["q_proj", "v_proj"]}}
    p = plan_stage(model_config(str(llama)), sft(**lora))
    by_hand = 32 * 16 * ((4096 + 4096) + (4096 + 1024))  # A (r x in) and B (out x r) on q and v in 32 layers
    assert p.trainable == by_hand == 6_815_744
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config(str(llama)))
        wrapped = peft.get_peft_model(model, peft.LoraConfig(r=16, target_modules=["q_proj", "v_proj"]))
    assert p.trainable == wrapped.get_nb_trainable_parameters()[0]
    assert p.part("gradients").device == 4 * by_hand and p.part("optimizer").device == 8 * by_hand
    assert p.part("weights").device == 4 * (hand_count(LLAMA3_8B) + by_hand)
    bf16 = plan_stage(model_config(str(llama)), sft(**lora), dtype="bfloat16")
    assert bf16.part("weights").device == 2 * hand_count(LLAMA3_8B) + 4 * by_hand  # the frozen base as loaded


def test_dpo_keeps_a_reference_copy_unless_precomputed_or_lora(llama):
    config = model_config(str(llama))
    full = plan_stage(config, dpo(), 1, method="dpo")
    assert full.reference and full.part("reference").device == full.part("weights").device == 4 * hand_count(LLAMA3_8B)
    assert full.sequences == 2  # a pair's chosen and rejected rows
    assert plan_stage(config, dpo(precompute_ref_log_probs=True), 1, method="dpo").part("reference").device == 0
    lora = plan_stage(config, dpo(adapter="lora"), 1, method="dpo")
    assert not lora.reference and lora.part("reference").device == 0
    from llmx.plugins.align_baselines.config import SimPOParams

    assert plan_stage(config, SimPOParams(data="p.jsonl"), 1, method="simpo").part("reference").device == 0
    sharded = plan_stage(config, dpo(strategy="fsdp", offload=True), 8, method="dpo")
    assert sharded.part("reference").cpu == sharded.part("weights").cpu > 0  # placed as the policy's shards


def test_the_align_table_matches_the_objectives():
    from llmx.plugins.align_baselines import config as C
    from llmx.plugins.align_baselines import objectives as O
    from llmx.plugins.confpo.config import ConfPOParams
    from llmx.plugins.confpo.objective import ConfPO
    from llmx.plugins.pipa.objective import PIPA
    from llmx.plugins.prosec.config import ProsecAlignParams
    from llmx.plugins.prosec.objective import Objective

    cases = [("dpo", O.DPO(C.DPOParams(data="x"))), ("ipo", O.IPO(C.IPOParams(data="x"))),
             ("kto", O.KTO(C.KTOParams(data="x"))), ("simpo", O.SimPO(C.SimPOParams(data="x"))),
             ("pipa", PIPA), ("confpo", ConfPO(ConfPOParams(data="x", base="dpo"))),
             ("confpo", ConfPO(ConfPOParams(data="x", base="simpo"))),
             ("prosec", Objective(ProsecAlignParams(data="x", loss="dpo"))),
             ("prosec", Objective(ProsecAlignParams(data="x", loss="simpo")))]
    for name, objective in cases:
        sequences, reads = ALIGN[name]
        assert reads(getattr(objective, "p", None)) == objective.needs_reference, name
        assert sequences == (2 if "paired" in objective.kinds else 1), name


def test_mixtral_counts_every_expert_and_activates_the_top_k(tmp_path):
    path = folder(tmp_path, MIXTRAL_8X7B, "mixtral")
    p = plan_stage(model_config(str(path)), sft(max_length=512), 1)
    assert p.parameters == hand_count(MIXTRAL_8X7B) == 46_702_792_704
    top1 = plan_stage(model_config(str(folder(tmp_path, {**MIXTRAL_8X7B, "num_experts_per_tok": 1}, "top1"))),
                      sft(max_length=512), 1)
    d, f = 4096, 14336  # one more expert per token: its routed input, gate|up, SiLU, product and output, float32
    assert p.part("activations").device - top1.part("activations").device == 32 * 512 * 4 * (2 * d + 4 * f)


def test_gradient_checkpointing_keeps_each_layer_s_input_only(llama):
    config = model_config(str(llama))
    plain = plan_stage(config, sft(), 1).part("activations").device
    ckpt = plan_stage(config, sft(gradient_checkpointing=True), 1).part("activations").device
    assert ckpt < plain / 10
    mixed = plan_stage(config, sft(precision="bf16-mixed"), 1).part("activations").device
    assert mixed < plain  # matmul inputs and outputs in bfloat16
    assert plan_stage(config, sft(batch_size=2), 1).part("activations").device == 2 * plain  # per sequence


def test_bf16_mixed_under_ddp_holds_bf16_copies_of_the_matmul_weights(llama):
    p = plan_stage(model_config(str(llama)), sft(precision="bf16-mixed"), 1)
    assert p.part("casts").device == 2 * (hand_count(LLAMA3_8B) - 128256 * 4096 - 65 * 4096)  # no embedding, norms


def test_plan_json_document(cli, llama):
    r = cli("--json", "plan", "--method", "dpo", "--model", llama, "--world-size", "8", "--set", "strategy=fsdp",
            "--set", "max_len=2048", "--set", "gradient_checkpointing=true")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["ok"] and doc["world_size"] == 8 and doc["model"] == str(llama)
    (stage,) = doc["stages"]
    assert stage["method"] == "dpo" and stage["stage"] == "align" and stage["strategy"] == "fsdp"
    assert list(stage["parts"]) == ["weights", "gradients", "optimizer", "reference", "activations", "logits",
                                    "collectives", "casts", "step", "loading"]
    assert stage["parameters"] == hand_count(LLAMA3_8B) and stage["length"] == 2048
    # fsdp loads the policy and the reference's copy in CPU memory (float32 here) before sharding them
    assert stage["parts"]["loading"] == {"device": 0, "cpu": 2 * 4 * hand_count(LLAMA3_8B), "phase": "load",
                                         "note": "the model in float32 in CPU memory until sharded"}
    assert stage["peak"]["cpu"] == 2 * 4 * hand_count(LLAMA3_8B)
    assert stage["parts"]["weights"]["device"] == 4 * hand_count(LLAMA3_8B) // 8
    assert stage["total"]["device"] == sum(v["device"] for v in stage["parts"].values())
    assert stage["peak"]["device"] <= stage["total"]["device"]


def test_plan_reads_the_world_size_from_the_environment_and_a_run_config(cli, llama, monkeypatch, tmp_path):
    recipe = tmp_path / "run.yaml"
    recipe.write_text(f"model: {llama}\npipeline:\n  - method: sft\n    params: {{data: rows.jsonl, strategy: fsdp}}\n"
                      "  - method: perplexity\n")
    monkeypatch.setenv("WORLD_SIZE", "4")
    doc = cli("--json", "plan", recipe).json()
    assert [s["method"] for s in doc["stages"]] == ["sft"] and doc["world_size"] == 4
    assert doc["stages"][0]["parts"]["weights"]["device"] == hand_count(LLAMA3_8B)  # 4 bytes / 4 ranks


def test_plan_table_and_the_dry_run(cli, llama, tmp_path):
    r = cli("plan", "--method", "sft", "--model", llama, "--set", "max_length=2048")
    assert r.code == 0 and "8,030,261,248 parameters" in r.out and "optimizer" in r.out and "GiB" in r.out
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n")
    dry = cli("--json", "--dry-run", "train", "--method", "sft", "--model", "tiny:llama", "--data", rows)
    assert dry.code == 0, dry.err
    (stage,) = dry.json()["plan"]
    assert stage["method"] == "sft" and stage["parameters"] > 0
    quant = cli("--json", "--dry-run", "quantize", "--method", "rtn", "--model", "tiny:llama")
    assert "plan" not in quant.json()  # nothing trains


@pytest.mark.parametrize("args, message", [
    (("--method", "sft", "--model", "tiny:llama", "--world-size", "0"), "--world-size must be at least 1"),
    (("--method", "rtn", "--model", "tiny:llama"), "rtn is not a training method"),
    (("--method", "sft", "--model", "tiny:mamba"), "attention decoders only"),
    (("--method", "sft", "--model", "./nowhere"), "model folder not found"),
    (("--method", "sft"), "needs a model"),
    ((), "needs a run config or --method"),
])
def test_bad_input_is_one_line_and_exit_2(cli, args, message):
    r = cli("plan", *args)
    assert r.code == 2 and message in r.err and "Traceback" not in r.err


def test_a_folder_without_a_config_or_with_a_broken_one_is_exit_2(cli, tmp_path):
    (tmp_path / "empty").mkdir()
    r = cli("plan", "--method", "sft", "--model", tmp_path / "empty")
    assert r.code == 2 and "no config.json" in r.err
    broken = folder(tmp_path, {"model_type": "no-such-architecture"}, "broken")
    r = cli("plan", "--method", "sft", "--model", broken)
    assert r.code == 2 and "not a model config" in r.err


def test_frozen_linears_keep_no_input(llama):
    """A LoRA policy on q and v: o_proj, gate/up and down_proj are frozen, so their inputs are not saved."""
    config = model_config(str(llama))
    full = plan_stage(config, sft(), 1).part("activations").device
    lora = plan_stage(config, sft(adapter="lora", lora={"r": 16, "target_modules": ["q_proj", "v_proj"]}), 1)
    d, f = 4096, 14336  # o_proj's input (q = d wide), the post-attention norm's output, down_proj's input; float32
    assert full - lora.part("activations").device == 2048 * 32 * 4 * (d + d + f)


def test_a_saved_config_with_an_infinity_reads_as_transformers_writes_it(tmp_path):
    import json

    from llmx.core.models.meta import model_config

    config = {"model_type": "mamba2", "time_step_limit": [0.0, {"__float__": "Infinity"}]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert model_config(str(tmp_path)).time_step_limit[1] == float("inf")
