// Quamba2 (arXiv 2503.22879, Sec. 5 / W4A8 path): Mamba2's depthwise causal conv1d + SiLU, quantized to int8 with
// static per-channel scales in the same pass, so the conv output is never written in float.
// xbc: float [B, T, C]; weight: float [C, K] (the nn.Conv1d [C, 1, K] weight); bias: float [C] or null;
// out_scale: float [C]. out[b, t, c] = clamp(rint(silu(y) / out_scale[c]), -128, 127) with
// y = bias[c] + sum_j weight[c, j] * xbc[b, t - (K-1) + j, c] (zero before t = 0).
// rintf rounds half to even, like torch.round. One thread per output.
extern "C" __global__ void conv_silu_quant_int8(const float* __restrict__ xbc, const float* __restrict__ weight,
                                                const float* __restrict__ bias, const float* __restrict__ out_scale,
                                                signed char* __restrict__ out, int B, int T, int C, int K) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)B * T * C) return;
    int c = (int)(i % C);
    long long bt = i / C;
    int t = (int)(bt % T);
    float y = bias ? bias[c] : 0.f;
    for (int j = max(0, K - 1 - t); j < K; ++j) y += weight[c * K + j] * xbc[(bt - (K - 1) + j) * C + c];
    float v = rintf(y / (1.f + expf(-y)) / out_scale[c]);
    out[i] = (signed char)fminf(fmaxf(v, -128.f), 127.f);
}
