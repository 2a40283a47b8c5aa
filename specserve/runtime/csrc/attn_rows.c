/* specserve: attention of a few new tokens per row over a KV cache, each row over its own keys.
 *
 * Decode, verify and draft-tree forwards attend T <= 16 new tokens per row. ATen's CPU flash
 * kernel pads every row to the longest (a third of the keys at batch 16 are padding) and pays a
 * per-(row, head) cost that dominates at T this small (docs/results.md, "The C kernels").
 * Here row b reads only keys start[b] .. len[b] - 1 (all visible) and its W new slots
 * len[b] .. len[b] + W - 1 (slot w visible to new token t iff node[t * W + w]): the same
 * semantics as the boolean mask of specserve.runtime.kvcache.step_mask, without the padding.
 *
 * Plain C, vectorised by the compiler for the machine it is built on (-march=native); no
 * intrinsics. Scaled dot products, softmax (exact two-pass), weighted sum of values, all in
 * float32. Built and loaded by specserve/runtime/cpu_attention.py. */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MASKED (-1e30f)

static inline float dot(const float* restrict a, const float* restrict b, int d) {
    float acc = 0.f;
#pragma omp simd reduction(+:acc)
    for (int i = 0; i < d; i++) acc += a[i] * b[i];
    return acc;
}

/* Softmax of row[0..n-1] in place; MASKED entries get 0. */
static void softmax(float* row, int64_t n) {
    float mx = MASKED, sum = 0.f;
    for (int64_t j = 0; j < n; j++) mx = row[j] > mx ? row[j] : mx;
#pragma omp simd reduction(+:sum)
    for (int64_t j = 0; j < n; j++) {
        float e = row[j] <= MASKED ? 0.f : expf(row[j] - mx);
        row[j] = e;
        sum += e;
    }
    float inv = sum > 0.f ? 1.f / sum : 0.f;
#pragma omp simd
    for (int64_t j = 0; j < n; j++) row[j] *= inv;
}

/* One (row, KV head): R = g * T query rows (query head kv * g + r / T, new token r % T) over
 * n = np + W keys; D a compile-time constant where the caller passes one. */
static inline void one_head(const float* qp, int64_t qh, int64_t qt, const float* kp, int64_t ks,
                            const float* vp, int64_t vs, const uint8_t* node, int W, int T,
                            int R, int64_t np, float* sc, float* outp, int64_t ot, int64_t oh,
                            int D, float scale) {
    const int64_t n = np + W;
    for (int r = 0; r < R; r++) {  /* scores [R, n]: one query row against every key */
        const int hh = r / T, t = r % T;
        const float* qr = qp + hh * qh + t * qt;
        float* row = sc + r * n;
        for (int64_t j = 0; j < np; j++) row[j] = dot(qr, kp + j * ks, D) * scale;
        for (int w = 0; w < W; w++)
            row[np + w] = node[t * W + w] ? dot(qr, kp + (np + w) * ks, D) * scale : MASKED;
        softmax(row, n);
    }
    for (int r = 0; r < R; r++) {  /* out row r = probs[r] @ values */
        const int hh = r / T, t = r % T;
        const float* p = sc + r * n;
        float* o = outp + t * ot + hh * oh;
#pragma omp simd
        for (int i = 0; i < D; i++) o[i] = 0.f;
        for (int64_t j = 0; j < n; j++) {
            const float pj = p[j];
            const float* vr = vp + j * vs;
#pragma omp simd
            for (int i = 0; i < D; i++) o[i] += pj * vr[i];
        }
    }
}

/* q [B, H, T, D] (element strides qb, qh, qt), k and v [B, Hkv, S, D] (strides kb, kh, ks and
 * vb, vh, vs), out [B, T, H, D] (strides ob, ot, oh); D contiguous everywhere. Query head h
 * reads KV head h / (H / Hkv). max_past >= len[b] - start[b] for every b. Returns 0, or 1 when
 * the scratch could not be allocated. */
int specserve_attn_rows_f32(
        const float* q, int64_t qb, int64_t qh, int64_t qt,
        const float* k, int64_t kb, int64_t kh, int64_t ks,
        const float* v, int64_t vb, int64_t vh, int64_t vs,
        const int64_t* start, const int64_t* len, const uint8_t* node, int W,
        float* out, int64_t ob, int64_t ot, int64_t oh,
        int B, int H, int Hkv, int T, int D, int64_t max_past, float scale) {
    const int g = H / Hkv, R = g * T;  /* the query rows that share one KV head */
    float* sc = (float*)malloc(sizeof(float) * (size_t)R * (size_t)(max_past + W));
    if (!sc) return 1;
    for (int b = 0; b < B; b++) {
        const int64_t s0 = start[b], np = len[b] - start[b];
        for (int kv = 0; kv < Hkv; kv++) {
            const float* qp = q + b * qb + (int64_t)kv * g * qh;
            const float* kp = k + b * kb + kv * kh + s0 * ks;
            const float* vp = v + b * vb + kv * vh + s0 * vs;
            float* op = out + b * ob + (int64_t)kv * g * oh;
            if (D == 64)  /* constant D: the dot products unrolled into registers */
                one_head(qp, qh, qt, kp, ks, vp, vs, node, W, T, R, np, sc, op, ot, oh, 64, scale);
            else if (D == 128)
                one_head(qp, qh, qt, kp, ks, vp, vs, node, W, T, R, np, sc, op, ot, oh, 128, scale);
            else
                one_head(qp, qh, qt, kp, ks, vp, vs, node, W, T, R, np, sc, op, ot, oh, D, scale);
        }
    }
    free(sc);
    return 0;
}
