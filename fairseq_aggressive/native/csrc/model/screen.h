// A float model's greedy choice with fewer multiply-adds: a pass that keeps no
// scores (streams, the server) needs only each position's first maximum, not
// every logit.  The output projection's int8 copy (the screen) gives every
// logit within a bound that holds whatever the row; the float projection then
// computes, bit for bit as linear() does, only the panels whose columns could
// be the maximum, and the special columns (whose scores the rules adjust).
//
// The bound.  Row x (K values, amax = max |x_k|) is quantized as the int8
// products quantize it: q_k = round(x_k / sx), sx = amax / 127, so
// x_k = sx q_k + r_k with |r_k| <= R = sx / 2 (plus rounding slack).  Output n's
// weights w_nk = s_n p_nk + t_nk (its int8 levels p, its scale s_n) with
// |t_nk| <= T_n.  The screen's logit is z~_n = sx s_n sum_k q_k p_nk (an exact
// integer sum, then two roundings), so against the real dot product
//   |sum_k x_k w_nk - z~_n| <= R W_n + sx sum_k |q_k| T_n + rounding of z~_n,
// W_n = sum_k |w_nk|, sx sum |q_k| <= |x|_1 + K R; the float kernel's own sum
// (sequential fused multiply-adds) is within K 2^-23 amax W_n of the real one.
// Their sum e_n (with margins for the float arithmetic that evaluates it) bounds
// |z_n - z~_n|, z_n the float projection's logit.  With L = max over the
// ordinary columns of z~_n - e_n, attained at column i: z_i >= L.  A column
// with z~_n + e_n < L has z_n < L <= z_i, so it is neither the maximum nor tied
// with it, and below the row's length limit the rules change only the special
// columns' scores (pad, unk, EOS: always computed), so the first maximum of the
// adjusted scores is among the computed columns.  The columns not computed
// keep z~_n, which is below z_i as well (z~_n < L - e_n): the argmax over the
// whole row is the full projection's, with ties broken alike.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/linear.h"

namespace fa {

struct Decoder;

struct Screen {
  Linear q;                  // the output projection in int8, a scale per output
  std::vector<float> w1;     // per output: sum_k |w_nk| (rounded up)
  std::vector<float> t_max;  // per output: max_k |w_nk - s_n p_nk| (rounded up)
  float w1_max = 0.f, t_max_all = 0.f;  // their maxima over the outputs
  bool ready() const { return q.N > 0; }
};

// The screen of a float output projection without bias (else s stays empty)
void build_screen(const Linear& proj, Screen& s);

// Logits of M rows of h (row stride C) into out (row stride vocabulary): the
// full projection's, bit for bit, at every column that could be the row's
// greedy choice and at the special columns; the screen's below the others
void project_screened(Decoder& m, const float* h, int M, float* out);

// Positions and panels screened since the process started (the tests and the
// diagnostics read them): panels computed exactly, rows screened, rows that
// fell back to the whole projection
struct ScreenCounts {
  int64_t rows = 0, panels = 0, whole = 0;
};
ScreenCounts screen_counts();

}  // namespace fa
