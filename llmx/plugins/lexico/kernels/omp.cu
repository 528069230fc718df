// Batched Gram-based OMP, one thread block per signal (Lexico, arXiv 2412.08890, Sec. 3). Inputs: b = D^T x [M, N]
// and G = D^T D [N, N] (both from cuBLAS GEMMs on the host side). Each iteration: block-wide argmax of the
// correlations |c_j| = |b_j - sum_i G[S_i, j] g_i| over atoms not yet chosen (computed as they are scanned, read from
// G's rows since G is symmetric: coalesced), incremental Cholesky row for the new atom (thread 0; k <= MAX_S), then the
// least-squares refit g on the support by two triangular solves (thread 0).
// No dynamic shared memory: the correlations are never stored, so any number of atoms fits (static shared memory
// only, about 6.5 KiB, whatever N).
// Early stop (the signal takes no further atom; the remaining slots repeat its first atom with coefficient 0):
//  - rank: at most min(s, d) atoms, d the signals' dimension (no more are linearly independent);
//  - no atom left (all N taken), or the best correlation at most `dead` times the first pick's (max_j |b_j|): the
//    residual is exhausted up to rounding (a zero signal stops at once);
//  - the pick's pivot G_jj - |w|^2 (squared norm of its part outside the chosen span) at most `degenerate` times
//    G_jj: the atom lies in that span up to the fp32 rounding of the pivot, which cancels ~1 against |w|^2 ~1.
// The host passes both thresholds (omp.py: KERNEL_DEGENERATE, KERNEL_DEAD, justified there).
// Output: idx [M, s] (int64) and coef [M, s] (float32), the same contract as the PyTorch reference.
#define MAX_S 32
#define THREADS 256

extern "C" __global__ void omp_gram(const float* __restrict__ b, const float* __restrict__ G,
                                    long long* __restrict__ idx_out, float* __restrict__ coef_out,
                                    int M, int N, int s, int d, float degenerate, float dead) {
    int m = blockIdx.x;
    if (m >= M) return;
    __shared__ float best_val[THREADS];
    __shared__ int best_idx[THREADS];
    __shared__ int support[MAX_S];
    __shared__ float L[MAX_S * MAX_S];
    __shared__ float gamma[MAX_S];
    __shared__ float rhs[MAX_S];
    __shared__ int used;                    // atoms kept: the loop's bound, lowered by an early stop
    const float* bm = b + (long long)m * N;
    float first = 0.f;                      // thread 0: |c| of the first pick
    if (threadIdx.x == 0) used = s < d ? s : d;
    __syncthreads();
    for (int k = 0; k < used; ++k) {
        float v = -1.f;
        int arg = 0;
        for (int j = threadIdx.x; j < N; j += blockDim.x) {
            float c = bm[j];
            bool taken = false;
            for (int i = 0; i < k; ++i) {
                c -= G[(long long)support[i] * N + j] * gamma[i];
                taken |= (support[i] == j);
            }
            float a = taken ? -1.f : fabsf(c);
            if (a > v) { v = a; arg = j; }
        }
        best_val[threadIdx.x] = v;
        best_idx[threadIdx.x] = arg;
        __syncthreads();
        for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
            if (threadIdx.x < stride) {
                float o = best_val[threadIdx.x + stride];
                int oi = best_idx[threadIdx.x + stride];
                if (o > best_val[threadIdx.x] || (o == best_val[threadIdx.x] && oi < best_idx[threadIdx.x])) {
                    best_val[threadIdx.x] = o;
                    best_idx[threadIdx.x] = oi;
                }
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            int j = best_idx[0];
            float best = best_val[0];       // -1 when every atom is taken
            if (k == 0) first = best;
            support[k] = j;
            bool stop = best < 0.f || best <= dead * first;
            float pivot = 0.f;
            if (!stop) {
                // new Cholesky row: w = L^{-1} G[S, j]; L[k, k] = sqrt(G[j, j] - |w|^2)
                float norm = 0.f;
                for (int r = 0; r < k; ++r) {
                    float acc = G[(long long)support[r] * N + j];
                    for (int q = 0; q < r; ++q) acc -= L[r * MAX_S + q] * L[k * MAX_S + q];
                    float w = acc / L[r * MAX_S + r];
                    L[k * MAX_S + r] = w;
                    norm += w * w;
                }
                float gjj = G[(long long)j * N + j];
                pivot = gjj - norm;
                stop = pivot <= degenerate * gjj;
            }
            if (stop) {
                used = k;
            } else {
                L[k * MAX_S + k] = sqrtf(pivot);
                // refit: L z = b_S, L^T g = z
                for (int r = 0; r <= k; ++r) {
                    float acc = bm[support[r]];
                    for (int q = 0; q < r; ++q) acc -= L[r * MAX_S + q] * rhs[q];
                    rhs[r] = acc / L[r * MAX_S + r];
                }
                for (int r = k; r >= 0; --r) {
                    float acc = rhs[r];
                    for (int q = r + 1; q <= k; ++q) acc -= L[q * MAX_S + r] * gamma[q];
                    gamma[r] = acc / L[r * MAX_S + r];
                }
            }
        }
        __syncthreads();
    }
    if (threadIdx.x < s) {
        bool kept = threadIdx.x < used;
        idx_out[(long long)m * s + threadIdx.x] = kept ? support[threadIdx.x] : support[0];
        coef_out[(long long)m * s + threadIdx.x] = kept ? gamma[threadIdx.x] : 0.f;
    }
}
