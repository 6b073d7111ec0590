// The row operations around the linear layers: reductions over a row (max,
// logsumexp, argmax), layer norm, activations, attention of one query over
// one head's keys and values, and the embedding of token rows.
//
// Each is a fixed sequence of IEEE float operations (8-lane partial sums
// combined in a fixed order where a loop is vectorized).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fa {

// max of x[0..n) (exact in any order)
float max_of(const float* x, int n);

// max of |x[0..n)| (exact in any order)
float abs_max_of(const float* x, int n);
// log(sum(exp(x))) over n values
float logsumexp(const float* x, int n);
// logsumexp with a coarse exp, several times cheaper: at most 0.06 above
// logsumexp, and below it by rounding only (a confidence, never a score)
float logsumexp_coarse(const float* x, int n);
// index of the first maximum of x[0..n) (0 if every value is NaN)
int argmax_first(const float* x, int n);

void layer_norm(const float* x, float* y, int C, const float* w, const float* b, float eps);
// layer_norm of M rows of C values (y may be x)
void layer_norm_rows(const float* x, float* y, int M, int C, const std::vector<float>& w,
                     const std::vector<float>& b, float eps);

// x[i] += y[i]
void add_rows(float* x, const float* y, size_t n);
// in place over n values
void gelu_rows(float* x, size_t n);
// x * sigmoid(x) (SiLU, transformers' swish)
void swish_rows(float* x, size_t n);
void relu_rows(float* x, size_t n);

// Attention of one query row over keys/values [0, n) of one head (rows of
// stride ld), then n2 more at k2/v2 (a branch of a tree row, after the shared
// prefix): out (D values) = softmax(q . k) weighted sum of the values.
// scratch: n + n2 floats (rounded up to a multiple of 8 plus 8 is enough).
void attend(const float* q, const float* k, const float* v, size_t ld, int n, int D, float* out, float* scratch,
            const float* k2 = nullptr, const float* v2 = nullptr, int n2 = 0);

// attend for nq queries (rows of stride q_ld) over the same n keys and
// values, out rows of stride out_ld: each query's output attend's, bit for
// bit; kAttendQueries of them at a time share each key's and value's loads
// and run their chains side by side (one query's attention is one long chain
// of dependent steps).  scratch: kAttendQueries * (n + 16) floats.
constexpr int kAttendQueries = 4;
void attend_queries(const float* q, size_t q_ld, int nq, const float* k, const float* v, size_t ld, int n, int D,
                    float* out, size_t out_ld, float* scratch);

// Rows r < M of x (C floats each): scale * E[tok[r]] (or *mask for tok[r] < 0)
// + P[pos[r]] (when P is given) + add[r] (when add is given).
void embed_rows(float* x, int C, int M, const int32_t* tok, const int32_t* pos, const float* E, const float* P,
                float scale, const float* mask, const float* add);

}  // namespace fa
