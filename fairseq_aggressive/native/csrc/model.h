// The model in the engine: its configuration, weights and layers, the
// per-batch decoder state (each sentence's encoder keys/values and
// self-attention cache, its vocabulary shortlist), and the encoder and
// decoder computations on them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "linear.h"
#include "parallel.h"
#include "weights.h"

namespace fa {

class DraftPolicy;
struct PolicyCache;

// The model's shape and fairseq options (mirrored by _Config in engine.py)
struct Config {
  int32_t C, H, F, enc_layers, dec_layers, src_vocab, tgt_vocab;
  int32_t enc_normalize_before, dec_normalize_before, gelu, pad, unk, eos;
  float enc_embed_scale, dec_embed_scale, ln_eps;
  // The width of the encoder output the decoder attends to; 0: C.  Another
  // width: a decoder over another model's encoder output (a --shared-encoder
  // drafter narrower than its verifier), with no encoder of its own (no
  // encoder tensors, enc_layers 0; it starts from fa_begin_encoded only).
  int32_t enc_dim;

  int enc_width() const { return enc_dim > 0 ? enc_dim : C; }
  bool has_encoder() const { return enc_width() == C; }
};

struct Norm {
  std::vector<float> w, b;
  bool on = false;
};

struct EncLayer {
  Linear qkv, out, fc1, fc2;
  Norm ln_attn, ln_ffn;
};
struct DecLayer {
  Linear qkv, out, cq, ckv, cout, fc1, fc2;  // self-attention q + k + v, its output; encoder attention q, k + v, output
  Norm ln_self, ln_cross, ln_ffn;
};

// The weights of a model: given by name (fa_set_weight), packed once
// (fa_model_build), then only read.  Every decoder made from a model
// (fa_model_share) reads the same copy; nothing changes them once a second
// decoder exists (the C API refuses).
struct Weights {
  WeightSet staged;  // named tensors given by fa_set_weight until build_model packs them
  std::vector<float> src_embed, tgt_embed, src_pos, tgt_pos;  // pos tables may be empty
  std::vector<float> mask_embed;  // a block drafter's slot input (fa_set_mask_embed): target id -1
  Linear feat_proj;  // a --verifier-features drafter's projection of the verifier's features (fa_set_feature_proj)
  // a --feature-ar drafter's projection of its own output where that is
  // narrower than the verifier's features (fa_set_own_feature_proj); empty: feat_proj
  Linear own_feat_proj;
  // a transformer_blockwise model's proposal heads 2..k (fa_set_heads): n_heads
  // outputs of heads_fc2(relu(heads_fc1(x))), each C wide and added to x, read
  // with the output projection; proposals only, float32
  Linear heads_fc1, heads_fc2;
  int n_heads = 0;
  Norm enc_ln_embed, enc_final, dec_ln_embed, dec_final;
  std::vector<EncLayer> enc;
  std::vector<DecLayer> dec;
  Linear proj;
  bool built = false;
  // the draft-length policies its decoders left (draft_lengths.h); not weights, shared as they are
  std::shared_ptr<PolicyCache> policies;

  explicit Weights(const Config& c);
  // linear layers stored as float16 / as int8
  int half_linears() const;
  int int8_linears() const;
  // f(layer) for every linear layer of the encoder, the decoder and the output projection
  template <class F>
  void for_each_linear(F&& f) {
    visit_decoder(*this, f);
    visit_encoder(*this, f);
  }
  template <class F>
  void for_each_linear(F&& f) const {
    visit_decoder(*this, f);
    visit_encoder(*this, f);
  }
  // the same for the encoder's layers alone, and for the decoder's with the output projection
  template <class F>
  void for_each_encoder_linear(F&& f) {
    visit_encoder(*this, f);
  }
  template <class F>
  void for_each_decoder_linear(F&& f) {
    visit_decoder(*this, f);
  }

 private:
  template <class W, class F>
  static void visit_encoder(W& w, F& f) {
    for (auto& L : w.enc)
      for (auto* x : {&L.qkv, &L.out, &L.fc1, &L.fc2}) f(*x);
  }
  template <class W, class F>
  static void visit_decoder(W& w, F& f) {
    f(w.proj);
    for (auto& L : w.dec)
      for (auto* x : {&L.qkv, &L.out, &L.cq, &L.ckv, &L.cout, &L.fc1, &L.fc2}) f(*x);
  }
};

// One decoder of a model: the weights (shared with the decoders made from the
// same model) and what its calls write: the thread pool, the scratch buffers,
// the vocabulary shortlist and the last error.  Decoders that share weights run
// at once on separate threads, each one call at a time.
struct Model {
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
  // projection weight bytes beyond which a pass projects a path at once (pass.cpp; the tests move it)
  size_t eager_projection_bytes = kEagerProjectionBytes;
  Pool pool{1};
  // the order of the last decoder pass's products (set_panels_backward, linear.h)
  bool panels_backward = false;
  // the decoder's draft-length policy (draft_lengths.h: its pass cost is this decoder's, threads included)
  std::shared_ptr<DraftPolicy> policy;
  // scratch
  LineVector<float> x, h, q, kv, a, f, logits, att;

  // a second decoder on the weights of another (after build), with its own pool of one thread
  struct ShareWeightsOf {
    const Model& other;
  };
  explicit Model(const Config& c);  // c as check_config takes it
  explicit Model(ShareWeightsOf s);
  // whether another decoder reads these weights
  bool weights_shared() const { return shared.use_count() > 1; }
};

// where position p of head h of layer l starts in a cache of `rows` positions per head (see Sentence)
inline size_t kv_at(int l, int h, int p, int H, int rows, int D) { return (((size_t)l * H + h) * rows + p) * D; }

// Packs the tensors of m.w.staged into the model's layers; "" or what is wrong
std::string build_model(Model& m);

// "" if a model of shape c can be made, else what is wrong (widths, heads, layers, vocabularies, symbols)
std::string check_config(const Config& c);

// Attention keys and values, per layer and head: the head's D values of each
// position together (kv_at), so the keys one head's attention reads are
// contiguous (in a position-major cache a head's values of successive
// positions lie C floats apart, map to few L1 sets and defeat the prefetchers)
struct Sentence {
  int src_len = 0, len = 0, cap = 0;
  LineVector<float> enc_k, enc_v;    // per layer, per head: src_len x D
  // where the encoder keys and values are read: null, this sentence's own;
  // else another's (a beam's hypotheses share their sentence's)
  const Sentence* enc = nullptr;
  LineVector<float> self_k, self_v;  // per layer, per head: cap x D
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
int columns(const Model& m, const State& st, const Sentence& s);
// the token id of column u
int token_of_column(const Model& m, const State& st, const Sentence& s, int u);
// the column of token id tok (-1: not among the sentence's columns)
int column_of(const Model& m, const State& st, const Sentence& s, int tok);
// logits (row stride cfg.tgt_vocab) of M feature rows h (C floats each); row i
// belongs to sentence sent_of[i] (its shortlist columns)
void project(Model& m, const State& st, const float* h, int M, const int32_t* sent_of, float* out);
// shortlist: the common ids [0, n) (0: none); -1 if n does not cover the special symbols
int set_common_shortlist(Model& m, int n);
// sentence b's ids beyond the common ones (ascending, each in [n_common, vocab)); -1 if not
int set_sentence_shortlist(Model& m, State& st, int b, int n, const int32_t* ids);

// ------------------------------------------------------------ computation
// grows v to at least n values (scratch buffers)
void ensure(LineVector<float>& v, size_t n);

// Encodes B sentences (tokens without padding, concatenated) into a new state
// with decoder caches of cap positions each.
State* encode(Model& m, int B, const int32_t* tokens, const int32_t* src_len, int cap);
// A state from an encoder output computed elsewhere (rows of the B sentences concatenated).
State* state_from_encoder_out(Model& m, int B, const float* enc_out, const int32_t* src_len, int cap);

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
void decoder_rows(Model& m, State& st, int n, const int32_t* sent, const int32_t* row_len, const int32_t* tokens,
                  const std::vector<int>& off, int max_keys, const int32_t* bidir_from,
                  const int32_t* branch_start = nullptr, const float* add = nullptr);

}  // namespace fa
