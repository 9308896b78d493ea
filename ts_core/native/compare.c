/* All element-wise metrics of a golden/target pair in one pass over both arrays.
 *
 * The same results as ts_core/compare/metrics.py's numpy accumulator (which stays the
 * reference and the fallback): float64 accumulation, numpy.isclose semantics
 * (|t - g| <= atol + rtol |g|), relative error |t-g|/|g| (0 where both are 0, inf where only
 * golden is 0), NaN/Inf counted per side, and the worst element chosen chunk by chunk exactly
 * as the numpy version walks its chunks. Inputs are float32, float64, float16 or bfloat16, either
 * side, each widened exactly to double (a float16 pair took the numpy path at 0.1 GB/s before).
 *
 * Speed (issue 29): the per-element branches kept the one loop scalar, at 2.9 GB/s of input a
 * CPU second (4M float32 pairs), against 5.5 for numpy's mmap-load and sum of the same bytes.
 * Blocks of BLOCK elements of one dtype now go through a branch-free loop over 4 independent
 * lanes (AVX2 intrinsics, picked at import with the stats loops; without AVX2 the scalar loop
 * does all): 8.9 GB/s a CPU second on the same pairs. A block
 * holding a NaN/Inf is dropped and redone by the scalar loop, which stays the one that handles
 * them. Lanes add in another order than one running sum, so sums move by rounding only (tests:
 * 1e-9 relative against the numpy reference); counts, maxima and the worst element are exact,
 * the worst still the first maximum (lane ties go to the lower index).
 */
#include <stdint.h>
#include <stddef.h>
#include <math.h>
#include "kernels.h"
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define TSP_X86 1
#include <immintrin.h>
#endif

enum { F32 = TSP_F32, F64 = TSP_F64, F16 = TSP_F16, BF16 = TSP_BF16, N_FLOAT = 4 };

typedef struct {
    double dot, gg, tt, sq, abs_sum, max_abs, max_rel, worst_score, worst_g, worst_t;
} Sums;

typedef struct {
    int64_t n, n_finite, close, w1, w5, g_nan, t_nan, g_inf, t_inf, mismatch, worst_pos;
} Counts;

static inline double load(const void *p, int dtype, int64_t i) {
    switch (dtype) {
    case F32: return (double)((const float *)p)[i];
    case F64: return ((const double *)p)[i];
    case F16: return (double)f16_to_f32(((const uint16_t *)p)[i]);
    default: return (double)bf16_to_f32(((const uint16_t *)p)[i]);
    }
}

#define LANES 4
#define BLOCK 1024          /* elements per lane block, a multiple of LANES: both sides stay in L1 */

typedef struct {
    double dot[LANES], gg[LANES], tt[LANES], sq[LANES], abs_sum[LANES], max_abs[LANES], max_rel[LANES],
        best[LANES];
    int64_t close[LANES], w1[LANES], w5[LANES], pos[LANES];
} Lanes;

typedef int (*lane_fn)(const void *, const void *, int64_t, int64_t, double, double, Lanes *);

#ifdef TSP_X86
/* Elements [s, s + n) (n a multiple of LANES, at most BLOCK: both sides stay in L1) added to Z
 * when all are finite on both sides (returns 1); else Z is left as it was (returns 0). The 4
 * lanes are the 4 doubles of an AVX2 vector; LOAD_G and LOAD_T widen 4 elements of each side's
 * dtype to double (exactly: float16 through F16C, which every AVX2 CPU has: stats.c checks).
 *
 * Two passes over the block, so that each loop keeps its accumulators in registers (one loop
 * holding all twelve spilled them to the stack, and every add waited on a store):
 *   1. the sums (dot, gg, tt, sq, abs): a NaN/Inf anywhere makes gg or tt non-finite, and the
 *      block is handed back before pass 2 (a float64 square that overflows does too: the
 *      scalar loop then gives the same result, slower);
 *   2. the counts and maxima. The two quotients (relative error, worst-element score) are
 *      computed only in a vector where some lane may improve its maximum (MAY_IMPROVE): rare
 *      after the first elements, and the divisions were the loop's dearest instructions.
 * Sums run lane by lane in element order as before, so results are bit for bit those of the
 * one-loop version. */

/* A superset of the lanes where d/ag may exceed mr or d/tol may exceed be (both >= 0 but be
 * starts at -1): quotients compared as products, d enlarged by 2^-40 so that no rounding of
 * quotient or product hides an improvement (a tie is taken too; d == 0 improves neither
 * unless be < 0). An inf maximum against a zero denominator gives NaN: false, as it should. */
#define MAY_IMPROVE(d, ag, tol, mr, be, slack, z)                                                  \
    _mm256_or_pd(_mm256_cmp_pd(be, z, _CMP_LT_OQ),                                                  \
                 _mm256_and_pd(_mm256_cmp_pd(d, z, _CMP_GT_OQ),                                     \
                               _mm256_or_pd(_mm256_cmp_pd(_mm256_mul_pd(d, slack), _mm256_mul_pd(mr, ag), _CMP_GE_OQ), \
                                            _mm256_cmp_pd(_mm256_mul_pd(d, slack), _mm256_mul_pd(be, tol), _CMP_GE_OQ))))

#define LANE_AVX2(NAME, TG, LOAD_G, TT, LOAD_T)                                                     \
__attribute__((target("avx2,f16c"))) static int NAME(const void *gp, const void *tp, int64_t s, int64_t n, \
                                                     double rtol, double atol, Lanes *Z) {          \
    const TG *g = (const TG *)gp + s;                                                               \
    const TT *t = (const TT *)tp + s;                                                               \
    __m256d sign = _mm256_set1_pd(-0.0), z = _mm256_setzero_pd();                                   \
    __m256d dot = _mm256_loadu_pd(Z->dot), gg = _mm256_loadu_pd(Z->gg), tt = _mm256_loadu_pd(Z->tt); \
    __m256d sq = _mm256_loadu_pd(Z->sq), as = _mm256_loadu_pd(Z->abs_sum);                         \
    for (int64_t i = 0; i < n; i += LANES) {                                                        \
        __m256d a = LOAD_G(g + i), b = LOAD_T(t + i), diff = _mm256_sub_pd(b, a);                   \
        dot = _mm256_add_pd(dot, _mm256_mul_pd(a, b)); gg = _mm256_add_pd(gg, _mm256_mul_pd(a, a));  \
        tt = _mm256_add_pd(tt, _mm256_mul_pd(b, b)); sq = _mm256_add_pd(sq, _mm256_mul_pd(diff, diff)); \
        as = _mm256_add_pd(as, _mm256_andnot_pd(sign, diff));                                       \
    }                                                                                               \
    double f[LANES];                                                                                \
    _mm256_storeu_pd(f, _mm256_add_pd(_mm256_sub_pd(gg, gg), _mm256_sub_pd(tt, tt)));               \
    if (!(f[0] + f[1] + f[2] + f[3] == 0)) return 0;                                                \
    __m256d vr = _mm256_set1_pd(rtol), va = _mm256_set1_pd(atol), k1 = _mm256_set1_pd(1e-3);        \
    __m256d k5 = _mm256_set1_pd(5e-3), inf = _mm256_set1_pd(INFINITY), slack = _mm256_set1_pd(1.0 + 0x1p-40); \
    __m256d ma = _mm256_loadu_pd(Z->max_abs), mr = _mm256_loadu_pd(Z->max_rel), be = _mm256_loadu_pd(Z->best); \
    __m256i cl = _mm256_loadu_si256((const __m256i *)Z->close), w1 = _mm256_loadu_si256((const __m256i *)Z->w1); \
    __m256i w5 = _mm256_loadu_si256((const __m256i *)Z->w5), po = _mm256_loadu_si256((const __m256i *)Z->pos); \
    for (int64_t i = 0; i < n; i += LANES) {                                                        \
        /* the next block's lines, while this one is in L1: file pages are mapped 4 KB at a   \
         * time, and the hardware prefetcher stops at every page's end */                    \
        _mm_prefetch((const char *)(g + n + i), _MM_HINT_T0);                                       \
        _mm_prefetch((const char *)(t + n + i), _MM_HINT_T0);                                       \
        __m256d a = LOAD_G(g + i), b = LOAD_T(t + i);                                               \
        __m256d d = _mm256_andnot_pd(sign, _mm256_sub_pd(b, a)), ag = _mm256_andnot_pd(sign, a);    \
        __m256d tol = _mm256_add_pd(va, _mm256_mul_pd(vr, ag));                                     \
        /* a true compare is all ones (-1): subtracting it counts one */                            \
        cl = _mm256_sub_epi64(cl, _mm256_castpd_si256(_mm256_cmp_pd(d, tol, _CMP_LE_OQ)));          \
        w1 = _mm256_sub_epi64(w1, _mm256_castpd_si256(_mm256_cmp_pd(d, _mm256_mul_pd(k1, ag), _CMP_LE_OQ))); \
        w5 = _mm256_sub_epi64(w5, _mm256_castpd_si256(_mm256_cmp_pd(d, _mm256_mul_pd(k5, ag), _CMP_LE_OQ))); \
        ma = _mm256_max_pd(d, ma);      /* all finite here: the larger, ma on a tie */          \
        if (_mm256_movemask_pd(MAY_IMPROVE(d, ag, tol, mr, be, slack, z))) {                        \
            __m256d zero = _mm256_blendv_pd(inf, z, _mm256_cmp_pd(d, z, _CMP_EQ_OQ));               \
            __m256d rel = _mm256_blendv_pd(zero, _mm256_div_pd(d, ag), _mm256_cmp_pd(ag, z, _CMP_GT_OQ)); \
            __m256d score = _mm256_blendv_pd(zero, _mm256_div_pd(d, tol), _mm256_cmp_pd(tol, z, _CMP_GT_OQ)); \
            mr = _mm256_blendv_pd(mr, rel, _mm256_cmp_pd(rel, mr, _CMP_GT_OQ));                     \
            __m256d better = _mm256_cmp_pd(score, be, _CMP_GT_OQ);                                  \
            __m256i idx = _mm256_set_epi64x(s + i + 3, s + i + 2, s + i + 1, s + i);                \
            be = _mm256_blendv_pd(be, score, better);                                               \
            po = _mm256_castpd_si256(_mm256_blendv_pd(_mm256_castsi256_pd(po), _mm256_castsi256_pd(idx), better)); \
        }                                                                                           \
    }                                                                                               \
    _mm256_storeu_pd(Z->dot, dot); _mm256_storeu_pd(Z->gg, gg); _mm256_storeu_pd(Z->tt, tt);        \
    _mm256_storeu_pd(Z->sq, sq); _mm256_storeu_pd(Z->abs_sum, as); _mm256_storeu_pd(Z->max_abs, ma); \
    _mm256_storeu_pd(Z->max_rel, mr); _mm256_storeu_pd(Z->best, be);                                \
    _mm256_storeu_si256((__m256i *)Z->close, cl); _mm256_storeu_si256((__m256i *)Z->w1, w1);        \
    _mm256_storeu_si256((__m256i *)Z->w5, w5); _mm256_storeu_si256((__m256i *)Z->pos, po);          \
    return 1;                                                                                       \
}
#define LOAD_F32(p) _mm256_cvtps_pd(_mm_loadu_ps(p))
#define LOAD_F64(p) _mm256_loadu_pd(p)
#define LOAD_F16(p) _mm256_cvtps_pd(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(p))))
#define LOAD_BF16(p) _mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32( \
                         _mm_loadl_epi64((const __m128i *)(p))), 16)))
/* one loop per (golden, target) dtype pair, in code order (F32, F64, F16, BF16) */
#define LANE_ROW(G, TG, LOAD_G)                                      \
    LANE_AVX2(lanes_##G##_f32, TG, LOAD_G, float, LOAD_F32)          \
    LANE_AVX2(lanes_##G##_f64, TG, LOAD_G, double, LOAD_F64)         \
    LANE_AVX2(lanes_##G##_f16, TG, LOAD_G, uint16_t, LOAD_F16)       \
    LANE_AVX2(lanes_##G##_bf16, TG, LOAD_G, uint16_t, LOAD_BF16)
LANE_ROW(f32, float, LOAD_F32)
LANE_ROW(f64, double, LOAD_F64)
LANE_ROW(f16, uint16_t, LOAD_F16)
LANE_ROW(bf16, uint16_t, LOAD_BF16)
static const lane_fn lanes_avx2[N_FLOAT][N_FLOAT] = {
    {lanes_f32_f32, lanes_f32_f64, lanes_f32_f16, lanes_f32_bf16},
    {lanes_f64_f32, lanes_f64_f64, lanes_f64_f16, lanes_f64_bf16},
    {lanes_f16_f32, lanes_f16_f64, lanes_f16_f16, lanes_f16_bf16},
    {lanes_bf16_f32, lanes_bf16_f64, lanes_bf16_f16, lanes_bf16_bf16},
};
#endif

#ifdef TSP_X86
static int k_avx2 = 0;              /* 0: the scalar loop only */
#endif

void tsp_compare_init(int avx2) {
#ifdef TSP_X86
    k_avx2 = avx2;
#else
    (void)avx2;
#endif
}

static void lanes_reset(Lanes *Z) {
    for (int j = 0; j < LANES; j++) {
        Z->dot[j] = Z->gg[j] = Z->tt[j] = Z->sq[j] = Z->abs_sum[j] = Z->max_abs[j] = Z->max_rel[j] = 0;
        Z->best[j] = -1.0;
        Z->close[j] = Z->w1[j] = Z->w5[j] = 0;
        Z->pos[j] = -1;
    }
}

/* One chunk [s, e): finite elements first (their worst by first maximum of the score), then
 * the NaN/Inf bookkeeping, in the order the numpy accumulator applies them. */
static void chunk(const void *g, int gd, const void *t, int td, int64_t s, int64_t e, double rtol,
                  double atol, int equal_nan, Sums *S, Counts *C) {
    double dot = 0, gg = 0, tt = 0, sq = 0, abs_sum = 0, max_abs = S->max_abs, max_rel = S->max_rel;
    int64_t n_finite = 0, close = 0, w1 = 0, w5 = 0, g_nan = 0, t_nan = 0, g_inf = 0, t_inf = 0, bad = 0;
    double best = -1.0;
    int64_t best_pos = -1, first_bad = -1;
    lane_fn lanes = NULL;
#ifdef TSP_X86
    if (k_avx2) lanes = lanes_avx2[gd][td];
#endif
    Lanes Z;
    lanes_reset(&Z);
    for (int64_t from = s; from < e;) {
    int64_t n = e - from < BLOCK ? e - from : BLOCK;
    n -= n % LANES;
    if (lanes != NULL && n > 0 && lanes(g, t, from, n, rtol, atol, &Z)) {
        n_finite += n;
        from += n;
        continue;
    }
    int64_t to = n > 0 ? from + n : e;       /* a block with NaN/Inf, or the tail */
    for (int64_t i = from; i < to; i++) {
        double a = load(g, gd, i), b = load(t, td, i);
        int an = isnan(a) != 0, bn = isnan(b) != 0, ai = isinf(a) != 0, bi = isinf(b) != 0;
        if (!(an | bn | ai | bi)) {
            /* no division unless an extreme may improve: rel <= k  <=>  d <= k |g| (also when
             * g == 0: rel is 0 for d == 0, inf otherwise) */
            double d = fabs(b - a), ag = fabs(a), tol = atol + rtol * ag;
            n_finite++;
            close += d <= tol;
            w1 += d <= 1e-3 * ag;
            w5 += d <= 5e-3 * ag;
            dot += a * b; gg += a * a; tt += b * b; sq += (b - a) * (b - a); abs_sum += d;
            if (d > max_abs) max_abs = d;
            if (d > max_rel * ag) {
                double rel = ag > 0 ? d / ag : (d == 0 ? 0.0 : INFINITY);
                if (rel > max_rel) max_rel = rel;
            }
            if (d > best * tol || best < 0) {
                double score = tol > 0 ? d / tol : (d == 0 ? 0.0 : INFINITY);
                if (score > best) { best = score; best_pos = i; }
            }
            continue;
        }
        g_nan += an; t_nan += bn; g_inf += ai; t_inf += bi;
        int is_bad = (an != bn) || ((ai | bi) && !(an | bn) && a != b);
        if (is_bad) {
            bad++;
            if (first_bad < 0) first_bad = i;
            continue;
        }
        /* same non-finite value on both sides: close per isclose, inside the 0.1%/0.5% shares
         * unless NaN == NaN is not asked to be equal */
        int both_nan = an & bn;
        if (!both_nan || equal_nan) { close++; w1++; w5++; }
    }
    from = to;
    }
    for (int j = 0; j < LANES; j++) {       /* the lanes into the chunk's sums, in lane order */
        dot += Z.dot[j]; gg += Z.gg[j]; tt += Z.tt[j]; sq += Z.sq[j]; abs_sum += Z.abs_sum[j];
        close += Z.close[j]; w1 += Z.w1[j]; w5 += Z.w5[j];
        if (Z.max_abs[j] > max_abs) max_abs = Z.max_abs[j];
        if (Z.max_rel[j] > max_rel) max_rel = Z.max_rel[j];
        if (Z.pos[j] >= 0 && (Z.best[j] > best || (Z.best[j] == best && Z.pos[j] < best_pos))) {
            best = Z.best[j]; best_pos = Z.pos[j];
        }
    }
    S->dot += dot; S->gg += gg; S->tt += tt; S->sq += sq; S->abs_sum += abs_sum;
    S->max_abs = max_abs; S->max_rel = max_rel;
    C->n += e - s; C->n_finite += n_finite; C->close += close; C->w1 += w1; C->w5 += w5;
    C->g_nan += g_nan; C->t_nan += t_nan; C->g_inf += g_inf; C->t_inf += t_inf; C->mismatch += bad;
    if (best_pos >= 0 && best > S->worst_score) {
        S->worst_score = best; C->worst_pos = best_pos;
        S->worst_g = load(g, gd, best_pos); S->worst_t = load(t, td, best_pos);
    }
    if (bad && S->worst_score < INFINITY) {
        S->worst_score = INFINITY; C->worst_pos = first_bad;
        S->worst_g = load(g, gd, first_bad); S->worst_t = load(t, td, first_bad);
    }
}

/* Elements [begin, end) of both arrays in chunks of `chunk_size` (aligned to multiples of it
 * from element 0, as the numpy walk is). S and C start zeroed (worst_pos -1). */
int tsp_compare(const void *g, int gd, const void *t, int td, int64_t begin, int64_t end,
                int64_t chunk_size, double rtol, double atol, int equal_nan, double *sums, int64_t *counts) {
    if (gd < 0 || gd >= N_FLOAT || td < 0 || td >= N_FLOAT || chunk_size <= 0) return -1;
    Sums *S = (Sums *)sums;
    Counts *C = (Counts *)counts;
    for (int64_t s = begin; s < end;) {
        int64_t e = (s / chunk_size + 1) * chunk_size;
        if (e > end) e = end;
        chunk(g, gd, t, td, s, e, rtol, atol, equal_nan, S, C);
        s = e;
    }
    return 0;
}
