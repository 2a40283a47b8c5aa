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
#include <stdlib.h>
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

/* The few-row linear (linear_rows.c) and attention (attn_rows.c) kernels, linked into the same
 * library as this file (cpu_layer.py builds the three together). */
int specserve_linear_rows_f32(const float* x, int64_t xs, const float* w, int64_t ws,
                              const float* bias, float* y, int64_t ys, int M, int N, int K);
int specserve_linear_panels_f32(const float* x, int64_t xs, const float* p, const float* bias,
                                float* y, int64_t ys, int M, int N, int K);
int specserve_attn_rows_f32(
        const float* q, int64_t qb, int64_t qh, int64_t qt,
        const float* k, int64_t kb, int64_t kh, int64_t ks,
        const float* v, int64_t vb, int64_t vh, int64_t vs,
        const int64_t* start, const int64_t* len, const uint8_t* node, int W,
        float* out, int64_t ob, int64_t ot, int64_t oh,
        int B, int H, int Hkv, int T, int D, int64_t max_past, float scale);

/* One layer's addresses in the table of specserve_layers_rows_f32, LAYER_FIELDS int64 each:
 * weights (row-major, contiguous rows), biases (0: none) and the weights as panels
 * (linear_rows.c; 0: none), the layer's K and V cache buffers [B, nkv, S, D] and their element
 * strides. */
enum { ATTN_NORM, QKV_W, QKV_B, O_W, O_B, MLP_NORM, GATE_UP_W, GATE_UP_B, DOWN_W, DOWN_B,
       QKV_P, O_P, GATE_UP_P, DOWN_P, K_BUF, V_BUF, K_B, K_H, K_S, V_B, V_H, V_S, LAYER_FIELDS };

#define P(i, f) ((float*)(intptr_t)table[(int64_t)(i) * LAYER_FIELDS + (f)])

/* y [M, N] = x [M, K] @ w^T + b: from the panels p where there are (0: none), else from w
 * [N, K] (row-major). Returns 0, or 1 when the panel kernel's scratch failed. */
static int linear(const float* x, int64_t xs, const float* w, const float* p, const float* b,
                  float* y, int64_t ys, int M, int N, int K) {
    if (p) return specserve_linear_panels_f32(x, xs, p, b, y, ys, M, N, K);
    return specserve_linear_rows_f32(x, xs, w, K, b, y, ys, M, N, K);
}

/* A whole forward's layers for M = B T rows in one call (cpu_forward.py's one_call; it was
 * nine calls a layer): per layer q/k/v, RoPE and the KV write, attention over each row's own
 * keys, o, residual add + RMSNorm, gate/up, SiLU-and-multiply, down, residual add + the next
 * RMSNorm (the last layer's: final_norm). x [M, H] (contiguous) is the residual stream,
 * updated in place; y [M, H] gets the final-norm hidden states. aux_col[i] >= 0 (i = 0 .. L)
 * copies the residual stream entering layer i (L: leaving the last) into columns
 * aux_col[i] * H .. of aux [M, naux * H]. cos / sin, slots: as specserve_rope_kv_rows;
 * start, len, node, W, max_past: as specserve_attn_rows_f32. Returns 0, or 1 when scratch
 * could not be allocated. */
int specserve_layers_rows_f32(const int64_t* table, int L, const float* final_norm, float* x,
                              float* y, float* aux, const int32_t* aux_col, int naux,
                              const float* cos, const float* sin, int64_t cbs, int64_t cts,
                              const int64_t* slots, const int64_t* start, const int64_t* len,
                              const uint8_t* node, int W, int64_t max_past, int B, int T, int H,
                              int nh, int nkv, int D, int I, float eps) {
    const int M = B * T, NQKV = (nh + 2 * nkv) * D, NA = nh * D;
    float* qkv = (float*)malloc(sizeof(float) * (size_t)M * (size_t)(NQKV + NA + H + 3 * I));
    if (!qkv) return 1;
    float *att = qkv + (size_t)M * NQKV, *tmp = att + (size_t)M * NA, *gu = tmp + (size_t)M * H,
          *act = gu + (size_t)M * 2 * I;
    int rc = 0;
    if (L > 0) specserve_rms_rows(x, H, P(0, ATTN_NORM), y, H, M, H, eps);
    for (int i = 0; i < L && rc == 0; i++) {
        const int64_t* f = table + (int64_t)i * LAYER_FIELDS;
        if (aux_col[i] >= 0)
            for (int r = 0; r < M; r++)
                memcpy(aux + (int64_t)r * naux * H + (int64_t)aux_col[i] * H, x + (int64_t)r * H,
                       sizeof(float) * (size_t)H);
        rc = linear(y, H, P(i, QKV_W), P(i, QKV_P), P(i, QKV_B), qkv, NQKV, M, NQKV, H);
        if (rc) break;
        specserve_rope_kv_rows(qkv, NQKV, cos, sin, cbs, cts, P(i, K_BUF), f[K_B], f[K_H],
                               f[K_S], P(i, V_BUF), f[V_B], f[V_H], f[V_S], slots, M, T, nh,
                               nkv, D);
        rc = specserve_attn_rows_f32(qkv, (int64_t)T * NQKV, D, NQKV, P(i, K_BUF), f[K_B],
                                     f[K_H], f[K_S], P(i, V_BUF), f[V_B], f[V_H], f[V_S], start,
                                     len, node, W, att, (int64_t)T * NA, NA, D, B, nh, nkv, T,
                                     D, max_past, (float)(1.0 / sqrt((double)D)));
        if (rc) break;
        rc |= linear(att, NA, P(i, O_W), P(i, O_P), P(i, O_B), tmp, H, M, H, NA);
        specserve_add_rms_rows(x, H, tmp, H, P(i, MLP_NORM), y, H, M, H, eps);
        rc |= linear(y, H, P(i, GATE_UP_W), P(i, GATE_UP_P), P(i, GATE_UP_B), gu, 2 * I, M,
                     2 * I, H);
        specserve_silu_mul_rows(gu, 2 * I, act, I, M, I);
        rc |= linear(act, I, P(i, DOWN_W), P(i, DOWN_P), P(i, DOWN_B), tmp, H, M, H, I);
        specserve_add_rms_rows(x, H, tmp, H, i + 1 < L ? P(i + 1, ATTN_NORM) : final_norm, y, H,
                               M, H, eps);
    }
    if (rc == 0 && aux_col[L] >= 0)
        for (int r = 0; r < M; r++)
            memcpy(aux + (int64_t)r * naux * H + (int64_t)aux_col[L] * H, x + (int64_t)r * H,
                   sizeof(float) * (size_t)H);
    if (L == 0) specserve_rms_rows(x, H, final_norm, y, H, M, H, eps);
    free(qkv);
    return rc;
}
