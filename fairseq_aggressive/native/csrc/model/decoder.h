// A decoder of a model in the engine (the model's configuration and weights
// are in weights.h): the per-batch state it decodes (each sentence's encoder
// keys/values and self-attention cache, its vocabulary shortlist), and the
// encoder and decoder computations on them.
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "cpu/linear.h"
#include "pool/parallel.h"
#include "model/weights.h"

namespace fa {

class DraftPolicy;

// One decoder of a model: the weights (shared with the decoders made from the
// same model) and what its calls write: the thread pool, the scratch buffers,
// the vocabulary shortlist and the last error.  Decoders that share weights run
// at once on separate threads, each one call at a time.
struct Decoder {
  const Config cfg;
  int D = 0;  // head dimension
  float scaling = 1.f;
  std::shared_ptr<Weights> shared;
  const Weights& w;  // *shared, read only: decoding never changes weights (the C API's setters write *shared)
  std::string error;  // why the last fa_set_weight, fa_model_build or decoding call failed
  // vocabulary shortlist (fa_shortlist_common): output rows [0, sl_n) of proj,
  // the special symbols and the most frequent tokens; 0 = no shortlist
  int sl_n = 0;
  Linear sl_common;
#if defined(FA_TEST_HOOKS)
  // projection weight bytes beyond which a pass projects a path at once
  // (pass.cpp's eager_projection; fa_set_eager_projection_bytes moves it)
  size_t eager_projection_bytes = kEagerProjectionBytes;
  // the screened projection (screen.h): whether passes use it, and a factor on its bound
  // (fa_set_screen; below 1 the bound no longer holds: a mutant for the tests)
  bool screen_on = true;
  float screen_slack = 1.f;
#endif
  Pool pool{1};
  // the order of the last decoder pass's products (set_panels_backward, linear.h)
  bool panels_backward = false;
  // the decoder's draft-length policy (draft_lengths.h: its pass cost is this decoder's, threads included)
  std::shared_ptr<DraftPolicy> policy;
  // scratch
  LineVector<float> x, h, q, kv, a, f, logits, att;

  // a second decoder on the weights of another (after build), with its own pool of one thread
  struct ShareWeightsOf {
    const Decoder& other;
  };
  explicit Decoder(const Config& c);  // c as check_config takes it
  explicit Decoder(ShareWeightsOf s);
  // whether another decoder reads these weights
  bool weights_shared() const { return shared.use_count() > 1; }
};

// Storage of a sentence's caches: line-aligned, and left unset when it grows.
// A self-attention cache holds cap positions (the sentence's length limit) and
// a sentence writes the first few dozen: every position a pass reads (the
// cache up to the sentence's length, then the row's own) was written before,
// by this pass or an earlier one, so new storage is never read unset, and
// leaving it unset leaves its pages untouched (zeroing them cost about as much
// as a sentence's encoder pass's linear layers at a length limit of 200).
template <typename T>
struct CacheAligned : LineAligned<T> {
  CacheAligned() = default;
  template <typename U>
  CacheAligned(const CacheAligned<U>&) {}
  template <typename U>
  struct rebind {
    using other = CacheAligned<U>;
  };
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;  // default-initialised: a float is left as it is
  }
  template <typename U, typename... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
};
using CacheVector = std::vector<float, CacheAligned<float>>;

// where position p of head h of layer l starts in a cache of `rows` positions per head (see Sentence)
inline size_t kv_at(int l, int h, int p, int H, int rows, int D) { return (((size_t)l * H + h) * rows + p) * D; }

// Attention keys and values, per layer and head: the head's D values of each
// position together (kv_at), so the keys one head's attention reads are
// contiguous (in a position-major cache a head's values of successive
// positions lie C floats apart, map to few L1 sets and defeat the prefetchers)
struct Sentence {
  int src_len = 0, len = 0, cap = 0;
  CacheVector enc_k, enc_v;          // per layer, per head: src_len x D
  // where the encoder keys and values are read: null, this sentence's own;
  // else another's (a beam's hypotheses share their sentence's)
  const Sentence* enc = nullptr;
  CacheVector self_k, self_v;        // per layer, per head: cap x D (positions >= len unset)
  std::vector<int32_t> sl_ids;  // shortlist rows of this sentence beyond the common ones (ascending)
  Linear sl_extra;
};

struct State {
  std::vector<Sentence> sents;
  std::vector<float> enc_out;  // the encoder output, sentences' rows concatenated (fa_encoder_out)
  bool shortlist = false;  // project to the shortlist (common rows + each sentence's sl_ids)
};

// ------------------------------------------------------------ vocabulary
// Output columns of sentence s's logits: the vocabulary, or with a shortlist
// the common ids then the sentence's own (ascending ids, so ties between
// columns go to the lowest id either way).
int columns(const Decoder& m, const State& st, const Sentence& s);
// the token id of column u
int token_of_column(const Decoder& m, const State& st, const Sentence& s, int u);
// the column of token id tok (-1: not among the sentence's columns)
int column_of(const Decoder& m, const State& st, const Sentence& s, int tok);
// logits (row stride cfg.tgt_vocab) of M feature rows h (C floats each); row i
// belongs to sentence sent_of[i] (its shortlist columns)
void project(Decoder& m, const State& st, const float* h, int M, const int32_t* sent_of, float* out);
// shortlist: the common ids [0, n) (0: none); -1 if n does not cover the special symbols
int set_common_shortlist(Decoder& m, int n);
// sentence b's ids beyond the common ones (ascending, each in [n_common, vocab)); -1 if not
int set_sentence_shortlist(Decoder& m, State& st, int b, int n, const int32_t* ids);

// ------------------------------------------------------------ computation
// grows v to at least n values (scratch buffers)
void ensure(LineVector<float>& v, size_t n);

// Encodes B sentences (tokens without padding, concatenated) into a new state
// with decoder caches of cap positions each.
State* encode(Decoder& m, int B, const int32_t* tokens, const int32_t* src_len, int cap);
// A state from an encoder output computed elsewhere (rows of the B sentences concatenated).
State* state_from_encoder_out(Decoder& m, int B, const float* enc_out, const int32_t* src_len, int cap);

// The decoder over n rows on top of their sentences' caches: row r (tokens at
// off[r] .. off[r + 1], target id -1 = a block drafter's slot) at positions
// s.len .. s.len + row_len[r]; keys and values of every row position go into
// the cache (the verification pass and the drafter decide what stays).
// Position t attends causally (cache and positions <= t), or, from t =
// bidir_from[r] on (when given), to every position of the row.  Tree rows
// (branch_start given, a verification pass over several drafts): the row is
// [last, branch 1, branch 2, ...]; flat position i > 0 of a row belongs to the
// branch that starts at row position branch_start[i] >= 1, sits at the output
// position of its depth in the branch, and attends to the cache, the row's
// first position and its own branch up to itself.  add (or null): per row
// position C floats added to the input embedding.  The final features are in m.x.
void decoder_rows(Decoder& m, State& st, int n, const int32_t* sent, const int32_t* row_len, const int32_t* tokens,
                  const std::vector<int>& off, int max_keys, const int32_t* bidir_from,
                  const int32_t* branch_start = nullptr, const float* add = nullptr);

}  // namespace fa
