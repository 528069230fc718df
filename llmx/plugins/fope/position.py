"""FoPE's position tables (arXiv 2412.17739 Sec. 4; official ``olmo/model.py`` ``RotaryEmbedding.get_inv_freq`` and
``FourierEmbedding``) and ALiBi's slopes. Pure torch, no transformers.

Per layer and per KV head, each of the first ``d_out`` rotary dims is a Fourier series over the ``D`` kept base
frequencies, with separate sine and cosine coefficients::

    sin_out[n, j] = sum_k sin(w_k n) A_s[h, k, j],    cos_out[n, j] = sum_k cos(w_k n) A_c[h, k, j]

and the other ``head_dim / 2 - d_out`` dims are constant ``sin = cos = 1`` (the authors' issue #6). Applied to q and
k exactly as RoPE's half-split rotation, in float32."""

from __future__ import annotations

import math

import torch


def base_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """RoPE's ``w_i = theta^(-2i / d)``, ``i < d / 2`` (float32, decreasing)."""
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim).float()


def kept_frequencies(head_dim: int, theta: float, train_len: int, floor_clip: bool = True,
                     ignore_zero: bool = True) -> torch.Tensor:
    """The frequencies FoPE builds on: floor clipping sets every ``w < 2 pi / train_len`` to **zero** (official
    ``rope_clamp_floor_to_zero``: it never completes a period in the training window), and ``ignore_zero`` then drops
    the zeros, leaving D."""
    w = base_frequencies(head_dim, theta)
    if floor_clip:
        w = torch.where(w < 2 * math.pi / train_len, torch.zeros_like(w), w)
    return w[w != 0] if ignore_zero else w


def output_dims(kept: int, head_dim: int, fourier_dim: int | str | None, ignore_zero: bool) -> int:
    """``d_out``: official ``min(D, head_dim // 4)`` with ``ignore_zero``, every rotary dim without it; ``all``
    gives every kept frequency its own dim (the notes' open question), an int caps it."""
    if not ignore_zero:
        return head_dim // 2
    if fourier_dim == "all":
        return kept
    return min(kept, int(fourier_dim) if fourier_dim is not None else head_dim // 4)


def step_eye(shape: tuple[int, ...], device=None) -> torch.Tensor:
    """The official step-eye: ``A[..., i * step, i] = 1`` with ``step = ceil(D / d_out)`` (each output dim keeps one
    base frequency)."""
    out = torch.zeros(shape, device=device)
    d_in, d_out = shape[-2], shape[-1]
    step = math.ceil(d_in / d_out)
    for i in range(d_out):
        if i * step < d_in:
            out[..., i * step, i] = 1.0
    return out


def init_coefficients(shape: tuple[int, int, int], sigma: float, generator: torch.Generator | None = None,
                      device=None) -> torch.Tensor:
    """``eye_xavier_norm``: xavier-normal with gain ``sigma`` on the 3-D ``(heads, D, d_out)`` tensor (torch's fans
    of a 3-D tensor, as the official call), plus the step-eye."""
    a = torch.nn.init.xavier_normal_(torch.empty(shape), gain=sigma, generator=generator)
    return (a + step_eye(shape)).to(device)


def expand_coefficients(old: torch.Tensor, shape: tuple[int, int, int], sigma: float,
                        generator: torch.Generator | None = None) -> torch.Tensor:
    """Length extension (official ``len_extra_fourier_expand``): a fresh init of the larger shape with the old block
    copied into its leading corner (the newly kept frequencies are the lowest, so they come last)."""
    if any(n < o for n, o in zip(shape, old.shape, strict=True)):
        raise ValueError(f"cannot expand coefficients {tuple(old.shape)} to the smaller {shape}")
    new = init_coefficients(shape, sigma, generator).to(old.device, old.dtype)
    new[:, :old.shape[1], :old.shape[2]] = old
    return new


def fourier_tables(positions: torch.Tensor, freqs: torch.Tensor, sin_coef: torch.Tensor, cos_coef: torch.Tensor,
                   head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` of shape ``(B, H, T, head_dim)`` for positions ``(B, T)``: the Fourier dims, then the
    ``sin = cos = 1`` padding, duplicated for the half-split layout. Float32 throughout."""
    angle = positions.float()[..., None] * freqs.float().to(positions.device)  # (B, T, D)
    s = torch.einsum("btk,hkj->bhtj", angle.sin(), sin_coef.float())
    c = torch.einsum("btk,hkj->bhtj", angle.cos(), cos_coef.float())
    pad = head_dim // 2 - s.shape[-1]
    if pad:
        s = torch.nn.functional.pad(s, (0, pad), value=1.0)
        c = torch.nn.functional.pad(c, (0, pad), value=1.0)
    return torch.cat((c, c), dim=-1), torch.cat((s, s), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE's ``x cos + rotate_half(x) sin`` in float32, returned in ``x``'s dtype."""
    xf = x.float()
    half = xf.shape[-1] // 2
    turned = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos + turned * sin).to(x.dtype)


def alibi_slopes(heads: int, device=None) -> torch.Tensor:
    """ALiBi's head slopes (Press et al. 2022): the geometric series ``2^(-8 i / n)``, i = 1..n, for a power of two;
    otherwise the series of the nearest lower power, then every other slope of the series of twice that."""
    def series(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if heads & (heads - 1) == 0:
        return torch.tensor(series(heads), device=device)
    low = 2 ** int(math.floor(math.log2(heads)))
    return torch.tensor(series(low) + series(2 * low)[0::2][:heads - low], device=device)
