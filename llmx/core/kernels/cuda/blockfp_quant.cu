// Fused block quantizer for power-of-two (E8M0) block formats on the half-unit grid (MXFP4, BlockDialect): one warp
// per block of 32 along the row. Warp amax -> exponent floor(log2 amax) - emax (optionally bumped when the rounded
// scaled max exceeds every table) -> candidate tables for the half-unit max (two-stage; every table for min-MSE) ->
// the candidate with the lowest squared error (first on ties) -> sign + 3-bit index, two codes per byte.
// tables: half-unit magnitudes [n_tables * 8], sorted per table; cand: [17 * n_cand] table ids per half-unit max.
extern "C" __global__ void blockfp_quantize(const float* __restrict__ x, unsigned char* __restrict__ codes,
                                            unsigned char* __restrict__ exps, unsigned char* __restrict__ tids,
                                            const int* __restrict__ tables, const int* __restrict__ cand, int n_cand,
                                            int emax, int bump, int top_half, long long n_blocks) {
    long long blk = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (blk >= n_blocks) return;  // uniform per warp: blockDim.x is a multiple of 32
    float v = x[blk * 32 + lane];
    float a = fabsf(v);
    float amax = a;
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    int e = -127;
    if (amax > 0.f) {
        int ex;
        frexpf(amax, &ex);
        e = max(-127, min(127, ex - 1 - emax));
    }
    float sa = ldexpf(a, -e), smax = ldexpf(amax, -e);
    if (bump && rintf(2.f * smax) > (float)top_half && e < 127) {
        ++e;
        sa = ldexpf(a, -e);
        smax = ldexpf(amax, -e);
    }
    int h = (int)fminf(fmaxf(rintf(2.f * smax), 0.f), 16.f);
    float best = 3.402823466e38f;
    int best_t = cand[h * n_cand], best_i = 0;
    for (int c = 0; c < n_cand; ++c) {
        int t = cand[h * n_cand + c];
        const int* m = tables + t * 8;
        int lo = 0, hi = 0;  // midpoints below a, and at or below a: ties go to the even index
        for (int j = 0; j < 7; ++j) {
            float mid = 0.25f * (float)(m[j] + m[j + 1]);
            lo += mid < sa;
            hi += mid <= sa;
        }
        int idx = (lo == hi || (lo & 1) == 0) ? lo : hi;
        float d = sa - 0.5f * (float)m[idx];
        float err = d * d;
        for (int o = 16; o > 0; o >>= 1) err += __shfl_xor_sync(0xffffffffu, err, o);
        if (err < best) {
            best = err;
            best_t = t;
            best_i = idx;
        }
    }
    int code = ((v < 0.f && best_i > 0) ? 8 : 0) | best_i;
    int next = __shfl_down_sync(0xffffffffu, code, 1);
    if ((lane & 1) == 0) codes[blk * 16 + (lane >> 1)] = (unsigned char)(code | (next << 4));
    if (lane == 0) {
        exps[blk] = (unsigned char)(e + 127);
        tids[blk] = (unsigned char)best_t;
    }
}
