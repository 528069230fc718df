// int4-weight x float-activation GEMM/GEMV with on-the-fly dequantization (llmx QuantLinear layout).
// Weights: codes packed along K, two per byte, low nibble first (code k at byte k/2); stored value = code + offset.
// Scales: float [N, G] (G = ceil(K / group_size)); zeros: uint8 [N, G] or null (symmetric).
// out[m, n] = sum_k x[m, k] * (code(n, k) - zero(n, g(k))) * scale(n, g(k)) + bias[n]
extern "C" __global__ void int4_dequant_gemm(const float* __restrict__ x, const unsigned char* __restrict__ qweight,
                                             const float* __restrict__ scales, const unsigned char* __restrict__ zeros,
                                             const float* __restrict__ bias, float* __restrict__ out, int M, int N,
                                             int K, int group_size, int offset) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    int G = (K + group_size - 1) / group_size;
    int row_bytes = (K + 7) / 8 * 4;
    const unsigned char* w = qweight + (long long)n * row_bytes;
    for (int m = blockIdx.y; m < M; m += gridDim.y) {  // grid.y is capped at 65535: stride over the rows beyond
        const float* xr = x + (long long)m * K;
        float acc = 0.f;
        for (int g = 0; g < G; ++g) {
            float s = scales[(long long)n * G + g];
            float z = zeros ? (float)zeros[(long long)n * G + g] : (float)offset;
            int k0 = g * group_size;
            int k1 = min(K, k0 + group_size);
            float partial = 0.f;
            for (int k = k0; k < k1; ++k) {
                unsigned char byte = w[k >> 1];
                int code = (k & 1) ? (byte >> 4) : (byte & 15);
                partial += xr[k] * ((float)code - z);
            }
            acc += partial * s;
        }
        out[(long long)m * N + n] = acc + (bias ? bias[n] : 0.f);
    }
}
