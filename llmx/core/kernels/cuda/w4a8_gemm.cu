// W4A8 GEMM (Quamba2, arXiv 2503.22879, Sec. 5 / W4A8 path): int8 activation codes times int4 weight codes, exact int32
// accumulation inside each weight group, float scaling at each group end.
// xq: int8 [M, K]; x_scale: float [M] (per row) or [1] (per tensor), x_scale_len says which.
// qweight: uint8 [N, ceil(K/8)*4], two codes per byte, low nibble first, stored value = code + 8 (code in [-8, 7]).
// scales: float [N, G], G = ceil(K / group_size) (the fp16 storage scales, converted to float32 on the host); the last
// group may be ragged. bias: float [N] or null.
// out[m, n] = x_scale[m] * sum_g scales[n, g] * sum_{k in g} xq[m, k] * code(n, k) + bias[n]
// One thread per output column n, looping over rows m (grid.y strides). When groups start on 8-code boundaries and rows
// are 4-byte aligned, 8 codes at a time go through two __dp4a (sm_61+); the rest by plain integer multiply-add.

// sum_{i<8} x[i] * code(i) for 8 int8 activations and 4 bytes of packed int4 codes, both 4-byte aligned.
__device__ __forceinline__ int dot8(const signed char* x, const unsigned char* w) {
    unsigned int wb = *reinterpret_cast<const unsigned int*>(w);
    unsigned int xa = *reinterpret_cast<const unsigned int*>(x);
    unsigned int xb = *reinterpret_cast<const unsigned int*>(x + 4);
    int even = (int)__vsub4(wb & 0x0F0F0F0Fu, 0x08080808u);         // codes 0, 2, 4, 6 as signed bytes
    int odd = (int)__vsub4((wb >> 4) & 0x0F0F0F0Fu, 0x08080808u);   // codes 1, 3, 5, 7
    int acc = __dp4a((int)__byte_perm(xa, xb, 0x6420), even, 0);
    return __dp4a((int)__byte_perm(xa, xb, 0x7531), odd, acc);
}

extern "C" __global__ void w4a8_gemm(const signed char* __restrict__ xq, const float* __restrict__ x_scale,
                                     int x_scale_len, const unsigned char* __restrict__ qweight,
                                     const float* __restrict__ scales, const float* __restrict__ bias,
                                     float* __restrict__ out, int M, int N, int K, int group_size) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    int G = (K + group_size - 1) / group_size;
    int row_bytes = (K + 7) / 8 * 4;
    const unsigned char* w = qweight + (long long)n * row_bytes;
    const float* s = scales + (long long)n * G;
    bool vec = group_size % 8 == 0 && K % 4 == 0 && ((unsigned long long)xq & 3) == 0 &&
               ((unsigned long long)qweight & 3) == 0;
    float b = bias ? bias[n] : 0.f;
    for (int m = blockIdx.y; m < M; m += gridDim.y) {
        const signed char* xr = xq + (long long)m * K;
        float acc = 0.f;
        for (int g = 0; g < G; ++g) {
            int k = g * group_size;
            int k1 = min(K, k + group_size);
            int partial = 0;
            if (vec)
                for (; k + 8 <= k1; k += 8) partial += dot8(xr + k, w + (k >> 1));
            for (; k < k1; ++k) {
                unsigned char byte = w[k >> 1];
                partial += (int)xr[k] * (((k & 1) ? byte >> 4 : byte & 15) - 8);
            }
            acc += (float)partial * s[g];
        }
        out[(long long)m * N + n] = acc * x_scale[x_scale_len == 1 ? 0 : m] + b;
    }
}
