"""int4 layers on the CPU through torch's packed-int4 kernel: the same outputs as the exact path (to bf16 rounding),
the canonical layout back in every read (codes, state_dict, save / reload), and the exact path where the kernel
cannot run or its layout is not the one this module inverts."""

from __future__ import annotations

import pytest
import torch

from llmx.core.quant import cpu_kernels
from llmx.core.quant.formats import IntFormat, quantize
from llmx.core.quant.qlinear import QuantLinear


def _layer(n, k, group, sym=True, act=16, bias=True, seed=0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(k, n, bias=bias)
    fmt = IntFormat(4, group, sym, full_range=True)
    static = torch.tensor(0.02) if act == 8 else None
    q = QuantLinear.from_codes(lin, *quantize(lin.weight.data, fmt), fmt, act, None if static is None else float(static))
    return q, torch.randn(5, k)


def _exact(q, x, monkeypatch):
    with monkeypatch.context() as m:
        m.setenv(cpu_kernels.ENV, "0")
        return q(x)


@pytest.mark.parametrize("n,k,group,sym,act", [(48, 256, 64, True, 16), (128, 256, None, True, 16),
                                               (100, 128, 32, False, 16), (64, 512, 0, True, 16),
                                               (256, 512, 128, True, 8), (40, 96, 32, True, 16), (200, 256, 256, False, 16),
                                               (64, 704, 128, False, 16), (32, 704, 128, True, 8)])
def test_kernel_path_matches_the_exact_path_to_bf16_rounding(n, k, group, sym, act, monkeypatch):
    q, x = _layer(n, k, group, sym, act)
    with torch.no_grad():
        ref = _exact(q, x, monkeypatch)
        out = q(x)
    assert q._kernel_layout and out.shape == ref.shape
    assert (out - ref).abs().max() <= 1e-2 * ref.abs().max()
    assert not torch.equal(out, ref)  # it really ran in bf16, not the float path


@pytest.mark.parametrize("bias", [True, False])
def test_kernel_path_never_dequantizes_the_weight(bias, monkeypatch):
    q, x = _layer(64, 256, 64, bias=bias)
    monkeypatch.setattr(QuantLinear, "dequantized_weight", lambda *a, **k: (_ for _ in ()).throw(AssertionError("unpacked")))
    q(x)


def test_reads_see_the_canonical_layout_after_a_kernel_call(tmp_path, monkeypatch):
    q, x = _layer(100, 256, 64, sym=False)
    before = {k: v.clone() for k, v in q.state_dict().items()}
    codes = q.codes()
    with torch.no_grad():
        ref = _exact(q, x, monkeypatch)
        q(x)
    assert q._kernel_layout and not torch.equal(q.qweight, before["qweight"])
    after = q.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert torch.equal(q.codes(), codes)
    fresh = QuantLinear.rebuild(q.llmx_spec(), after, torch.float32)
    with torch.no_grad():
        assert torch.equal(_exact(fresh, x, monkeypatch), ref)


def test_loading_a_state_dict_into_a_layer_in_kernel_layout(monkeypatch):
    q, x = _layer(64, 128, 32)
    other, _ = _layer(64, 128, 32, seed=1)
    with torch.no_grad():
        q(x)
        q.load_state_dict(other.state_dict())
        assert not q._kernel_layout and torch.equal(q.qweight, other.qweight)
        assert not torch.equal(q.qweight, _layer(64, 128, 32)[0].qweight)
        assert torch.allclose(q(x), other(x))


def test_switching_the_kernel_off_returns_to_the_canonical_layout(monkeypatch):
    q, x = _layer(64, 128, 32)
    canonical = q.qweight.clone()
    with torch.no_grad():
        q(x)
        _exact(q, x, monkeypatch)
    assert not q._kernel_layout and torch.equal(q.qweight, canonical)


def test_ragged_groups_and_other_widths_take_the_exact_path():
    assert cpu_kernels.kernel_group(4, 64, 200) is None  # ragged last group
    assert cpu_kernels.kernel_group(4, 16, 256) is None  # a group the kernel has no code for
    assert cpu_kernels.kernel_group(3, 128, 256) is None
    assert cpu_kernels.kernel_group(4, None, 96) == 32 and cpu_kernels.kernel_group(4, 0, 4096) == 256
    assert cpu_kernels.kernel_group(4, 128, 704) == 64  # 5 groups of 128 and a ragged one of 64: kernel groups of 64
    q, x = _layer(48, 200, 64)
    q(x)
    assert not q._kernel_layout


def test_a_kernel_layout_this_module_cannot_invert_falls_back_to_the_exact_path(monkeypatch):
    q, x = _layer(64, 256, 64)
    with torch.no_grad():
        ref = _exact(q, x, monkeypatch)
        monkeypatch.setattr(cpu_kernels, "_from_kernel", lambda p, n, k, b: torch.zeros(n, k, dtype=torch.int16))
        cpu_kernels._block_rows.cache_clear()
        try:
            out = q(x)
        finally:
            cpu_kernels._block_rows.cache_clear()
    assert not q._kernel_layout and q._kernel_group is None and torch.equal(out, ref)


@pytest.mark.parametrize("capability", ["avx2", "avx512"])
def test_the_layout_is_learnt_for_each_cpu_capability(capability):
    """torch tiles rows in blocks of 32 under AVX2 and 64 under AVX-512: both must run the kernel, exactly inverted."""
    import subprocess
    import sys

    script = (
        "import torch\n"
        "from llmx.core.quant import cpu_kernels\n"
        "from llmx.core.quant.packing import pack\n"
        "for n in (16, 48, 96, 112, 256):\n"
        "    stored = torch.randint(0, 16, (n, 128), generator=torch.Generator().manual_seed(n))\n"
        "    packed = cpu_kernels.to_kernel(pack(stored, 4), n, 128)\n"
        "    assert packed is not None, n\n"
        "    assert torch.equal(cpu_kernels.canonical(packed, n, 128), pack(stored, 4)), n\n"
        "print(torch.backends.cpu.get_cpu_capability())\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env={**__import__("os").environ, "ATEN_CPU_CAPABILITY": capability})
    if r.returncode == 0 and capability.upper() not in r.stdout.upper():
        pytest.skip(f"this CPU cannot run {capability} (ran {r.stdout.strip()})")
    assert r.returncode == 0, r.stderr[-2000:]


def test_casts_in_place_edits_copies_and_gradients_after_a_kernel_call(monkeypatch):
    import copy
    import io
    import pickle

    q, x = _layer(64, 256, 64)
    with torch.no_grad():
        before = q(x)
        q.scales.mul_(2)  # an in-place scale edit (a scale search) reaches the kernel
        after, exact = q(x), _exact(q, x, monkeypatch)
        assert (after - exact).abs().max() < 1e-2 * exact.abs().max() and (after - before).abs().max() > 0.1
        q.scales.div_(2)
        fresh, _ = _layer(64, 256, 64, seed=3)
        q(x)
        q.qweight.copy_(fresh.qweight)  # canonical bytes written in place over the kernel layout
        q.bias.copy_(fresh.bias)
        q.scales.copy_(fresh.scales)
        assert torch.allclose(q(x), fresh(x), atol=1e-6)
        for clone in (copy.deepcopy(q), pickle.load(io.BytesIO(pickle.dumps(q)))):
            assert not clone._kernel_layout and torch.equal(clone.qweight, fresh.canonical_qweight())
        half = copy.deepcopy(q)
        half(x)
        half.half()
        assert half(x.half()).dtype == torch.float16
    xg = x.clone().requires_grad_(True)
    q(xg).sum().backward()  # the kernel has no derivative: the exact path runs
    assert xg.grad is not None and xg.grad.abs().sum() > 0


@pytest.mark.parametrize("group", [None, 0])
def test_int8_per_channel_weights_run_through_the_int8_kernel(group, monkeypatch):
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 40)
    fmt = IntFormat(8, group, full_range=True)
    q = QuantLinear.from_codes(lin, *quantize(lin.weight.data, fmt), fmt)
    x = torch.randn(3, 96)
    with torch.no_grad():
        ref = _exact(q, x, monkeypatch)
        monkeypatch.setattr(QuantLinear, "dequantized_weight", lambda *a, **k: (_ for _ in ()).throw(AssertionError("unpacked")))
        out = q(x)
    assert (out - ref).abs().max() <= 1e-2 * ref.abs().max() and not torch.equal(out, ref)
    assert not cpu_kernels.int8_ready(8, True, 128, 16) and not cpu_kernels.int8_ready(8, True, None, 8)


def test_an_input_on_another_device_is_an_error_naming_the_layer():
    """A tensor off the CPU never reaches the CPU kernels (nor is it copied there): the layer refuses it by name."""
    from llmx.core.models.linear import replace_module
    from llmx.errors import DeviceMismatch

    q, x = _layer(48, 256, 64)
    assert "QuantLinear(256, 48" in q.describe()  # unnamed: its type and shape
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(256, 48)))
    replace_module(model, "0.0", q)
    assert q.llmx_name == "0.0"
    with pytest.raises(DeviceMismatch, match=r"^layer 0\.0: input on meta, weights on cpu$"):
        q(x.to("meta"))
    q.to("meta")  # weights off the CPU, the input on it: the kernel path would have converted them
    with pytest.raises(DeviceMismatch, match=r"^layer 0\.0: input on cpu, weights on meta$"):
        q(x)
    assert not q._kernel_layout


def test_the_cpu_kernels_refuse_tensors_on_other_devices():
    from llmx.errors import DeviceMismatch

    q, x = _layer(48, 256, 64)
    with torch.no_grad():
        q(x)
    assert q._kernel_layout
    with pytest.raises(DeviceMismatch, match=r"^cpu_kernels\.matmul: .* got x on meta$"):
        cpu_kernels.matmul(x.to("meta"), q.qweight, q._kernel_sz, 64, 48)
    with pytest.raises(DeviceMismatch, match=r"^layer up: .* got qweight on meta$"):
        cpu_kernels.to_kernel(q.canonical_qweight().to("meta"), 48, 256, "layer up")
    lin = torch.nn.Linear(96, 40)
    fmt = IntFormat(8, None, full_range=True)
    q8 = QuantLinear.from_codes(lin, *quantize(lin.weight.data, fmt), fmt)
    with pytest.raises(DeviceMismatch, match=r"got qweight on meta, scales on meta$"):
        cpu_kernels.int8_matmul(torch.randn(3, 96), q8.qweight.to("meta"), q8.scales.to("meta"))
