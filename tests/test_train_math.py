"""The math of the training stages: schedules, SFT masks and truncation, packing boundaries, checkpoints that run no
code, fp32 master weights under bf16 autocast, gradient checkpointing, LoRA merged vs unmerged."""

from __future__ import annotations

import math

import pytest
import torch

from llmx.core.train.schedule import lr_at
from llmx.core.train.sft.data import Row
from llmx.core.train.sft.encode import encode


def tiny(arch: str = "llama", seed: int = 1):
    from llmx.core.models.archs import build_random

    return build_random(arch, seed=seed)


def test_wsd_schedule_values():
    kw = dict(lr=1.0, steps=100, warmup=10, schedule="wsd", min_lr_ratio=0.1, decay_steps=20)
    assert lr_at(0, **kw) == pytest.approx(0.1) and lr_at(9, **kw) == pytest.approx(1.0)
    assert lr_at(10, **kw) == lr_at(50, **kw) == lr_at(79, **kw) == 1.0  # stable phase
    assert lr_at(80, **kw) == pytest.approx(0.1 + 0.9 * (1 - 1 / 20))  # first decay step
    assert lr_at(89, **kw) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_at(99, **kw) == pytest.approx(0.1)  # the last step ends at min_lr
    sqrt = lr_at(89, **{**kw, "decay_shape": "sqrt"})
    assert sqrt == pytest.approx(0.1 + 0.9 * (1 - math.sqrt(0.5)))
    cos = dict(lr=1.0, steps=100, warmup=0, schedule="cosine", min_lr_ratio=0.0)
    assert lr_at(0, **cos) == 1.0 and lr_at(50, **cos) == pytest.approx(0.5) and lr_at(100, **cos) == pytest.approx(0)


def _completion_text(tok, e) -> str:
    return tok.decode([i for i, t in zip(e.ids, e.trained, strict=True) if t])


def test_completion_mask_covers_exactly_the_completion_tokens():
    _, tok = tiny()
    e = encode(tok, Row("x:1", prompt="def f(", completion="x):"), 64, 32)
    assert e.ids == tok("def f(", add_special_tokens=False)["input_ids"] + tok("x):", add_special_tokens=False)[
        "input_ids"] + [tok.eos_token_id]
    assert e.trained == [False] * 6 + [True] * 4
    conv = Row("x:2", messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                                {"role": "assistant", "content": "yo"}, {"role": "user", "content": "again"},
                                {"role": "assistant", "content": "ok"}])
    e = encode(tok, conv, 256, 128)
    assert _completion_text(tok, e) == "yo</s>ok</s>"
    assert tok.decode(e.ids) == "system: be brief\nuser: hi\nassistant: yo</s>user: again\nassistant: ok</s>"
    whole = encode(tok, conv, 256, 128, completion_only=False)
    assert whole.trained == [False] + [True] * (len(whole.ids) - 1)


def test_a_row_is_tokenised_as_a_whole_like_at_inference():
    from llmx.core.tokenizer import train_bpe

    tok = train_bpe(["Answer: yes. Answer: no. The answer is yes and yes again. "] * 50, 300)
    tok.add_special_tokens({"bos_token": "<s>"})
    e = encode(tok, Row("x:1", prompt="Answer:", completion=" yes"), 64, 32)
    joint = tok("Answer: yes", add_special_tokens=False)["input_ids"]
    assert e.ids == joint + [tok.eos_token_id]  # not "Answer:" and " yes" tokenised apart
    assert tok.convert_ids_to_tokens([i for i, t in zip(e.ids, e.trained, strict=True) if t]) == ["Ġyes", "</s>"]
    spaced = encode(tok, Row("x:1", prompt="Answer: ", completion="yes"), 64, 32)
    assert spaced.ids == e.ids and spaced.trained == e.trained  # the space joins the completion's first token


def test_chat_template_turns_are_located_prefix_by_prefix():
    _, tok = tiny()
    tok.chat_template = ("{% for m in messages %}[{{ m.role }}]{{ m.content }};{% endfor %}"
                         "{% if add_generation_prompt %}[assistant]{% endif %}")
    row = Row("x:3", messages=[{"role": "user", "content": "2+2"}, {"role": "assistant", "content": "4"},
                               {"role": "user", "content": "3+3"}, {"role": "assistant", "content": "6"}])
    e = encode(tok, row, 256, 128)
    assert tok.decode(e.ids) == "[user]2+2;[assistant]4;[user]3+3;[assistant]6;"
    assert _completion_text(tok, e) == "4;6;"  # the role headers are context, the contents and ends are trained
    tok.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    from llmx.errors import UsageError

    with pytest.raises(UsageError, match="x:3: the tokenizer's chat template does not render"):
        encode(tok, row, 256, 128)


def test_a_chat_templates_leading_bos_survives_truncation():
    _, tok = tiny()
    tok.chat_template = ("{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }};{% endfor %}"
                         "{% if add_generation_prompt %}[assistant]{% endif %}")
    row = Row("x:4", messages=[{"role": "user", "content": "a long question"}, {"role": "assistant", "content": "no"}])
    e = encode(tok, row, 20, 8)
    assert e.prompt_cut and e.ids[0] == tok.bos_token_id and tok.decode(e.ids).endswith("t]no;")


def test_one_truncation_policy_prompt_from_the_left_completion_from_the_right():
    _, tok = tiny()
    e = encode(tok, Row("x:1", prompt="abcdefghij", completion="0123456789"), 12, 4)
    assert tok.decode(e.ids) == "ghij01234567" and e.prompt_cut and e.completion_cut
    assert e.trained == [False] * 4 + [True] * 8
    short = encode(tok, Row("x:1", prompt="ab", completion="01"), 12, 4)
    assert not short.prompt_cut and not short.completion_cut and tok.decode(short.ids) == "ab01</s>"


def test_packing_never_attends_across_a_document_boundary():
    from llmx.core.train.sft.batch import pack, packed, padded
    from llmx.core.train.sft.encode import Encoded

    model, tok = tiny()
    model.eval()
    docs = [Encoded(list(range(10 + k, 17 + 2 * k)), [False, False] + [True] * (5 + k)) for k in range(3)]
    packs = pack(docs, 20)
    assert [len(p.ids) for p in packs] == [15, 9]  # 7 + 8 fit in 20, the third (9) does not
    t = packed(packs, tok.pad_token_id, 20, "cpu")
    with torch.no_grad():
        joint = model(input_ids=t["input_ids"], position_ids=t["position_ids"], use_cache=False).logits
        starts = [0, 7]
        for d, s in zip(docs[:2], starts, strict=True):
            alone = model(input_ids=torch.tensor([d.ids])).logits[0]
            assert torch.allclose(joint[0, s:s + len(d.ids)], alone, atol=1e-5)
        # the same rows padded one per sequence give the same loss as packed: boundaries change nothing
        u_loss = model(**padded(docs[:2], tok.pad_token_id, "cpu")).loss
        two = packed(pack(docs[:2], 20), tok.pad_token_id, 20, "cpu")
        assert torch.isclose(model(**two).loss, u_loss, atol=1e-5)
    assert (t["labels"][0, [0, 7]] == -100).all()  # a document's first token is never a target


def test_packing_is_refused_where_the_model_ignores_position_ids():
    from llmx.core.train.sft.batch import check_packing
    from llmx.errors import UsageError

    model, tok = tiny("llama")
    check_packing(model, len(tok))
    mamba, _ = tiny("mamba2")
    with pytest.raises(UsageError, match="does not keep packed documents apart"):
        check_packing(mamba, len(tok))


def test_checkpoints_load_weights_only_and_refuse_pickled_code(tmp_path, capfd):
    import pickle

    from llmx.core.train import checkpoint
    from llmx.errors import UsageError

    class Boom:
        def __reduce__(self):
            return (print, ("ran code from a checkpoint",))

    (tmp_path / "step_1.pt").write_bytes(pickle.dumps({"step": 1, "params": {}, "x": Boom()}, protocol=2))
    (tmp_path / "latest").write_text("step_1.pt\n")
    with pytest.raises(UsageError, match="not a loadable llmx checkpoint"):
        checkpoint.load(tmp_path)
    model, _ = tiny()
    named = dict(model.named_parameters())
    opt = torch.optim.AdamW(named.values())
    named["model.norm.weight"].grad = torch.ones_like(named["model.norm.weight"])
    opt.step()
    saved = checkpoint.save(tmp_path / "ok", 3, named, opt)
    assert saved.name == "step_3" and checkpoint.describe(saved)["step"] == 3
    fresh, _ = tiny()
    with torch.no_grad():
        fresh.model.norm.weight.fill_(0)
    again = dict(fresh.named_parameters())
    opt2 = torch.optim.AdamW(again.values())
    assert checkpoint.restore(tmp_path / "ok", again, opt2) == 3
    assert all(torch.equal(again[k], v) for k, v in named.items())
    moments = opt2.state[again["model.norm.weight"]]
    assert torch.equal(moments["exp_avg"], opt.state[named["model.norm.weight"]]["exp_avg"])
    index = saved / checkpoint.DCP_INDEX  # DCP's index is a pickle: only its own classes are admitted
    good = index.read_bytes()
    checkpoint.restore(saved, again, opt2)  # the real index loads through the allowlist
    index.write_bytes(pickle.dumps(Boom(), protocol=2))
    with pytest.raises(UsageError, match="not a loadable llmx checkpoint"):
        checkpoint.restore(saved, again, opt2)
    for module in ("pathlib", "torch.distributed.checkpoint.metadata", "torch"):  # protocol 4 resolves dotted names
        def text(b: bytes) -> bytes:
            return b"\x8c" + bytes([len(b)]) + b

        hostile = b"\x80\x04" + text(module.encode()) + text(b"os.system") + b"\x93" + text(b"echo ran code") + b"\x85R."
        index.write_bytes(hostile)
        with pytest.raises(UsageError, match="not a loadable llmx checkpoint"):
            checkpoint.restore(saved, again, opt2)
    assert "ran code" not in capfd.readouterr().out
    index.write_bytes(good)


def test_bf16_mixed_keeps_fp32_master_weights_and_computes_in_bf16():
    from llmx.core.train.loop import TrainConfig, train

    seen = []
    results = {}
    for precision in ("fp32", "bf16-mixed"):
        model, _ = tiny()
        hook = model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        x = torch.randint(3, 259, (2, 16), generator=torch.Generator().manual_seed(0))
        train(model, dict(model.named_parameters()), lambda i, m=model, x=x: m(input_ids=x, labels=x).loss,
              TrainConfig(steps=2, lr=1e-2, precision=precision))
        hook.remove()
        assert all(p.dtype == torch.float32 for p in model.parameters())
        results[precision] = model.lm_head.weight.detach().clone()
    assert seen[0] == torch.float32 and seen[-1] == torch.bfloat16
    assert not torch.equal(results["fp32"], results["bf16-mixed"])


def test_gradient_checkpointing_gives_the_same_gradients_from_fewer_saved_activations():
    from llmx.core.train.stage import checkpointing

    grads, saved = [], []
    for on in (False, True):
        model, _ = tiny()
        model.config.use_cache = False
        checkpointing(model, on)
        model.train()
        count = [0]

        def pack(t, count=count):
            count[0] += t.numel()
            return t

        x = torch.randint(3, 259, (2, 16), generator=torch.Generator().manual_seed(0))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        saved.append(count[0])
    assert saved[1] < saved[0] / 2  # the layers' activations are recomputed, not kept
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_lora_merged_and_unmerged_give_the_same_logits(tmp_path):
    from llmx.core.train import adapters
    from llmx.core.train.params import LoraParams

    model, _ = tiny()
    wrapped = adapters.wrap(model, LoraParams(r=4, alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for name, t in wrapped.named_parameters():
            if "lora_B" in name:
                t.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    x = torch.randint(3, 259, (2, 12), generator=torch.Generator().manual_seed(0))
    wrapped.eval()
    with torch.no_grad():
        unmerged = wrapped(input_ids=x).logits
        base = tiny()[0](input_ids=x).logits
        wrapped.save_pretrained(tmp_path / "adapter")
        merged = adapters.merge(wrapped)(input_ids=x).logits
    assert not torch.allclose(unmerged, base, atol=1e-3)  # the adapter changes the model
    assert torch.allclose(unmerged, merged, atol=1e-5)
    from peft import PeftModel

    reloaded = PeftModel.from_pretrained(tiny()[0], str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        assert torch.allclose(reloaded(input_ids=x).logits, unmerged, atol=1e-5)
