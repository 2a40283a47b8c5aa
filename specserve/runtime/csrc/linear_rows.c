/* specserve: y[m, n] = x[m, k] @ W[n, k]^T (+ bias[n]) for a few rows m, in float32.
 *
 * Decode (1 row), verify (K + 1 rows) and batched steps multiply a few rows by every weight,
 * which is memory-bound: the step should cost one read of the weights whatever the row count.
 * Here each block of 4 weight rows is read from memory once and, while it sits in L1, dotted
 * with every input row, R <= 4 at a time (4 x R vector accumulators of 16 floats with AVX-512, 8
 * with AVX2); the 4 x R sums are reduced with horizontal adds into
 * y[i, n .. n + 3]. While the first R rows run, the block PREFETCH blocks ahead is prefetched,
 * so that memory keeps streaming while the later rows compute on L1 (without it, 5 rows cost
 * 1.3-1.5x one row here). A K that is not a multiple of the vector ends with masked loads (zeros
 * beyond K); an N tail reuses the last valid weight row and stores only the valid outputs.
 * Without AVX2: plain loops for the compiler.
 *
 * W is row-major (element [n, k] at w[n * ws + k]), as nn.Linear keeps it; x rows at stride
 * xs, y rows at ys, each row contiguous. One thread. Built and loaded by
 * specserve/runtime/cpu_linear.py. */
#include <stdint.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#define RMAX 4  /* AVX2: 16 accumulators + 4 weights spill a few to L1, yet beat 2 or 3 rows */
#ifndef PREFETCH
#define PREFETCH 2  /* blocks of 4 weight rows ahead */
#endif

#ifdef __AVX2__
/* The four sums of 8-lane a0..a3 as one [4] vector: (sum a0, sum a1, sum a2, sum a3). */
static inline __m128 sum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

#if defined(__AVX512F__) && defined(__AVX512DQ__) && !defined(SPECSERVE_AVX2_ONLY)
#define W 16
typedef __m512 vec;
typedef __mmask16 tail_t;
#define ZERO() _mm512_setzero_ps()
#define LOAD(p) _mm512_loadu_ps(p)
#define TAIL(n) ((__mmask16)((1u << (n)) - 1u))
#define LOADT(p, m) _mm512_maskz_loadu_ps(m, p)
#define FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define HALF(a) _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1))
#define SUM4(a0, a1, a2, a3) sum4(HALF(a0), HALF(a1), HALF(a2), HALF(a3))
#else
#define W 8
typedef __m256 vec;
typedef __m256i tail_t;
static const int32_t ONES[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
#define ZERO() _mm256_setzero_ps()
#define LOAD(p) _mm256_loadu_ps(p)
#define TAIL(n) _mm256_loadu_si256((const __m256i*)(ONES + 8 - (n)))
#define LOADT(p, m) _mm256_maskload_ps(p, m)
#define FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define SUM4(a0, a1, a2, a3) sum4(a0, a1, a2, a3)
#endif

static inline void store4(float* y, __m128 v, const float* bias, int valid) {
    v = _mm_add_ps(v, _mm_loadu_ps(bias));
    if (valid == 4) {
        _mm_storeu_ps(y, v);
        return;
    }
    float t[4];
    _mm_storeu_ps(t, v);
    for (int j = 0; j < valid; j++) y[j] = t[j];
}

/* Weight rows w[0..3] against input rows x[0 .. R-1] (R <= RMAX, a constant once inlined):
 * y[r * ys + 0 .. valid - 1]; prefetches rows pf[0..3] (row stride ws) when pf is set. */
static inline __attribute__((always_inline)) void block(
        const float* const* w, const float* x, int64_t xs, float* y, int64_t ys,
        const float* bias, int K, int valid, int R, const float* pf, int64_t ws) {
    vec a[RMAX][4];
    for (int r = 0; r < RMAX; r++)
        for (int j = 0; j < 4; j++) a[r][j] = ZERO();
    int k = 0;
    for (; k + W <= K; k += W) {
        if (pf && k % 16 == 0) {  /* one 64-byte line of each row per 16 floats */
            for (int j = 0; j < 4; j++) _mm_prefetch((const char*)(pf + j * ws + k), _MM_HINT_T2);
        }
        const vec v0 = LOAD(w[0] + k), v1 = LOAD(w[1] + k), v2 = LOAD(w[2] + k),
                  v3 = LOAD(w[3] + k);
        for (int r = 0; r < R; r++) {
            const vec u = LOAD(x + r * xs + k);
            a[r][0] = FMA(v0, u, a[r][0]);
            a[r][1] = FMA(v1, u, a[r][1]);
            a[r][2] = FMA(v2, u, a[r][2]);
            a[r][3] = FMA(v3, u, a[r][3]);
        }
    }
    if (k < K) {  /* the last K % W: lanes beyond K load as zero */
        const tail_t m = TAIL(K - k);
        const vec v0 = LOADT(w[0] + k, m), v1 = LOADT(w[1] + k, m), v2 = LOADT(w[2] + k, m),
                  v3 = LOADT(w[3] + k, m);
        for (int r = 0; r < R; r++) {
            const vec u = LOADT(x + r * xs + k, m);
            a[r][0] = FMA(v0, u, a[r][0]);
            a[r][1] = FMA(v1, u, a[r][1]);
            a[r][2] = FMA(v2, u, a[r][2]);
            a[r][3] = FMA(v3, u, a[r][3]);
        }
    }
    for (int r = 0; r < R; r++)
        store4(y + r * ys, SUM4(a[r][0], a[r][1], a[r][2], a[r][3]), bias, valid);
}

/* Every input row against weight rows w[0..3], RMAX rows at a time, the rest by one call of
 * their count (each count a constant, so the accumulators stay in registers). */
static void rows(const float* const* w, const float* x, int64_t xs, float* y, int64_t ys,
                 const float* bias, int M, int K, int valid, const float* pf, int64_t ws) {
    int i = 0;
    for (; i + RMAX <= M; i += RMAX, pf = 0)
        block(w, x + i * xs, xs, y + i * ys, ys, bias, K, valid, RMAX, pf, ws);
    switch (M - i) {
        case 3: block(w, x + i * xs, xs, y + i * ys, ys, bias, K, valid, 3, pf, ws); break;
        case 2: block(w, x + i * xs, xs, y + i * ys, ys, bias, K, valid, 2, pf, ws); break;
        case 1: block(w, x + i * xs, xs, y + i * ys, ys, bias, K, valid, 1, pf, ws); break;
        default: break;
    }
}
#endif

/* x [M, K] (row stride xs), w [N, K] (row stride ws), bias [N] or NULL, y [M, N] (row stride
 * ys). Returns 0. */
int specserve_linear_rows_f32(const float* x, int64_t xs, const float* w, int64_t ws,
                              const float* bias, float* y, int64_t ys, int M, int N, int K) {
#ifdef __AVX2__
    for (int n = 0; n < N; n += 4) {
        const int valid = N - n < 4 ? N - n : 4;
        const float* wr[4];
        float b[4];
        for (int j = 0; j < 4; j++) {  /* a tail block repeats row n; its outputs are dropped */
            wr[j] = w + (int64_t)(j < valid ? n + j : n) * ws;
            b[j] = bias && j < valid ? bias[n + j] : 0.f;
        }
        const int ahead = n + 4 * PREFETCH;
        const float* pf = ahead + 4 <= N ? w + (int64_t)ahead * ws : 0;
        rows(wr, x, xs, y + n, ys, b, M, K, valid, pf, ws);
    }
#else
    for (int n = 0; n < N; n++) {
        const float* wn = w + (int64_t)n * ws;
        for (int i = 0; i < M; i++) {
            const float* xi = x + (int64_t)i * xs;
            float acc = 0.f;
#pragma omp simd reduction(+:acc)
            for (int k = 0; k < K; k++) acc += xi[k] * wn[k];
            y[(int64_t)i * ys + n] = acc + (bias ? bias[n] : 0.f);
        }
    }
#endif
    return 0;
}
