// LUT GEMM/GEMV (LUTLinear's layout): out[m, n] = sum_k x[m, k] * codebook[n, idx(n, k)] + bias[n].
// Indices: b-bit codes packed densely along K (llmx packing: code k occupies bits [k*b, (k+1)*b) of the row's
// little-endian byte stream; rows padded to a multiple of 8 codes, ceil(K/8)*b bytes). Codebook: float [N, 2^b].
// One warp per (m, n): lanes stride over K (coalesced reads of x and of the packed row), a warp-shuffle sum at the
// end; blockDim.x = 32 * warps, grid = (ceil(N / warps), min(M, 65535)) with a stride over the rows beyond.
extern "C" __global__ void lut_gemm(const float* __restrict__ x, const unsigned char* __restrict__ qweight,
                                    const float* __restrict__ codebook, const float* __restrict__ bias,
                                    float* __restrict__ out, int M, int N, int K, int bits) {
    int warps = blockDim.x >> 5, lane = threadIdx.x & 31;
    int n = blockIdx.x * warps + (threadIdx.x >> 5);
    if (n >= N) return;  // uniform per warp
    int row_bytes = (K + 7) / 8 * bits;
    const unsigned char* w = qweight + (long long)n * row_bytes;
    const float* cb = codebook + ((long long)n << bits);
    unsigned mask = (1u << bits) - 1u;
    for (int m = blockIdx.y; m < M; m += gridDim.y) {
        const float* xr = x + (long long)m * K;
        float acc = 0.f;
        for (int k = lane; k < K; k += 32) {
            long long bit = (long long)k * bits;
            int byte = (int)(bit >> 3);
            unsigned word = w[byte];
            if (byte + 1 < row_bytes) word |= (unsigned)w[byte + 1] << 8;
            acc += xr[k] * cb[(word >> (bit & 7)) & mask];
        }
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) out[(long long)m * N + n] = acc + (bias ? bias[n] : 0.f);
    }
}
