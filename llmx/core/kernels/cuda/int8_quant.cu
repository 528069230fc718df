// Per-row symmetric int8 quantization of activations: scale[r] = max|x[r, :]| / 127, q = round(x / scale).
// One block per row; a shared-memory tree reduction finds the absmax. blockDim.x must be a power of two <= 1024.
extern "C" __global__ void quantize_rows_int8(const float* __restrict__ x, signed char* __restrict__ q,
                                              float* __restrict__ scale, int rows, int cols) {
    __shared__ float smax[1024];
    int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = x + (long long)r * cols;
    float local = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) local = fmaxf(local, fabsf(xr[c]));
    smax[threadIdx.x] = local;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) smax[threadIdx.x] = fmaxf(smax[threadIdx.x], smax[threadIdx.x + stride]);
        __syncthreads();
    }
    float s = fmaxf(smax[0] / 127.f, 1e-8f);
    if (threadIdx.x == 0) scale[r] = s;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = rintf(xr[c] / s);
        q[(long long)r * cols + c] = (signed char)fminf(fmaxf(v, -128.f), 127.f);
    }
}
