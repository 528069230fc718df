// LUT GEMM/GEMV (LUTLinear's layout): out[m, n] = sum_k x[m, k] * codebook[n, idx(n, k)] + bias[n].
// Indices: b-bit codes packed densely along K (llmx packing: code k occupies bits [k*b, (k+1)*b) of the row's
// little-endian byte stream; rows padded to a multiple of 8 codes, ceil(K/8)*b bytes). Codebook: float [N, 2^b].
// One thread per output column n, striding over rows m (grid.y is capped at 65535).
extern "C" __global__ void lut_gemm(const float* __restrict__ x, const unsigned char* __restrict__ qweight,
                                    const float* __restrict__ codebook, const float* __restrict__ bias,
                                    float* __restrict__ out, int M, int N, int K, int bits) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    int row_bytes = (K + 7) / 8 * bits;
    int entries = 1 << bits;
    const unsigned char* w = qweight + (long long)n * row_bytes;
    const float* cb = codebook + (long long)n * entries;
    unsigned mask = (1u << bits) - 1u;
    for (int m = blockIdx.y; m < M; m += gridDim.y) {
        const float* xr = x + (long long)m * K;
        float acc = 0.f;
        for (int k = 0; k < K; ++k) {
            long long bit = (long long)k * bits;
            int byte = (int)(bit >> 3);
            unsigned word = w[byte];
            if (byte + 1 < row_bytes) word |= (unsigned)w[byte + 1] << 8;
            unsigned code = (word >> (bit & 7)) & mask;
            acc += xr[k] * cb[code];
        }
        out[(long long)m * N + n] = acc + (bias ? bias[n] : 0.f);
    }
}
