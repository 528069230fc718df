// FoPE (arXiv 2412.17739) in one pass: build the per-KV-head Fourier tables for a tile of positions and rotate
// that head's k and the n_rep query heads that read it. One block per (position tile, KV head, batch row).
//   sin_out[t, j] = sum_k sin(w_k p_t) A_s[h, k, j]   (j < d_out; sin = cos = 1 beyond)
//   out[j]        = x[j] c_j - x[j + half] s_j,   out[j + half] = x[j + half] c_j + x[j] s_j
// sign = -1 applies the transposed rotation (the backward of a frozen table).
// q: [B, Hq, T, head_dim], k: [B, Hkv, T, head_dim], float32 contiguous; positions: [B, T] int64.
#define TILE 8
#define MAX_FREQS 128

extern "C" __global__ void fope_rotate(const float* __restrict__ q, const float* __restrict__ k,
                                       const long long* __restrict__ positions, const float* __restrict__ freqs,
                                       const float* __restrict__ sin_coef, const float* __restrict__ cos_coef,
                                       float* __restrict__ q_out, float* __restrict__ k_out,
                                       int T, int Hq, int Hkv, int head_dim, int D, int d_out, float sign) {
    __shared__ float basis_sin[TILE][MAX_FREQS];
    __shared__ float basis_cos[TILE][MAX_FREQS];
    const int t0 = blockIdx.x * TILE, h = blockIdx.y, b = blockIdx.z;
    const int half = head_dim / 2, n_rep = Hq / Hkv;
    for (int i = threadIdx.x; i < TILE * D; i += blockDim.x) {
        int tt = i / D, f = i % D, t = t0 + tt;
        float angle = t < T ? (float)positions[(long long)b * T + t] * freqs[f] : 0.f;
        basis_sin[tt][f] = sinf(angle);
        basis_cos[tt][f] = cosf(angle);
    }
    __syncthreads();
    const float* As = sin_coef + (long long)h * D * d_out;
    const float* Ac = cos_coef + (long long)h * D * d_out;
    for (int i = threadIdx.x; i < TILE * half; i += blockDim.x) {
        int tt = i / half, j = i % half, t = t0 + tt;
        if (t >= T) continue;
        float s = 1.f, c = 1.f;
        if (j < d_out) {
            s = 0.f; c = 0.f;
            for (int f = 0; f < D; ++f) {
                s += basis_sin[tt][f] * As[f * d_out + j];
                c += basis_cos[tt][f] * Ac[f * d_out + j];
            }
        }
        s *= sign;
        long long row = (((long long)b * Hkv + h) * T + t) * head_dim;
        float x1 = k[row + j], x2 = k[row + j + half];
        k_out[row + j] = x1 * c - x2 * s;
        k_out[row + j + half] = x2 * c + x1 * s;
        for (int r = 0; r < n_rep; ++r) {
            long long qrow = (((long long)b * Hq + h * n_rep + r) * T + t) * head_dim;
            float y1 = q[qrow + j], y2 = q[qrow + j + half];
            q_out[qrow + j] = y1 * c - y2 * s;
            q_out[qrow + j + half] = y2 * c + y1 * s;
        }
    }
}
