// The C API that fairseq_aggressive/native (build.py, engine.py,
// block_drafter.py) calls through ctypes: every extern "C" function of the
// library.  Handles are opaque pointers: a model (fa_model_new) and the
// decoder state of one batch (fa_begin, fa_begin_encoded).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <thread>
#include <vector>

#include "block_drafter.h"
#include "blockwise_loop.h"
#include "copy_loop.h"
#include "draft_lengths.h"
#include "amx.h"
#include "beam_search.h"
#include "feature_loop.h"
#include "model.h"
#include "parallel.h"
#include "pass.h"
#include "running_batch.h"
#include "vec.h"

using fa::Model;
using fa::State;

namespace {

// The version of this API; c_api.py's API_VERSION must equal it (a library
// built from other sources is refused with a message to rebuild it).
constexpr int kApiVersion = 16;

Model& model(void* mp) { return *static_cast<Model*>(mp); }

// Runs a call that decodes: an exception (a lost completion in the pool, memory
// exhausted) becomes the model's error and `failed` instead of crossing into Python.
template <class R, class F>
R guarded(void* mp, R failed, F&& call) {
  try {
    return call();
  } catch (const std::exception& e) {
    model(mp).error = e.what();
  } catch (...) {
    model(mp).error = "unknown C++ exception";
  }
  return failed;
}
State& state(void* sp) { return *static_cast<State*>(sp); }

// The weights of m for a call that changes them: refused (an exception, so the
// call's error) once another decoder reads them
fa::Weights& weights_to_change(Model& m) {
  if (m.weights_shared()) throw std::logic_error("the weights are shared with another decoder (fa_model_share): they no longer change");
  return *m.shared;
}

}  // namespace

// The library's only exported symbols (it is built with -fvisibility=hidden)
#pragma GCC visibility push(default)
extern "C" {

// ------------------------------------------------------------ library
int fa_version() { return kApiVersion; }

// sizeof the structs c_api.py mirrors ("Config", "PassArgs", "LoopRules",
// "LoopOutput", "CopyLoopArgs", "LoopStats", "CopyLoopStats", "DraftArgs",
// "FeatureLoopArgs", "BlockwiseLoopArgs"); -1 for another name
int fa_sizeof(const char* name) {
  if (std::strcmp(name, "Config") == 0) return (int)sizeof(fa::Config);
  if (std::strcmp(name, "PassArgs") == 0) return (int)sizeof(fa::PassArgs);
  if (std::strcmp(name, "CopyLoopArgs") == 0) return (int)sizeof(fa::CopyLoopArgs);
  if (std::strcmp(name, "CopyLoopStats") == 0) return (int)sizeof(fa::CopyLoopStats);
  if (std::strcmp(name, "DraftArgs") == 0) return (int)sizeof(fa::DraftArgs);
  if (std::strcmp(name, "LoopStats") == 0) return (int)sizeof(fa::LoopStats);
  if (std::strcmp(name, "LoopRules") == 0) return (int)sizeof(fa::LoopRules);
  if (std::strcmp(name, "LoopOutput") == 0) return (int)sizeof(fa::LoopOutput);
  if (std::strcmp(name, "FeatureLoopArgs") == 0) return (int)sizeof(fa::FeatureLoopArgs);
  if (std::strcmp(name, "BlockwiseLoopArgs") == 0) return (int)sizeof(fa::BlockwiseLoopArgs);
  if (std::strcmp(name, "RunSettings") == 0) return (int)sizeof(fa::RunSettings);
  if (std::strcmp(name, "RunStats") == 0) return (int)sizeof(fa::RunStats);
  if (std::strcmp(name, "BeamArgs") == 0) return (int)sizeof(fa::BeamArgs);
  return -1;
}

// The build target: "generic", "avx2", "avx512", "avx512vnni" or "avx512amx"
// (vec.h; "generic-wide" and "generic-amx" report "generic" and "generic-amx")
const char* fa_isa() { return FA_ISA_NAME; }

// AMX tiles for the int8 products of several rows: 1 in use, 0 not in this
// build, -1 the CPU or OS lacks them, -2 the OS refused them to this process
// (the last two run the VNNI tiles: the same results)
int fa_amx_state() {
#if defined(FA_AMX)
  return fa::amx::state();
#else
  return 0;
#endif
}

// Outputs per weight panel (8 or 16) and k per int8 group (2 or 4): the layout
// of the target's kernels, which does not change any result
int fa_layout(int which) { return which == 0 ? fa::PANEL : fa::Q8_GROUP; }

#ifndef FA_SOURCE_KEY
#define FA_SOURCE_KEY ""
#endif
// The digest of the csrc/ files this library was built from (targets.py's
// source_key), or "" where the build did not record it
const char* fa_source_key() { return FA_SOURCE_KEY; }

// ------------------------------------------------------------ model
// A model with the shape cfg and no weights yet: give each tensor with
// fa_set_weight (names in csrc/weights.h), then pack them with fa_model_build.
// nullptr if it cannot be made (memory).
void* fa_model_new(const fa::Config* cfg) {
  try {
    return new Model(*cfg);
  } catch (...) {
    return nullptr;
  }
}

// Copies one named tensor (rows x cols, row-major; dtype 0 float32, 1 float16,
// 2 int8) of `layer` (-1 for a tensor outside the layers).  0, or -1 when the
// name, layer, shape or dtype is wrong (fa_model_error says which).
int fa_set_weight(void* mp, const char* name, int layer, int dtype, const void* data, int rows, int cols) {
  return guarded(mp, -1, [&] {
    Model& m = model(mp);
    m.error = weights_to_change(m).staged.put(m.cfg, name, layer, dtype, data, rows, cols);
    return m.error.empty() ? 0 : -1;
  });
}

// Packs the tensors given; 0, or -1 when one is missing or inconsistent (fa_model_error)
int fa_model_build(void* mp) {
  return guarded(mp, -1, [&] {
    Model& m = model(mp);
    fa::Weights& w = weights_to_change(m);
    m.error = fa::build_model(m);
    w.built = m.error.empty();
    return m.error.empty() ? 0 : -1;
  });
}

// A second decoder on the weights of mp (built): one copy of the weights for
// every decoder made this way, each with its own thread pool (one thread:
// fa_set_threads), scratch buffers, shortlist and error, so that several run at
// once on separate threads.  nullptr if mp is not built (fa_model_error) or
// memory is short.  Free each with fa_model_free; the weights go with the last.
void* fa_model_share(void* mp) {
  return guarded<void*>(mp, nullptr, [&]() -> void* {
    const Model& m = model(mp);
    if (!m.w.built) throw std::logic_error("the model is not built (fa_model_build) yet");
    return new Model(Model::ShareWeightsOf{m});
  });
}

// why the last fa_set_weight, fa_model_build, fa_begin*, fa_pass or fa_draft failed
const char* fa_model_error(void* mp) { return model(mp).error.c_str(); }

void fa_model_free(void* mp) {
  try {
    fa::keep_policy(model(mp));  // what it learnt, for the decoders made after it
  } catch (...) {
  }
  delete static_cast<Model*>(mp);
}

// linear layers stored as float16 / as int8
int fa_half_linears(void* mp) { return model(mp).w.half_linears(); }
int fa_int8_linears(void* mp) { return model(mp).w.int8_linears(); }

// the address of the weights a decoder reads: equal for decoders that share them (fa_model_share)
int64_t fa_weights_id(void* mp) { return (int64_t)(intptr_t)&model(mp).w; }

// ------------------------------------------------------------ threads
// 0, or -2 if the threads could not be started (fa_model_error says why)
int fa_set_threads(void* mp, int n) {
  return guarded(mp, -2, [&] {
    Model& m = model(mp);
    m.pool.resize(n);
    if (m.policy) m.policy->cost.clear();  // measured again for these threads
    return 0;
  });
}

// the pool's counters (fa::PoolStats, in its order): calls, parallel, worker_items,
// waits, stalls, wait_ns
void fa_pool_stats(void* mp, int64_t* out) { fa::put_stats(model(mp).pool.stats(), out); }

// How long a decoding call waits for its last items before it checks that a
// worker still holds one; a call whose completion was lost then fails (-2 from
// fa_pass, fa_draft; fa_model_error says why) instead of waiting forever.
void fa_set_pool_timeout(void* mp, int ms) { model(mp).pool.set_timeout(std::chrono::milliseconds(std::max(ms, 1))); }


// ------------------------------------------------------------ batches
// Encode B sentences (tokens without padding, concatenated; lengths src_len)
// and allocate decoder caches for cap positions each.
void* fa_begin(void* mp, int B, const int32_t* tokens, const int32_t* src_len, int cap) {
  return guarded<void*>(mp, nullptr, [&]() -> void* { return fa::encode(model(mp), B, tokens, src_len, cap); });
}

// A state from an encoder output computed elsewhere (the verifier's, for a
// --shared-encoder drafter): rows of the B sentences concatenated (src_len[b]
// rows of Config::enc_width() floats each).
void* fa_begin_encoded(void* mp, int B, const float* enc_out, const int32_t* src_len, int cap) {
  return guarded<void*>(mp, nullptr,
                        [&]() -> void* { return fa::state_from_encoder_out(model(mp), B, enc_out, src_len, cap); });
}

void fa_state_free(void* sp) { delete static_cast<State*>(sp); }

// The encoder output of the batch (sum of src_len rows x C, sentences in order)
// into out; the number of floats written.  A drafter that shares the
// verifier's encoder reads it (GAD with a --shared-encoder drafter).
int64_t fa_encoder_out(void* sp, float* out) {
  const State& st = state(sp);
  std::copy(st.enc_out.begin(), st.enc_out.end(), out);
  return (int64_t)st.enc_out.size();
}

int fa_length(void* sp, int b) { return state(sp).sents[b].len; }

// Vocabulary shortlist (approximate decoding, Devlin 2017): every sentence of
// a batch chooses among output ids [0, n) (the special symbols and the most
// frequent tokens: fairseq dictionaries are sorted by frequency) and its own
// ids set by fa_shortlist; log-probs are normalized over that set.
// fa_shortlist_common(n): n = 0 turns it off; -1 if n does not cover the special symbols
// (both: -2 if the engine failed, fa_model_error says why).
int fa_shortlist_common(void* mp, int n) {
  return guarded(mp, -2, [&] { return fa::set_common_shortlist(model(mp), n); });
}

// Sentence b of a batch (after fa_shortlist_common): its ids beyond the common
// ones, ascending, each in [n_common, vocab); -1 if not.  Once any sentence of
// the batch has been given a list, the whole batch decodes on the shortlist.
int fa_shortlist(void* mp, void* sp, int b, int n, const int32_t* ids) {
  return guarded(mp, -2, [&] { return fa::set_sentence_shortlist(model(mp), state(sp), b, n, ids); });
}

// ------------------------------------------------------------ decoding
// One verification pass (fa::PassArgs in csrc/pass.h); 0, -1 (nothing
// changed) if a row does not fit its sentence's cache or its branches do not
// add up to it, or -2 if the pass failed (fa_model_error says why; the batch's
// state is then undefined).
int fa_pass(void* mp, void* sp, const fa::PassArgs* args) {
  return guarded(mp, -2, [&] { return fa::verify_pass(model(mp), state(sp), *args); });
}

// The whole loop of source-copy drafting or greedy search over a batch just
// begun (fa::CopyLoopArgs in csrc/copy_loop.h), its counters added to *stats;
// 0, -1 (nothing decoded) if an argument does not fit the batch, or -2 if it
// failed (fa_model_error says why; the batch's state is then undefined).
int fa_decode_copy(void* mp, void* sp, const fa::CopyLoopArgs* args, fa::CopyLoopStats* stats) {
  return guarded(mp, -2, [&] { return fa::decode_copy(model(mp), state(sp), *args, *stats); });
}

// Beam search over an encoded batch whose caches are unused (fa::decode_beam,
// csrc/beam_search.h): fairseq's SequenceGenerator, step for step; 0, -1
// (nothing decoded: an argument does not fit), or -2 (fa_model_error).
int fa_decode_beam(void* mp, void* sp, const fa::BeamArgs* args) {
  return guarded(mp, -2, [&] { return fa::decode_beam(model(mp), state(sp), *args); });
}

// ------------------------------------------------------------ running batches
// Continuous batching (fa::RunningBatch in csrc/running_batch.h): rows join
// and leave between passes.  One thread drives a running batch (join, run,
// take) on one decoder mp; fa_run_wake may come from any thread.
void* fa_run_new(void* mp, const fa::RunSettings* s) {
  return guarded<void*>(mp, nullptr, [&]() -> void* {
    const bool copies = s->drafter == 0, feature = s->drafter == 1;
    if (!(copies || feature) || (copies && s->max_draft < 0) || s->ngram_min < 1 || s->ngram_max < s->ngram_min ||
        s->min_len < 0 || (feature && (s->k < 1 || s->room < 1)))
      throw std::invalid_argument("running batch: bad draft or length settings");
    return new fa::RunningBatch(*s);
  });
}
void fa_run_free(void* rp) { delete static_cast<fa::RunningBatch*>(rp); }

// n sentences join (RunningBatch::join; dp: the feature drafter's decoder, or
// null); 0, -1 (nothing joined: an argument out of range), or -2
// (fa_model_error; the rows joined before stay as they were)
int fa_run_join(void* mp, void* dp, void* rp, int n, const int32_t* tokens, const int32_t* src_len,
                const int32_t* copy, const int32_t* copy_len, const int32_t* max_len, int32_t* slot_out) {
  return guarded(mp, -2, [&] {
    Model* dm = dp ? &model(dp) : nullptr;
    if (dm != nullptr && (dm->w.feat_proj.N == 0 || dm->w.feat_proj.K != model(mp).cfg.C ||
                          dm->cfg.tgt_vocab != model(mp).cfg.tgt_vocab))
      return -1;  // not a drafter that reads this verifier's features
    return static_cast<fa::RunningBatch*>(rp)->join(model(mp), dm, n, tokens, src_len, copy, copy_len, max_len,
                                                    slot_out);
  });
}

// passes until a row finishes, max_passes or a wake, not before min_ms while rows remain (RunningBatch::run): the
// number of finished slots written, or -2 (fa_model_error; the batch is then undefined)
int fa_run_step(void* mp, void* dp, void* rp, int max_passes, double min_ms, int32_t* finished, int cap) {
  return guarded(mp, -2, [&] {
    return static_cast<fa::RunningBatch*>(rp)->run(model(mp), dp ? &model(dp) : nullptr, max_passes, min_ms, finished,
                                                   cap);
  });
}

int fa_run_take(void* rp, int slot, int32_t* tokens, float* scores, int cap, int32_t* passes) {
  return static_cast<fa::RunningBatch*>(rp)->take(slot, tokens, scores, cap, passes);
}
void fa_run_wake(void* rp) { static_cast<fa::RunningBatch*>(rp)->wake(); }
int fa_run_active(void* rp) { return static_cast<fa::RunningBatch*>(rp)->active(); }
void fa_run_stats(void* rp, fa::RunStats* out) { *out = static_cast<fa::RunningBatch*>(rp)->stats(); }

// The decoder's pass cost (ms at the knots of fa::PassCost, at most cap of
// them, measured now where it was not yet): the number written, or -2
int fa_pass_cost(void* mp, double* out, int cap) {
  return guarded(mp, -2, [&] {
    const fa::DraftPolicy& p = fa::draft_policy(model(mp));
    const auto& k = fa::PassCost::knots();
    const int n = std::min(cap, (int)k.size());
    for (int i = 0; i < n; ++i) out[i] = p.cost.ms(k[i]);
    return n;
  });
}

// A block drafter's slot input vector (C floats); 0, or -2 (fa_model_error).
int fa_set_mask_embed(void* mp, const float* v) {
  return guarded(mp, -2, [&] {
    Model& m = model(mp);
    weights_to_change(m).mask_embed.assign(v, v + m.cfg.C);
    return 0;
  });
}

// A --verifier-features drafter's projection (C x n_in weights W, bias b) of
// the verifier's features into its prefix inputs; 0, or -2 (fa_model_error).
int fa_set_feature_proj(void* mp, const float* W, const float* b, int n_in) {
  return guarded(mp, -2, [&] {
    Model& m = model(mp);
    weights_to_change(m).feat_proj.pack(W, nullptr, b, m.cfg.C, n_in);
    return 0;
  });
}

// A --feature-ar drafter's projection of its own output (C x C, bias C) where
// the verifier's features are wider than the drafter (fa_set_feature_proj
// projects those); 0, or -2 (fa_model_error).
int fa_set_own_feature_proj(void* mp, const float* W, const float* b) {
  return guarded(mp, -2, [&] {
    Model& m = model(mp);
    weights_to_change(m).own_feat_proj.pack(W, nullptr, b, m.cfg.C, m.cfg.C);
    return 0;
  });
}

// One block-drafter pass (fa::DraftArgs in csrc/block_drafter.h); 0, -1 if a
// row does not fit its sentence's cache, or -2 (fa_model_error).
int fa_draft(void* mp, void* sp, const fa::DraftArgs* args) {
  return guarded(mp, -2, [&] { return fa::draft_pass(model(mp), state(sp), *args); });
}

// The whole loop of a --feature-ar drafter (drafter model dp, its state ds,
// begun from the encoder output of the verifier's state vs) and the verifier
// vp over a batch just begun (fa::FeatureLoopArgs in csrc/feature_loop.h), its
// counters added to *stats; 0, -1 (nothing decoded) if an argument does not
// fit the batch or the drafter does not read this verifier's features, or -2
// if it failed (the verifier's fa_model_error says why, for either decoder;
// both states are then undefined).
int fa_decode_feature(void* vp, void* vs, void* dp, void* ds, const fa::FeatureLoopArgs* args, fa::LoopStats* stats) {
  return guarded(vp, -2, [&] { return fa::decode_feature(model(vp), state(vs), model(dp), state(ds), *args, *stats); });
}

// A transformer_blockwise model's proposal heads (float32): hidden x C
// weights W1 with bias b1, then n_heads * C x hidden weights W2 with bias b2;
// 0, or -2 (fa_model_error).
int fa_set_heads(void* mp, const float* W1, const float* b1, int hidden, const float* W2, const float* b2,
                 int n_heads) {
  return guarded(mp, -2, [&] {
    Model& m = model(mp);
    if (hidden < 1 || n_heads < 1) throw std::invalid_argument("heads: hidden size and count must be positive");
    fa::Weights& w = weights_to_change(m);
    w.heads_fc1.pack(W1, nullptr, b1, hidden, m.cfg.C);
    w.heads_fc2.pack(W2, nullptr, b2, n_heads * m.cfg.C, hidden);
    w.n_heads = n_heads;
    return 0;
  });
}

// The heads' proposals for n sentences of a batch from their feature rows
// (n x C floats): n_heads tokens each into out; 0, -1 if the model has no
// heads, or -2 (fa_model_error).
int fa_heads(void* mp, void* sp, int n, const int32_t* sent, const float* feats, int32_t* out) {
  return guarded(mp, -2, [&] { return fa::heads_pass(model(mp), state(sp), n, sent, feats, out); });
}

// The whole loop of blockwise parallel decoding over a batch just begun
// (fa::BlockwiseLoopArgs in csrc/blockwise_loop.h), its counters added to
// *stats; 0, -1 (nothing decoded) if an argument does not fit the batch or the
// model has no heads, or -2 (fa_model_error; the batch's state is then undefined).
int fa_decode_blockwise(void* mp, void* sp, const fa::BlockwiseLoopArgs* args, fa::LoopStats* stats) {
  return guarded(mp, -2, [&] { return fa::decode_blockwise(model(mp), state(sp), *args, *stats); });
}

}  // extern "C"
#pragma GCC visibility pop
