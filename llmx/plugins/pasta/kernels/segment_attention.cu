// Pasta-Lang decode attention over one interleaved KV cache (arXiv 2502.11517, the interpreter's layout): each
// cache slot s has an owner thread owner[s]; query row t sees slot s iff s < limit[t, owner[s]] (the slots of an
// owner it sees, up to a bound: a chunk sees the main thread through its promise, the main thread sees a chunk from
// the join on). No dense mask is read. One block per (query row, query head); GQA maps head h to KV head h / n_rep.
//   q: [Hq, T, D], k, v: [Hkv, S, D], out: [T, Hq, D], scratch: [T, Hq, S] (float32, contiguous)
// Three passes in the block: scores and their max, exponentials and their sum, the weighted sum of values.
#define BLOCK 128
#define NEG_INF __int_as_float(0xff800000)  // NVRTC defines no INFINITY

__device__ float block_reduce(float x, float* shared, bool is_max) {
    const int lane = threadIdx.x;
    shared[lane] = x;
    __syncthreads();
    for (int stride = BLOCK / 2; stride > 0; stride >>= 1) {
        if (lane < stride) {
            float other = shared[lane + stride];
            shared[lane] = is_max ? fmaxf(shared[lane], other) : shared[lane] + other;
        }
        __syncthreads();
    }
    float out = shared[0];
    __syncthreads();
    return out;
}

extern "C" __global__ void pasta_segment_attention(const float* __restrict__ q, const float* __restrict__ k,
                                                   const float* __restrict__ v, const int* __restrict__ owner,
                                                   const int* __restrict__ limit, float* __restrict__ out,
                                                   float* __restrict__ scratch, int T, int S, int Hq, int Hkv, int D,
                                                   int owners, float scale) {
    __shared__ float shared[BLOCK];
    const int t = blockIdx.x, h = blockIdx.y, kh = h / (Hq / Hkv);
    const float* qv = q + ((long long)h * T + t) * D;
    const int* lim = limit + (long long)t * owners;
    float* sc = scratch + ((long long)t * Hq + h) * S;
    float local_max = NEG_INF;
    for (int s = threadIdx.x; s < S; s += BLOCK) {
        float x = NEG_INF;
        if (s < lim[owner[s]]) {
            const float* kv = k + ((long long)kh * S + s) * D;
            float dot = 0.f;
            for (int d = 0; d < D; ++d) dot += qv[d] * kv[d];
            x = dot * scale;
        }
        sc[s] = x;
        local_max = fmaxf(local_max, x);
    }
    const float m = block_reduce(local_max, shared, true);
    float local_sum = 0.f;
    for (int s = threadIdx.x; s < S; s += BLOCK) {
        float e = sc[s] == NEG_INF ? 0.f : expf(sc[s] - m);
        sc[s] = e;
        local_sum += e;
    }
    const float total = block_reduce(local_sum, shared, false);
    for (int d = threadIdx.x; d < D; d += BLOCK) {
        float acc = 0.f;
        for (int s = 0; s < S; ++s) acc += sc[s] * v[((long long)kh * S + s) * D + d];
        out[((long long)t * Hq + h) * D + d] = total > 0.f ? acc / total : 0.f;
    }
}
