/* All element-wise metrics of a golden/target pair in one pass over both arrays.
 *
 * The same results as ts_core/compare/metrics.py's numpy accumulator (which stays the
 * reference and the fallback): float64 accumulation, numpy.isclose semantics
 * (|t - g| <= atol + rtol |g|), relative error |t-g|/|g| (0 where both are 0, inf where only
 * golden is 0), NaN/Inf counted per side, and the worst element chosen chunk by chunk exactly
 * as the numpy version walks its chunks. Inputs are float32 or float64 (either side).
 */
#include <stdint.h>
#include <math.h>
#include "kernels.h"

enum { F32 = TSP_F32, F64 = TSP_F64 };

typedef struct {
    double dot, gg, tt, sq, abs_sum, max_abs, max_rel, worst_score, worst_g, worst_t;
} Sums;

typedef struct {
    int64_t n, n_finite, close, w1, w5, g_nan, t_nan, g_inf, t_inf, mismatch, worst_pos;
} Counts;

static inline double load(const void *p, int dtype, int64_t i) {
    return dtype == F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

/* One chunk [s, e): finite elements first (their worst by first maximum of the score), then
 * the NaN/Inf bookkeeping, in the order the numpy accumulator applies them. */
static void chunk(const void *g, int gd, const void *t, int td, int64_t s, int64_t e, double rtol,
                  double atol, int equal_nan, Sums *S, Counts *C) {
    double dot = 0, gg = 0, tt = 0, sq = 0, abs_sum = 0, max_abs = S->max_abs, max_rel = S->max_rel;
    int64_t n_finite = 0, close = 0, w1 = 0, w5 = 0, g_nan = 0, t_nan = 0, g_inf = 0, t_inf = 0, bad = 0;
    double best = -1.0;
    int64_t best_pos = -1, first_bad = -1;
    for (int64_t i = s; i < e; i++) {
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
    if ((gd != F32 && gd != F64) || (td != F32 && td != F64) || chunk_size <= 0) return -1;
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
