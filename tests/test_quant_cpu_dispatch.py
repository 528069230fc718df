"""A packed layer's CPU path is decided once per layer (from its format and the CPU's capability) and then costs a
version check and the kernel: the decision is not remade per call, every path computes what the exact path does
(to its stated rounding), W8A8 without AVX-512 VNNI keeps the integer sums, and the canonical reads, in-place writes,
``exact()`` and ``LLMX_CPU_KERNELS=0`` hold as before."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

from llmx.core.quant import cpu_kernels
from llmx.core.quant.cpu_kernels import Capability
from llmx.core.quant.formats import IntFormat, quantize
from llmx.core.quant.qlinear import QuantLinear

AVX2 = Capability("AVX2", avx512_vnni=False, onednn_isa="ALL")  # an AVX2 CPU (no AVX-512, no VNNI)
VNNI = Capability("AVX512", avx512_vnni=True, onednn_isa="ALL")

# (name, bits, group, symmetric, act_bits, static act scale, the plan it gets)
FORMATS = [("w4a16 g64", 4, 64, True, 16, None, "_W4A16"), ("w4a16 asym per-channel", 4, None, False, 16, None, "_W4A16"),
           ("w4a8 g64", 4, 64, True, 8, 0.02, "_W4A8"), ("w8a16 per-channel", 8, None, True, 16, None, "_Int8Pack"),
           ("w8a8 dynamic", 8, None, True, 8, None, "_W8A8"), ("w8a8 static", 8, None, True, 8, 0.03, "_W8A8"),
           ("w3a16 g32 (no kernel)", 3, 32, True, 16, None, "_Exact")]


def _layer(bits, group, sym, act, static, n=96, k=256, bias=True, seed=0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(k, n, bias=bias)
    fmt = IntFormat(bits, group, sym, full_range=True)
    return QuantLinear.from_codes(lin, *quantize(lin.weight.data, fmt), fmt, act, static)


def _exact(q, x):
    with cpu_kernels.exact():
        return q(x)


@pytest.fixture
def decisions(monkeypatch):
    """Counts QuantLinear._decide calls."""
    calls = []
    real = QuantLinear._decide
    monkeypatch.setattr(QuantLinear, "_decide", lambda self: (calls.append(self), real(self))[1])
    return calls


@pytest.fixture(params=["vnni", "avx2"])
def cpu(request, monkeypatch):
    """This CPU as it is (when it has AVX-512 VNNI) or as an AVX2 one: the W8A8 path follows the capability."""
    cap = VNNI if request.param == "vnni" else AVX2
    if cap is VNNI and not cpu_kernels.capability().vnni:
        pytest.skip("this CPU has no AVX-512 VNNI for torch._int_mm")
    monkeypatch.setattr(cpu_kernels, "capability", lambda: cap)
    return request.param


@pytest.mark.parametrize("fmt", FORMATS, ids=[f[0] for f in FORMATS])
def test_the_path_is_decided_once_and_again_only_when_the_layer_changes(fmt, decisions):
    _, bits, group, sym, act, static, plan = fmt
    q = _layer(bits, group, sym, act, static)
    x = torch.randn(1, 1, 256)
    with torch.no_grad():
        first = q(x)
        for _ in range(50):
            assert torch.equal(q(x), first)
        assert len(decisions) == 1 and type(q._plan).__name__ == plan
        q.scales.mul_(2)  # an in-place write (a scale search): seen on the next call, decided once more
        doubled = q(x)
        for _ in range(5):
            q(x)
        again = 1 if plan == "_Exact" else 2  # (the exact path reads the scales as they are: nothing to redo)
        assert len(decisions) == again
        assert (doubled - first).abs().max() > 0.1 * first.abs().max()
        q.load_state_dict(_layer(bits, group, sym, act, static, seed=1).state_dict())
        q(x)
        q.to(torch.float64).to(torch.float32)  # moved or cast: decided again where it lands
        q(x)
        assert len(decisions) == again + 2


@pytest.mark.parametrize("fmt", FORMATS, ids=[f[0] for f in FORMATS])
@pytest.mark.parametrize("m", [1, 7, 40])
def test_every_path_computes_what_the_exact_path_does(fmt, m, cpu):
    """bf16 paths within bf16 rounding (activations and scales 2^-9 each, the int8 kernel's sums 2^-9); W8A8 through
    _int_mm (VNNI) and the exact-path formats bit for bit."""
    name, bits, group, sym, act, static, plan = fmt
    q = _layer(bits, group, sym, act, static)
    x = torch.randn(2, m, 256) * torch.rand(2, m, 1) * 3
    with torch.no_grad():
        ref = _exact(q, x)
        out = q(x)
    assert out.shape == ref.shape == (2, m, 96) and out.dtype == ref.dtype
    if plan == "_Exact" or (plan == "_W8A8" and cpu == "vnni"):
        assert torch.equal(out, ref)
    elif plan in ("_Int8Pack", "_W8A8") and 2 * m > q._plan.max_rows:  # float32 on the weight's values
        assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5 * ref.abs().max())
    else:
        assert (out - ref).abs().max() <= 1e-2 * ref.abs().max()
        assert not torch.equal(out, ref)  # it ran a bf16 kernel, not the exact path
    if plan == "_W8A8":
        assert q._plan.path == ("int_mm" if cpu == "vnni" else "int8pack")


def test_w8a8_without_vnni_keeps_the_integer_sums():
    """The int8 kernel on the activation codes with unit scales returns each exact int32 sum rounded once to bf16
    (products exact, float32 sums exact below 2^24: here |sum| <= 1024 * 128 * 128 = 2^24); the float32 matmul on the
    codes that takes over past max_rows returns the sums exactly."""
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (9, 1024), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (80, 1024), generator=g, dtype=torch.int8)
    a[0], w[0] = -128, -128  # the largest sum there is
    sums = torch._int_mm(a, w.t()) if cpu_kernels.capability().vnni else (a.double() @ w.double().T).int()
    assert torch.equal(sums, (a.double() @ w.double().T).int())
    kernel = cpu_kernels.int8_matmul(a.bfloat16(), w, w.new_ones(80, dtype=torch.bfloat16), None)
    assert kernel.dtype == torch.bfloat16 and torch.equal(kernel, sums.float().bfloat16())
    assert torch.equal(torch.nn.functional.linear(a.float(), w.float()), sums.float())


@pytest.mark.parametrize("bias", [True, False])
def test_w8a8_without_vnni_past_max_rows_is_the_exact_path(bias, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "capability", lambda: AVX2)
    q = _layer(8, None, True, 8, None, bias=bias)
    monkeypatch.setattr(cpu_kernels, "int8_matmul", lambda *a: (_ for _ in ()).throw(AssertionError("int8 kernel")))
    x = torch.randn(3, 30, 256)  # 90 rows > 16 for a small weight
    with torch.no_grad():
        assert q(x).shape == (3, 30, 96) and q._plan.max_rows == 16
        monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)  # the exact path's sums from the scalar loop
        assert torch.equal(q(x), _exact(q, x))


def test_the_dispatch_table(monkeypatch):
    assert cpu_kernels.w8a8_path(4096, 4096, VNNI) == ("int_mm", 0) or not torch.backends.mkldnn.is_available()
    assert cpu_kernels.w8a8_path(4096, 4096, AVX2) == ("int8pack", 128)
    assert cpu_kernels.w8a8_path(256, 704, AVX2) == ("int8pack", 16)
    no_vnni = Capability("AVX512", avx512_vnni=False, onednn_isa="ALL")  # Skylake-X: AVX-512 without VNNI
    assert cpu_kernels.w8a8_path(4096, 4096, no_vnni) == ("int8pack", 192)
    for emulated in (Capability("AVX2", True, "ALL"), Capability("AVX512", True, "AVX2"),
                     Capability("AVX512", True, "AVX512_CORE")):  # VNNI on the chip, not for this process
        assert not emulated.vnni and cpu_kernels.w8a8_path(4096, 4096, emulated)[0] == "int8pack"
    assert Capability("AVX512", True, "AVX512_CORE_AMX").vnni and Capability("AVX512", True, "avx512_core_vnni").vnni
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)  # _int_mm without oneDNN is the scalar loop
    assert cpu_kernels.w8a8_path(4096, 4096, VNNI)[0] == "int8pack"


@pytest.mark.parametrize("fmt", FORMATS, ids=[f[0] for f in FORMATS])
def test_state_dict_pickles_and_codes_round_trip_after_forwards(fmt, cpu):
    _, bits, group, sym, act, static, _ = fmt
    q = _layer(bits, group, sym, act, static)
    before = {k: v.clone() for k, v in q.state_dict().items()}
    codes = q.codes()
    x = torch.randn(4, 256)
    with torch.no_grad():
        out = q(x)
        for _ in range(3):
            q(x)
        after = q.state_dict()
        assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
        assert torch.equal(q.codes(), codes)
        for clone in (copy.deepcopy(q), pickle.load(io.BytesIO(pickle.dumps(q)))):
            assert clone._plan is None and torch.equal(clone.codes(), codes)
            assert torch.equal(clone(x), out)
        fresh = QuantLinear.rebuild(q.llmx_spec(), after, torch.float32)
        assert torch.equal(fresh(x), out)
        assert torch.equal(q(x), out)  # the original still runs its plan


def test_llmx_cpu_kernels_0_forces_the_exact_path(monkeypatch, decisions):
    layers = [_layer(*f[1:6]) for f in FORMATS]
    x = torch.randn(2, 256)
    with torch.no_grad():
        fast = [q(x) for q in layers]
        assert len(decisions) == len(layers)
        refs = [_exact(q, x) for q in layers]
        for name in ("matmul", "int8_matmul"):
            monkeypatch.setattr(cpu_kernels, name, lambda *a: (_ for _ in ()).throw(AssertionError("a CPU kernel ran")))
        monkeypatch.setattr(torch, "_int_mm", lambda *a: (_ for _ in ()).throw(AssertionError("_int_mm")))
        monkeypatch.setenv(cpu_kernels.ENV, "0")  # set after the plans were made: read on every call
        for q, ref in zip(layers, refs, strict=True):
            if q.act_bits == 8:
                continue  # the A8 exact paths are themselves _int_mm (checked by the exact-path tests)
            assert torch.equal(q(x), ref)
            assert not q._kernel_layout
    assert any(not torch.equal(a, b) for a, b in zip(fast, refs, strict=True))


@pytest.mark.skipif(cpu_kernels.capability().torch not in ("AVX2", "AVX512"), reason="needs an x86 CPU with AVX2")
def test_a_w8a8_layer_under_avx2_kernels_takes_the_int8_kernel():
    """A real AVX2 run (torch's and oneDNN's AVX2 code, in a child): the plan avoids _int_mm, whose oneDNN code capped
    at AVX2 saturates its sums on this machine, and matches the exact integer sums (the scalar loop) to bf16."""
    import os
    import subprocess
    import sys

    script = (
        "import torch\n"
        "from llmx.core.quant import cpu_kernels\n"
        "from llmx.core.quant.formats import IntFormat, quantize\n"
        "from llmx.core.quant.qlinear import QuantLinear\n"
        "torch.manual_seed(0)\n"
        "lin = torch.nn.Linear(512, 64)\n"
        "fmt = IntFormat(8, None, full_range=True)\n"
        "q = QuantLinear.from_codes(lin, *quantize(lin.weight.data, fmt), fmt, act_bits=8)\n"
        "x = torch.randn(3, 512)\n"
        "with torch.no_grad():\n"
        "    out = q(x)\n"
        "    torch.backends.mkldnn.enabled = False\n"
        "    with cpu_kernels.exact():\n"
        "        ref = q(x)\n"
        "assert q._plan.path == 'int8pack', q._plan.path\n"
        "assert (out - ref).abs().max() <= 1e-2 * ref.abs().max(), (out - ref).abs().max()\n"
        "print(torch.backends.cpu.get_cpu_capability())\n")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "AVX2"


def test_an_inference_mode_forward_keeps_its_plan():
    """The kernel layout made under inference mode counts no versions: the plan still holds, reads stay canonical."""
    q = _layer(4, 64, True, 16, None)
    canonical = q.qweight.clone()
    x = torch.randn(1, 1, 256)
    with torch.inference_mode():
        out = q(x)
        plan = q._plan
        for _ in range(3):
            assert torch.equal(q(x), out)
        assert q._plan is plan and q._kernel_layout
    assert torch.equal(q.state_dict()["qweight"], canonical)


@pytest.mark.parametrize("fmt", FORMATS[:6], ids=[f[0] for f in FORMATS[:6]])
@pytest.mark.parametrize("swap", ["functional_call", "buffers", "data"])
def test_scales_swapped_without_setattr_reach_the_output(fmt, swap):
    """functional_call and offload hooks write ``_buffers`` directly, ``.data =`` keeps the tensor object: the plan
    must see both (doubled scales, doubled output), not keep computing with the tensors it was made from."""
    q = _layer(*fmt[1:6], bias=False)
    x = torch.randn(3, q.in_features)
    with torch.no_grad():
        before = q(x)  # the plan is made here
        doubled = q.scales * 2
        if swap == "functional_call":
            after = torch.func.functional_call(q, {"scales": doubled}, (x,))
        elif swap == "buffers":
            q._buffers["scales"] = doubled
            after = q(x)
        else:
            q.scales.data = doubled
            after = q(x)
    torch.testing.assert_close(after, before * 2, rtol=2e-2, atol=1e-3)
