"""Device lint: reads every ``.py`` under ``llmx/`` (AST) and fails on device bugs that only show on a GPU.

Rules (a finding is keyed ``(path, scope, pattern)``: ``path`` relative to the repo root, ``scope`` the dotted name of
the enclosing classes/functions or ``<module>``, ``pattern`` one of the three below):

* ``factory``: a tensor factory (``torch.zeros``, ``ones``, ``empty``, ``full``, ``arange``, ``tensor``,
  ``randn``, ``rand``, ``randint``, ``randperm``, ``eye``, ``linspace``, ...) called without ``device=``. The result
  lands on the CPU while the tensors it meets may be on CUDA. ``*_like`` and ``Tensor.new_*`` inherit the device and
  are fine; a call with ``**kwargs`` is trusted to carry the device.
* ``numpy``: ``.numpy()`` whose receiver chain has no ``.cpu()`` (or ``.to("cpu")``): raises on a CUDA tensor.
* ``cpu-op``: an op that exists only for CPU tensors (``torch._weight_int4pack_mm_for_cpu``,
  ``aten._convert_weight_to_int4pack_for_cpu``, ...). Each call must sit behind an explicit device check; the
  allow-list entry says which.

Exceptions live in ``ALLOW`` below, keyed by ``(path, scope, pattern, count)`` with a one-line reason: ``count`` is how
many such findings the scope holds, so a new one inside an allowed function fails too, and an entry whose count no
longer matches fails the test, so the list cannot rot.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FACTORIES = frozenset({
    "zeros", "ones", "empty", "full", "arange", "range", "tensor", "randn", "rand", "randint", "randperm", "eye",
    "linspace", "logspace", "empty_strided", "as_tensor", "asarray", "tril_indices", "triu_indices", "normal", "bartlett_window",
    "hann_window", "hamming_window", "blackman_window", "kaiser_window",
    "Tensor", "FloatTensor", "LongTensor", "IntTensor", "BoolTensor", "from_numpy",  # always on the CPU
})

# Ops with a CPU kernel only (a CUDA tensor raises deep inside aten, or worse, a caller "fixes" it with a silent copy).
CPU_ONLY_OPS = frozenset({
    "_weight_int4pack_mm_for_cpu", "_convert_weight_to_int4pack_for_cpu", "_weight_int8pack_mm",
    "_dyn_quant_matmul_4bit", "_dyn_quant_pack_4bit_weight", "_weight_int4pack_mm_with_scales_and_zeros",
})

# Receiver methods that keep a tensor's device: ``x.cpu().detach().numpy()`` is as safe as ``x.detach().cpu().numpy()``.
_DEVICE_KEEPING = frozenset({"detach", "float", "double", "half", "contiguous", "clone", "reshape", "view", "flatten",
                             "squeeze", "unsqueeze", "t", "T", "resolve_conj", "resolve_neg"})

SEEDED = "draws on a seeded CPU generator (the same values on every device), moved to the device by the caller"
COLLATE = "collates token lists into CPU tensors row by row, then moves each to the batch's device once"
CPU_KERNEL = "torch's CPU-only packed kernel, behind require_cpu (DeviceMismatch naming the layer) and QuantLinear's check"
BOTORCH = "FunBO's BoTorch re-check: numpy benchmark grids on the CPU (it has no device option)"
HADAMARD = "a cached CPU constant of Python integers; _base_on moves it once per device and dtype"

# (path relative to the repo root, scope, pattern) -> why the CPU is the right place (one line).
ALLOW: dict[tuple[str, str, str, int], str] = {
    ("llmx/core/data/__init__.py", "join_documents", "factory", 1): "the tokenizer's ids as a CPU token stream (data stays "
                                                                 "on the CPU until a batch moves)",
    ("llmx/core/data/__init__.py", "random_windows", "factory", 1): SEEDED,
    ("llmx/core/data/sampling.py", "EpochOrder.perm", "factory", 1): SEEDED + " (here: a Python list)",
    ("llmx/core/eval/icl.py", "label_scores", "factory", 1): "scores of Python floats on the CPU, as next_logprobs returns",
    ("llmx/core/eval/score.py", "next_logprobs", "factory", 1): "the CPU result table, filled with .cpu() rows per batch",
    ("llmx/core/export/verify.py", "max_logit_difference", "factory", 1): SEEDED,
    ("llmx/core/models/upcycle.py", "upcycle", "factory", 1): SEEDED + " (copy_ into the MoE's tensor)",
    ("llmx/core/quant/cpu_kernels.py", "_block_rows", "factory", 1): "a CPU probe of the CPU kernel's layout (no layer data)",
    ("llmx/core/quant/cpu_kernels.py", "_block_rows", "cpu-op", 1): "a CPU probe of the CPU kernel's layout (no layer data)",
    ("llmx/core/quant/cpu_kernels.py", "to_kernel", "cpu-op", 1): CPU_KERNEL,
    ("llmx/core/quant/cpu_kernels.py", "int8_matmul", "cpu-op", 1): CPU_KERNEL,
    ("llmx/core/quant/cpu_kernels.py", "matmul", "cpu-op", 1): CPU_KERNEL,
    ("llmx/core/quant/hadamard.py", "_jacobsthal", "factory", 3): HADAMARD,
    ("llmx/core/quant/hadamard.py", "_paley", "factory", 6): HADAMARD,
    ("llmx/core/quant/hadamard.py", "_base", "factory", 1): HADAMARD,
    ("llmx/core/quant/saliency.py", "collect", "factory", 1): "the Fisher sums live on the CPU (documented), each gradient "
                                                           "added after .cpu()",
    ("llmx/core/train/align/batch.py", "collate", "factory", 4): COLLATE,
    ("llmx/core/train/align/batch.py", "step_matrix", "factory", 2): COLLATE,
    ("llmx/core/train/sft/batch.py", "padded", "factory", 3): COLLATE,
    ("llmx/core/train/sft/batch.py", "packed", "factory", 5): COLLATE,
    ("llmx/core/train/sft/batch.py", "check_packing", "factory", 1): SEEDED,
    ("llmx/core/train/checkpoint.py", "rng_state", "factory", 1): "numpy's generator state kept in a checkpoint (data "
                                                                  "saved to disk, never computed with)",
    ("llmx/core/zoo/train.py", "pretrain.loss", "factory", 1): SEEDED + " (here: slice bounds into the token stream)",
    ("llmx/plugins/clover/attention.py", "convert_model", "factory", 1): SEEDED,
    ("llmx/plugins/fope/position.py", "base_frequencies", "factory", 1): "a float64 table computed on the CPU (bit-equal on "
                                                                      "every device), moved by the caller",
    ("llmx/plugins/fope/position.py", "init_coefficients", "factory", 1): SEEDED + " (xavier_normal_ with the generator)",
    ("llmx/plugins/funbo/botorch_check.py", "_gp", "factory", 2): BOTORCH,
    ("llmx/plugins/funbo/botorch_check.py", "run_fixed", "factory", 1): BOTORCH,
    ("llmx/plugins/funbo/botorch_check.py", "standard", "factory", 1): BOTORCH,
    ("llmx/plugins/pasta/sft.py", "batch", "factory", 6): COLLATE,
    ("llmx/plugins/reper/pack.py", "batch", "factory", 3): COLLATE,
    ("llmx/plugins/upcycling/method.py", "logit_error", "factory", 1): SEEDED,
}


def _torch_aliases(tree: ast.Module) -> tuple[set[str], dict[str, str]]:
    """Names bound to the torch module, and bare names imported from it (``from torch import zeros as z``)."""
    mods, names = {"torch"}, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch":
                    mods.add(a.asname or "torch")
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            for a in node.names:
                names[a.asname or a.name] = a.name
    return mods, names


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _has_cpu(node: ast.AST) -> bool:
    """Whether the receiver chain of a ``.numpy()`` goes through ``.cpu()`` / ``.to("cpu")`` (device-keeping calls
    in between are fine)."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        meth = node.func.attr
        if meth == "cpu":
            return True
        if meth == "to":
            args = list(node.args) + [k.value for k in node.keywords if k.arg == "device"]
            if any(isinstance(a, ast.Constant) and a.value == "cpu" for a in args):
                return True
        elif meth not in _DEVICE_KEEPING:
            return False
        node = node.func.value
    return False


class _Visitor(ast.NodeVisitor):
    def __init__(self, path: str, mods: set[str], names: dict[str, str]):
        self.path, self.mods, self.names = path, mods, names
        self.scope: list[str] = []
        self.found: list[tuple[str, str, str, int, str]] = []

    def _add(self, pattern: str, node: ast.AST, detail: str) -> None:
        self.found.append((self.path, ".".join(self.scope) or "<module>", pattern, node.lineno, detail))

    def _scoped(self, node):
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        factory = None
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in self.mods:
            factory = f.attr
        elif isinstance(f, ast.Name) and f.id in self.names:
            factory = self.names[f.id]
        if factory in FACTORIES:
            kws = {k.arg: k.value for k in node.keywords}
            dev = kws.get("device")
            if (dev is None or (isinstance(dev, ast.Constant) and dev.value is None)) and None not in kws:
                # (a ``**kwargs`` splat, key None, is trusted to carry the device; ``device=None`` is the CPU)
                self._add("factory", node, f"torch.{factory}() without device=")
        if isinstance(f, ast.Attribute):
            if f.attr == "numpy" and not node.args and not _has_cpu(f.value):
                self._add("numpy", node, ".numpy() without .cpu()")
            if f.attr in CPU_ONLY_OPS:
                self._add("cpu-op", node, f"CPU-only {f.attr}")
        self.generic_visit(node)


def lint_source(source: str, path: str) -> list[tuple[str, str, str, int, str]]:
    """Every finding in one source file: ``(path, scope, pattern, line, what)``."""
    tree = ast.parse(source, filename=path)
    v = _Visitor(path, *_torch_aliases(tree))
    v.visit(tree)
    return v.found


def lint_tree(root: Path = ROOT) -> list[tuple[str, str, str, int, str]]:
    """Every finding in ``root/llmx``."""
    return [f for file in sorted((root / "llmx").rglob("*.py"))
            for f in lint_source(file.read_text(encoding="utf-8"), file.relative_to(root).as_posix())]


def check(found, allow=ALLOW) -> tuple[list[str], list[tuple[str, str, str, int]]]:
    """Findings not covered by the allow-list (as ``path:line in scope: what`` lines: every finding of a scope whose
    count differs from its entry's), and entries that match no scope with that count."""
    counts = Counter((p, s, pat) for p, s, pat, *_ in found)
    bad = [f"{p}:{line} in {s}: {what}" for p, s, pat, line, what in found
           if (p, s, pat, counts[p, s, pat]) not in allow]
    stale = [k for k in allow if counts[k[:3]] != k[3]]
    return bad, stale


def test_llmx_has_no_device_bugs():
    bad, stale = check(lint_tree())
    assert not bad, ("tensors made off the device they meet: add device= (the tensors' own device), .cpu() before "
                     ".numpy(), a device check before a CPU-only op, or an ALLOW entry with its reason:\n  "
                     + "\n  ".join(bad))
    assert not stale, f"ALLOW entries whose count no longer matches (update or remove them): {stale}"


def test_allow_list_entries_name_real_files_with_one_line_reasons():
    for (path, scope, pattern, count), reason in ALLOW.items():
        assert count >= 1, (path, scope)
        assert (ROOT / path).is_file(), path
        assert pattern in ("factory", "numpy", "cpu-op"), pattern
        assert reason.strip() and "\n" not in reason, (path, scope, pattern)


PLANTED = "import torch\n\n\ndef f(x):\n    return torch.zeros(3) + x\n"


def _keys(found):
    return [(p, s, pat) for p, s, pat, *_ in found]


def test_catches_a_planted_factory_in_a_plugin(tmp_path):
    plugin = tmp_path / "llmx" / "plugins" / "planted"
    plugin.mkdir(parents=True)
    (plugin / "method.py").write_text(PLANTED)
    found = lint_tree(tmp_path)
    key = ("llmx/plugins/planted/method.py", "f", "factory")
    assert _keys(found) == [key]
    assert check(found, allow={}) == (["llmx/plugins/planted/method.py:5 in f: torch.zeros() without device="], [])
    assert check(found, allow={(*key, 1): "why"}) == ([], [])  # an entry covers it...
    (plugin / "method.py").write_text(PLANTED.replace("+ x", "+ torch.ones(3) + x"))
    bad, stale = check(lint_tree(tmp_path), allow={(*key, 1): "why"})
    assert len(bad) == 2 and stale == [(*key, 1)]  # ...but not a second one in the same function...
    (plugin / "method.py").write_text(PLANTED.replace("zeros(3)", "zeros(3, device=x.device)"))
    assert lint_tree(tmp_path) == []  # ...the fix passes...
    assert check([], allow={(*key, 1): "why"}) == ([], [(*key, 1)])  # ...and then the entry is stale


def test_catches_factory_variants():
    src = ("import torch as T\nfrom torch import arange as ar, ones\n"
           "class C:\n    def m(self, x, **kw):\n"
           "        a = T.randn(2, 3)\n        b = ar(4)\n        c = ones(2, dtype=x.dtype)\n"
           "        d = T.empty(2, **kw)\n        e = T.zeros_like(x)\n        g = x.new_zeros(3)\n"
           "        h = T.full((2,), 1.0, device=x.device)\n"
           "        def inner():\n            return T.randperm(4)\n"
           "        return a, b, c, d, e, g, h, inner\n"
           "W = T.eye(3)\n")
    found = [(s, what, line) for _, s, _, line, what in lint_source(src, "m.py")]
    assert found == [("C.m", "torch.randn() without device=", 5), ("C.m", "torch.arange() without device=", 6),
                     ("C.m", "torch.ones() without device=", 7), ("C.m.inner", "torch.randperm() without device=", 13),
                     ("<module>", "torch.eye() without device=", 15)]
    src = "import torch\ndef f(n):\n    return torch.zeros(n, device=None), torch.Tensor(n), torch.from_numpy(n)\n"
    assert [what for *_, what in lint_source(src, "m.py")] == [
        "torch.zeros() without device=", "torch.Tensor() without device=", "torch.from_numpy() without device="]


def test_catches_numpy_without_cpu():
    bad = "def f(x):\n    return x.detach().numpy(), x.float().numpy()\n"
    assert [pat for _, _, pat, *_ in lint_source(bad, "m.py")] == ["numpy", "numpy"]
    good = ("def f(x):\n    return (x.cpu().numpy(), x.detach().cpu().numpy(), x.cpu().detach().numpy(),\n"
            "            x.to('cpu').numpy(), x.detach().to(device='cpu').float().numpy())\n")
    assert lint_source(good, "m.py") == []


def test_catches_cpu_only_ops():
    src = ("import torch\ndef mm(x, p, s):\n"
           "    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, p, 32, s), torch._int_mm(x, p)\n")
    assert [(s, what) for _, s, _, _, what in lint_source(src, "m.py")] == [("mm", "CPU-only _weight_int4pack_mm_for_cpu")]
