/* specserve: the element-wise parts of a Llama decoder layer for a few token rows, float32.
 *
 * A decode step on the real model (SmolLM2-135M, 30 layers) spent ~100 ATen calls a layer on
 * RMSNorm, RoPE, the KV write, SiLU-and-multiply and the residual adds: 6 ms of ATen time and
 * about as much Python a step, against ~35 ms of weight reads. These loops do the same math
 * in one call each, on M rows of hidden size H (rows contiguous, at a row stride):
 *
 * - rms_rows:      y = w * x * rsqrt(mean(x^2) + eps)              (RMSNorm, Zhang & Sennrich
 *                                                                    2019; HF Llama's, in float32)
 * - add_rms_rows:  x += r; y = rms(x)                               (residual, then the next norm)
 * - rope_kv_rows:  q and k heads rotated in place, out = x * cos + roll(x, D/2) * sin, the sin
 *                  table signed [-sin, sin] (rotate_half, RoFormer: Su et al. 2021); then each
 *                  row's k and v heads copied to its cache slot
 * - silu_mul_rows: out = silu(g) * u for gu = [g | u]               (SwiGLU, Shazeer 2020)
 *
 * Sums are float32, in a different order than ATen's (reassociated, vectorised): equal to the
 * torch path within float32 rounding (tests/runtime/test_cpu_layer.py). One thread. Built and
 * loaded by specserve/runtime/cpu_layer.py. */
#include <math.h>
#include <stdint.h>
#include <string.h>

static float inv_rms(const float* x, int h, float eps) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < h; i++) s += x[i] * x[i];
    return 1.0f / sqrtf(s / (float)h + eps);
}

void specserve_rms_rows(const float* x, int64_t xs, const float* w, float* y, int64_t ys,
                        int m, int h, float eps) {
    for (int r = 0; r < m; r++) {
        const float* xr = x + r * xs;
        float* yr = y + r * ys;
        const float inv = inv_rms(xr, h, eps);
#pragma omp simd
        for (int i = 0; i < h; i++) yr[i] = w[i] * (xr[i] * inv);
    }
}

void specserve_add_rms_rows(float* x, int64_t xs, const float* a, int64_t as, const float* w,
                            float* y, int64_t ys, int m, int h, float eps) {
    for (int r = 0; r < m; r++) {
        float* xr = x + r * xs;
        const float* ar = a + r * as;
#pragma omp simd
        for (int i = 0; i < h; i++) xr[i] += ar[i];
        const float inv = inv_rms(xr, h, eps);
        float* yr = y + r * ys;
#pragma omp simd
        for (int i = 0; i < h; i++) yr[i] = w[i] * (xr[i] * inv);
    }
}

/* qkv: M rows (row r is token t = r % t_per_row of batch row b = r / t_per_row) of
 * (nh + 2 nkv) heads of d floats: q heads, then k heads, then v heads. cos / sin: row r's
 * tables at cos + b * cbs + t * cts. Slot of row r: slots[r]. Cache k / v of batch row b,
 * head j, slot s at kbuf + b * kbs + j * khs + s * kss (the same for v). d <= 256. */
void specserve_rope_kv_rows(float* qkv, int64_t qs, const float* cos, const float* sin,
                            int64_t cbs, int64_t cts, float* kbuf, int64_t kbs, int64_t khs,
                            int64_t kss, float* vbuf, int64_t vbs, int64_t vhs, int64_t vss,
                            const int64_t* slots, int m, int t_per_row, int nh, int nkv, int d) {
    const int half = d / 2;
    float tmp[256];
    for (int r = 0; r < m; r++) {
        const int b = r / t_per_row, t = r % t_per_row;
        float* row = qkv + r * qs;
        const float* c = cos + b * cbs + t * cts;
        const float* s = sin + b * cbs + t * cts;
        for (int j = 0; j < nh + nkv; j++) {
            float* x = row + (int64_t)j * d;
            memcpy(tmp, x, sizeof(float) * (size_t)d);
#pragma omp simd
            for (int i = 0; i < half; i++) x[i] = tmp[i] * c[i] + tmp[i + half] * s[i];
#pragma omp simd
            for (int i = half; i < d; i++) x[i] = tmp[i] * c[i] + tmp[i - half] * s[i];
        }
        const int64_t slot = slots[r];
        for (int j = 0; j < nkv; j++) {
            memcpy(kbuf + b * kbs + j * khs + slot * kss, row + (int64_t)(nh + j) * d,
                   sizeof(float) * (size_t)d);
            memcpy(vbuf + b * vbs + j * vhs + slot * vss, row + (int64_t)(nh + nkv + j) * d,
                   sizeof(float) * (size_t)d);
        }
    }
}

void specserve_silu_mul_rows(const float* gu, int64_t gs, float* out, int64_t os, int m,
                             int inter) {
    for (int r = 0; r < m; r++) {
        const float* g = gu + r * gs;
        const float* u = g + inter;
        float* o = out + r * os;
#pragma omp simd
        for (int i = 0; i < inter; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}
