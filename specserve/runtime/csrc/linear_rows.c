/* specserve: y[m, n] = x[m, k] @ W[n, k]^T (+ bias[n]) for a few rows m, float32 arithmetic,
 * W in float32 or bfloat16.
 *
 * Decode (1 row), verify (K + 1 rows) and batched steps multiply a few rows by every weight,
 * which is memory-bound: the step should cost one read of the weights whatever the row count.
 * Here each block of 4 weight rows is read from memory once and, while it sits in L1, dotted
 * with every input row, R at a time (4 x R vector accumulators: R <= 6 of 16 floats with
 * AVX-512, R <= 4 of 8 with AVX2); the 4 x R sums are reduced with horizontal adds into
 * y[i, n .. n + 3]. While the first R rows run, the block PREFETCH blocks ahead is prefetched,
 * so that memory keeps streaming while the later rows compute on L1 (without it, 5 rows cost
 * 1.3-1.5x one row here). A K that is not a multiple of the vector ends with masked loads (zeros
 * beyond K); an N tail reuses the last valid weight row and stores only the valid outputs.
 * Without AVX2: plain loops for the compiler. bfloat16 x and W (half the bytes) are widened to
 * float32 as they are loaded (a shift: exact), or multiplied in pairs by AVX-512 BF16's dot
 * instruction where the CPU has it: float32 sums of exact products either way; bias and y are
 * float32 in both entry points.
 *
 * W is row-major (element [n, k] at w[n * ws + k]), as nn.Linear keeps it; x rows at stride
 * xs, y rows at ys, each row contiguous. One thread. Built and loaded by
 * specserve/runtime/cpu_linear.py. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#ifndef PREFETCH
#define PREFETCH 2  /* blocks of 4 weight rows ahead */
#endif

#ifdef __AVX2__
/* The four sums of 8-lane a0..a3 as one [4] vector: (sum a0, sum a1, sum a2, sum a3). */
static inline __m128 sum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

/* 512-bit where the CPU has AVX-512 (-DSPECSERVE_AVX2_ONLY: the 256-bit code there too; in a
 * whole SmolLM2 step with the L3 evicted, the same at one row and 5% slower at five) */
#if defined(__AVX512F__) && defined(__AVX512DQ__) && !defined(SPECSERVE_AVX2_ONLY)
#define W 16
#define RMAX 6  /* 24 accumulators + 4 weights + 1 input in 32 registers: a K = 4 verify (5 rows)
                   in one pass, 2-3% faster a step than 4 + 1 */
typedef __m512 vec;
typedef __mmask16 tail_t;
#define ZERO() _mm512_setzero_ps()
#define LOAD(p) _mm512_loadu_ps(p)
#define TAIL(n) ((__mmask16)((1u << (n)) - 1u))
#define LOADT(p, m) _mm512_maskz_loadu_ps(m, p)
#define FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define HALF(a) _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1))
#define SUM4(a0, a1, a2, a3) sum4(HALF(a0), HALF(a1), HALF(a2), HALF(a3))
static inline vec load_bf16(const uint16_t* p) {  /* 16 bfloat16 -> float32 */
    const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}
#else
#define W 8
#define RMAX 4  /* 16 accumulators + 4 weights spill a few to L1, yet beat 2 or 3 rows */
typedef __m256 vec;
typedef __m256i tail_t;
static const int32_t ONES[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
#define ZERO() _mm256_setzero_ps()
#define LOAD(p) _mm256_loadu_ps(p)
#define TAIL(n) _mm256_loadu_si256((const __m256i*)(ONES + 8 - (n)))
#define LOADT(p, m) _mm256_maskload_ps(p, m)
#define FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define SUM4(a0, a1, a2, a3) sum4(a0, a1, a2, a3)
static inline vec load_bf16(const uint16_t* p) {  /* 8 bfloat16 -> float32 */
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}
#endif

static inline vec load_f32(const float* p) { return LOAD(p); }
static inline vec tail_f32(const float* p, int n) { return LOADT(p, TAIL(n)); }
static inline vec tail_bf16(const uint16_t* p, int n) {  /* lanes beyond n: zero */
    uint16_t t[W] = {0};
    for (int i = 0; i < n; i++) t[i] = p[i];
    return load_bf16(t);
}

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

/* KERNEL(T, S): block_S, rows_S and specserve_linear_rows_S for weights of type T, loaded by
 * load_S / tail_S.
 *
 * block_S: weight rows w[0..3] against input rows x[0 .. R-1] (R <= RMAX, a constant once
 * inlined): y[r * ys + 0 .. valid - 1]; prefetches rows pf[0..3] (row stride ws) when set.
 * rows_S: every input row against w[0..3], RMAX at a time, the rest by one call of their count
 * (each count a constant, so the accumulators stay in registers).
 * specserve_linear_rows_S: x [M, K] and w [N, K] of T (row strides xs, ws), bias [N] float32
 * or NULL, y [M, N] float32 (row stride ys); returns 0. */
#define KERNEL(T, S)                                                                          \
static inline __attribute__((always_inline)) void block_##S(                                  \
        const T* const* w, const T* x, int64_t xs, float* y, int64_t ys,                     \
        const float* bias, int K, int valid, int R, const T* pf, int64_t ws) {                \
    vec a[6][4];  /* R <= RMAX <= 6 of them used */                                           \
    for (int r = 0; r < R; r++)                                                               \
        for (int j = 0; j < 4; j++) a[r][j] = ZERO();                                         \
    int k = 0;                                                                                \
    for (; k + W <= K; k += W) {                                                              \
        if (pf && k % (int)(64 / sizeof(T)) == 0) {  /* a 64-byte line of each row */         \
            for (int j = 0; j < 4; j++)                                                       \
                _mm_prefetch((const char*)(pf + j * ws + k), _MM_HINT_T2);                    \
        }                                                                                     \
        const vec v0 = load_##S(w[0] + k), v1 = load_##S(w[1] + k),                           \
                  v2 = load_##S(w[2] + k), v3 = load_##S(w[3] + k);                           \
        for (int r = 0; r < R; r++) {                                                         \
            const vec u = load_##S(x + r * xs + k);                                           \
            a[r][0] = FMA(v0, u, a[r][0]);                                                    \
            a[r][1] = FMA(v1, u, a[r][1]);                                                    \
            a[r][2] = FMA(v2, u, a[r][2]);                                                    \
            a[r][3] = FMA(v3, u, a[r][3]);                                                    \
        }                                                                                     \
    }                                                                                         \
    if (k < K) {  /* the last K % W: lanes beyond K load as zero */                           \
        const vec v0 = tail_##S(w[0] + k, K - k), v1 = tail_##S(w[1] + k, K - k),             \
                  v2 = tail_##S(w[2] + k, K - k), v3 = tail_##S(w[3] + k, K - k);             \
        for (int r = 0; r < R; r++) {                                                         \
            const vec u = tail_##S(x + r * xs + k, K - k);                                    \
            a[r][0] = FMA(v0, u, a[r][0]);                                                    \
            a[r][1] = FMA(v1, u, a[r][1]);                                                    \
            a[r][2] = FMA(v2, u, a[r][2]);                                                    \
            a[r][3] = FMA(v3, u, a[r][3]);                                                    \
        }                                                                                     \
    }                                                                                         \
    for (int r = 0; r < R; r++)                                                               \
        store4(y + r * ys, SUM4(a[r][0], a[r][1], a[r][2], a[r][3]), bias, valid);            \
}                                                                                             \
                                                                                              \
static void rows_##S(const T* const* w, const T* x, int64_t xs, float* y, int64_t ys,         \
                     const float* bias, int M, int K, int valid, const T* pf, int64_t ws) {   \
    int i = 0;                                                                                \
    for (; i + RMAX <= M; i += RMAX, pf = 0)                                                  \
        block_##S(w, x + i * xs, xs, y + i * ys, ys, bias, K, valid, RMAX, pf, ws);           \
    switch (M - i) {  /* the rest, fewer than RMAX */                                         \
        case 5: block_##S(w, x + i * xs, xs, y + i * ys, ys, bias, K, valid, 5, pf, ws); break;\
        case 4: block_##S(w, x + i * xs, xs, y + i * ys, ys, bias, K, valid, 4, pf, ws); break;\
        case 3: block_##S(w, x + i * xs, xs, y + i * ys, ys, bias, K, valid, 3, pf, ws); break;\
        case 2: block_##S(w, x + i * xs, xs, y + i * ys, ys, bias, K, valid, 2, pf, ws); break;\
        case 1: block_##S(w, x + i * xs, xs, y + i * ys, ys, bias, K, valid, 1, pf, ws); break;\
        default: break;                                                                       \
    }                                                                                         \
}                                                                                             \
                                                                                              \
int specserve_linear_rows_##S(const T* x, int64_t xs, const T* w, int64_t ws,                 \
                              const float* bias, float* y, int64_t ys, int M, int N, int K) { \
    for (int n = 0; n < N; n += 4) {                                                          \
        const int valid = N - n < 4 ? N - n : 4;                                              \
        const T* wr[4];                                                                       \
        float b[4];                                                                           \
        for (int j = 0; j < 4; j++) {  /* a tail block repeats row n; its outputs dropped */  \
            wr[j] = w + (int64_t)(j < valid ? n + j : n) * ws;                                \
            b[j] = bias && j < valid ? bias[n + j] : 0.f;                                     \
        }                                                                                     \
        const int ahead = n + 4 * PREFETCH;                                                   \
        const T* pf = ahead + 4 <= N ? w + (int64_t)ahead * ws : 0;                           \
        rows_##S(wr, x, xs, y + n, ys, b, M, K, valid, pf, ws);                               \
    }                                                                                         \
    return 0;                                                                                 \
}

KERNEL(float, f32)

/* Panels: float32 weights for more rows than the blocks above serve well. With 16 rows the
 * dot-product form above is compute-bound (4 x 6 accumulators, a horizontal sum per output,
 * the block re-read for every 6 rows) at two thirds of the FMA rate. Here the weight is laid out
 * once as panels of W output columns, p[g][k][j] = w[g W + j][k] (zero beyond N, padded with
 * zero panels to a multiple of PANEL_PAD), and the product is a sum of outer products: per k,
 * C panel vectors of W outputs times each of R rows' x[r][k] broadcast (R x C accumulators, no
 * horizontal sums), so each weight vector loaded from memory feeds R FMAs. x is transposed first
 * ([K][M]: one k's M inputs in one cache line). With PANEL_PREFETCH steps of look-ahead, one
 * line a step: without it the 16-row step waits on memory (SmolLM2-135M, 16 rows, the
 * weights streamed: 69-72 ms by the blocks above, 54 ms without prefetch, 42-44 with).
 * Tiles: every row in one pass, C = 4 panels up to 6 rows, 3 up to 9, 2 up to 14, 1 beyond
 * (R x C accumulators and C weights in AVX-512's 32 registers). Float32 sums in k order: equal
 * to F.linear within float32 rounding. AVX-512 only: built for AVX2 (16 registers; tiles of
 * 1-8 rows by 1-3 panels tried) GCC 12 kept the accumulators on the stack and every tile ran
 * 1.1-3x slower than the blocks above, so there specserve_panel_width() says 0 (no panels). */
#define PANEL_PAD 4  /* the widest tile's panels: the last tile reads (zero) panels up to it */
#ifndef PANEL_PREFETCH
#define PANEL_PREFETCH 32  /* k steps (2 KiB of a panel) ahead: 16 to 128 within 5% at 5-16
                              rows; at one row 32 the fastest (18.4-19.1 ms, 64: 20.0-20.7) */
#endif
#if W == 16
#define SPECSERVE_PANELS 1
#define BCAST(p) _mm512_set1_ps(*(p))
#define ADD(a, b) _mm512_add_ps(a, b)
#define STORET(p, m, v) _mm512_mask_storeu_ps(p, m, v)

/* Rows xt[k * R + 0 .. R - 1] against panels p, p + gs, .. (C of them) for every k:
 * y[r * ys + n0 ..] for the outputs below N. */
static inline __attribute__((always_inline)) void panel_tile(
        const float* p, int64_t gs, const float* xt, int K, float* y, int64_t ys,
        const float* bias, int n0, int N, int R, int C) {
    vec a[16][4];  /* R x C of them used */
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) a[r][c] = ZERO();
    for (int k = 0; k < K; k++) {
        for (int c = 0; c < C; c++) {  /* a 64-byte line of each panel a step */
            const char* ahead = (const char*)(p + c * gs + (int64_t)(k + PANEL_PREFETCH) * W);
            if (R >= 8) _mm_prefetch(ahead, _MM_HINT_T0);  /* T0 from 8 rows, T2 below: */
            else _mm_prefetch(ahead, _MM_HINT_T2);          /* the faster of each, measured */
        }
        vec w[4];
        for (int c = 0; c < C; c++) w[c] = LOAD(p + c * gs + (int64_t)k * W);
        const float* xk = xt + (int64_t)k * R;
        for (int r = 0; r < R; r++) {
            const vec b = BCAST(xk + r);
            for (int c = 0; c < C; c++) a[r][c] = FMA(w[c], b, a[r][c]);
        }
    }
    for (int c = 0; c < C && n0 + c * W < N; c++) {
        const int n = n0 + c * W, valid = N - n < W ? N - n : W;
        const tail_t m = TAIL(valid);
        const vec bv = bias ? LOADT(bias + n, m) : ZERO();
        for (int r = 0; r < R; r++) STORET(y + r * ys + n, m, ADD(a[r][c], bv));
    }
}

/* One tile (panels g.. of its C, all R rows) with R and C constants (the table above), so
 * that its accumulators stay in registers. */
#define PTILE(R_, C_) panel_tile(p + (int64_t)g * gs, gs, xt, K, y, ys, bias, g * W, N, R_, C_)
static void panel_block(const float* p, int64_t gs, const float* xt, int K, float* y,
                        int64_t ys, const float* bias, int N, int g, int R) {
    switch (R) {
        case 1: PTILE(1, 4); break;    case 2: PTILE(2, 4); break;
        case 3: PTILE(3, 4); break;    case 4: PTILE(4, 4); break;
        case 5: PTILE(5, 4); break;    case 6: PTILE(6, 4); break;
        case 7: PTILE(7, 3); break;    case 8: PTILE(8, 3); break;
        case 9: PTILE(9, 3); break;    case 10: PTILE(10, 2); break;
        case 11: PTILE(11, 2); break;  case 12: PTILE(12, 2); break;
        case 13: PTILE(13, 2); break;  case 14: PTILE(14, 2); break;
        case 15: PTILE(15, 1); break;  default: PTILE(16, 1); break;
    }
}

/* Panels per tile for M rows (the table above). */
static inline int panel_cols(int M) { return M <= 6 ? 4 : M <= 9 ? 3 : M <= 14 ? 2 : 1; }

int specserve_panel_width(void) { return W; }
int specserve_panel_pad(void) { return PANEL_PAD; }

/* y [M, N] (row stride ys) = x [M, K] (row stride xs) @ w^T + bias (NULL: none) for
 * 0 <= M <= 16, w as panels p [ceil(ceil(N / W) / PANEL_PAD) PANEL_PAD][K][W] (see above).
 * Returns 0; 1 when the transposed x could not be allocated, 2 for M out of range. */
int specserve_linear_panels_f32(const float* x, int64_t xs, const float* p, const float* bias,
                                float* y, int64_t ys, int M, int N, int K) {
    if (M == 0) return 0;  /* no rows: nothing to write */
    if (M < 0 || M > 16) return 2;
    float* xt = (float*)malloc(sizeof(float) * (size_t)M * (size_t)K);  /* [K][M] */
    if (!xt) return 1;
    for (int r = 0; r < M; r++)
        for (int k = 0; k < K; k++) xt[(int64_t)k * M + r] = x[(int64_t)r * xs + k];
    const int G = (N + W - 1) / W, C = panel_cols(M);
    const int64_t gs = (int64_t)K * W;
    for (int g = 0; g < G; g += C) panel_block(p, gs, xt, K, y, ys, bias, N, g, M);
    free(xt);
    return 0;
}
#endif
#if defined(__AVX512BF16__) && defined(__AVX512BW__) && W == 16
/* With AVX-512 BF16: 32 bfloat16 lanes a load, multiplied in pairs and summed into 16 float32
 * lanes by one instruction (exact products, float32 sums; denormal inputs read as zero), so
 * the loop runs a quarter of the instructions of widen-then-FMA. The same KERNEL with these: */
#undef W
#define W 32
#undef FMA
#define FMA(a, b, c) _mm512_dpbf16_ps(c, (__m512bh)(a), (__m512bh)(b))
#define load_dp(p) _mm512_castsi512_ps(_mm512_loadu_si512((const void*)(p)))
static inline vec tail_dp(const uint16_t* p, int n) {
    return _mm512_castsi512_ps(_mm512_maskz_loadu_epi16((__mmask32)((1ull << n) - 1ull), p));
}
KERNEL(uint16_t, dp)
int specserve_linear_rows_bf16(const uint16_t* x, int64_t xs, const uint16_t* w, int64_t ws,
                               const float* bias, float* y, int64_t ys, int M, int N, int K) {
    return specserve_linear_rows_dp(x, xs, w, ws, bias, y, ys, M, N, K);
}
#else
KERNEL(uint16_t, bf16)
#endif

#else  /* no AVX2: plain loops */
static inline float widen(uint16_t v) {
    const uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#define KERNEL(T, S, WIDEN)                                                                   \
int specserve_linear_rows_##S(const T* x, int64_t xs, const T* w, int64_t ws,                 \
                              const float* bias, float* y, int64_t ys, int M, int N, int K) { \
    for (int n = 0; n < N; n++) {                                                             \
        const T* wn = w + (int64_t)n * ws;                                                    \
        for (int i = 0; i < M; i++) {                                                         \
            const T* xi = x + (int64_t)i * xs;                                                \
            float acc = 0.f;                                                                  \
            _Pragma("omp simd reduction(+:acc)")                                              \
            for (int k = 0; k < K; k++) acc += WIDEN(xi[k]) * WIDEN(wn[k]);                   \
            y[(int64_t)i * ys + n] = acc + (bias ? bias[n] : 0.f);                            \
        }                                                                                     \
    }                                                                                         \
    return 0;                                                                                 \
}
#define SAME(v) (v)
KERNEL(float, f32, SAME)
KERNEL(uint16_t, bf16, widen)
#endif

#ifndef SPECSERVE_PANELS  /* AVX2 or plain C: no panels (see the panel kernel above) */
int specserve_panel_width(void) { return 0; }
int specserve_panel_pad(void) { return 1; }
int specserve_linear_panels_f32(const float* x, int64_t xs, const float* p, const float* bias,
                                float* y, int64_t ys, int M, int N, int K) {
    (void)x, (void)xs, (void)p, (void)bias, (void)y, (void)ys, (void)M, (void)N, (void)K;
    return 2;
}
#endif
