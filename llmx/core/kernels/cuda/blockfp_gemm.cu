// GEMM over two packed half-unit block operands (MXFP4, BlockDialect): out[m, n] = sum_b 2^(ea + eb - 2) * sum_k
// ka * kb, with ka, kb the signed half-unit integers (|k| <= 15) of A's row m and B's row n in block b of 32, summed in
// int32 per block pair, rescaled by a power of two (ldexpf) and accumulated in float32.
// Codes: sign + 3-bit index, two per byte, low nibble first; exps: E8M0 (e + 127); tids: a table id per block;
// tables: half-unit magnitudes [n_tables * 8]. A 16 x 16 output tile per thread block; each block pair's operands
// are decoded once into shared memory.
#define TILE 16
extern "C" __global__ void blockfp_gemm(const unsigned char* __restrict__ a_codes, const unsigned char* __restrict__ a_exp,
                                        const unsigned char* __restrict__ a_tid, const int* __restrict__ a_tables,
                                        const unsigned char* __restrict__ b_codes, const unsigned char* __restrict__ b_exp,
                                        const unsigned char* __restrict__ b_tid, const int* __restrict__ b_tables,
                                        float* __restrict__ out, int M, int N, int nb) {
    __shared__ int sa[TILE][33];
    __shared__ int sb[TILE][33];
    __shared__ int ea[TILE], eb[TILE];
    int tx = threadIdx.x, ty = threadIdx.y, tid = ty * TILE + tx;
    int m0 = blockIdx.y * TILE, n0 = blockIdx.x * TILE;
    float acc = 0.f;
    for (int b = 0; b < nb; ++b) {
        for (int i = tid; i < 2 * TILE * 32; i += TILE * TILE) {
            int which = i / (TILE * 32), r = (i / 32) % TILE, k = i % 32;
            int row = (which ? n0 : m0) + r, rows = which ? N : M;
            int val = 0;
            if (row < rows) {
                const unsigned char* codes = which ? b_codes : a_codes;
                const unsigned char* tids = which ? b_tid : a_tid;
                const int* tables = which ? b_tables : a_tables;
                unsigned char byte = codes[((long long)row * nb + b) * 16 + (k >> 1)];
                int nib = (k & 1) ? (byte >> 4) : (byte & 15);
                val = tables[tids[(long long)row * nb + b] * 8 + (nib & 7)];
                val = (nib & 8) ? -val : val;
            }
            (which ? sb : sa)[r][k] = val;
        }
        if (tid < 2 * TILE) {
            int which = tid / TILE, r = tid % TILE, row = (which ? n0 : m0) + r;
            int e = 0;
            if (row < (which ? N : M)) e = (int)(which ? b_exp : a_exp)[(long long)row * nb + b];
            (which ? eb : ea)[r] = e;
        }
        __syncthreads();
        int dot = 0;
        for (int k = 0; k < 32; ++k) dot += sa[ty][k] * sb[tx][k];
        acc += ldexpf((float)dot, ea[ty] + eb[tx] - 256);
        __syncthreads();
    }
    int m = m0 + ty, n = n0 + tx;
    if (m < M && n < N) out[(long long)m * N + n] = acc;
}
