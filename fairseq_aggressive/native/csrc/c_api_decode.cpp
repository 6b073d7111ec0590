// The C API's decoding entries (see c_api.cpp): verification passes, the
// engine's whole decoding loops (source copies, feature drafts, blockwise
// heads, beam search), running batches, drafters and proposal heads.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "beam_search.h"
#include "block_drafter.h"
#include "blockwise_loop.h"
#include "c_api_support.h"
#include "copy_loop.h"
#include "draft_lengths.h"
#include "feature_loop.h"
#include "decoder.h"
#include "pass.h"
#include "running_batch.h"

using fa::Decoder;
using fa::State;
using namespace fa::capi;  // model(), state(), guarded(), weights_to_change()

int fa::capi::decode_struct_size(const char* name) {
  static const std::pair<const char*, size_t> sizes[] = {
      {"CopyLoopArgs", sizeof(fa::CopyLoopArgs)}, {"CopyLoopStats", sizeof(fa::CopyLoopStats)},
      {"LoopStats", sizeof(fa::LoopStats)}, {"LoopRules", sizeof(fa::LoopRules)},
      {"LoopOutput", sizeof(fa::LoopOutput)}, {"FeatureLoopArgs", sizeof(fa::FeatureLoopArgs)},
      {"BlockwiseLoopArgs", sizeof(fa::BlockwiseLoopArgs)}, {"RunSettings", sizeof(fa::RunSettings)},
      {"RunStats", sizeof(fa::RunStats)}, {"BeamArgs", sizeof(fa::BeamArgs)}, {"BeamCounts", sizeof(fa::BeamCounts)}};
  for (const auto& s : sizes)
    if (std::strcmp(name, s.first) == 0) return (int)s.second;
  return -1;
}

#pragma GCC visibility push(default)
extern "C" {

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
// csrc/beam_search.h): fairseq's SequenceGenerator, step for step, drafted
// where args->src is given; what it did into *counts; 0, -1 (nothing decoded:
// an argument does not fit), or -2 (fa_model_error).
int fa_decode_beam(void* mp, void* sp, const fa::BeamArgs* args, fa::BeamCounts* counts) {
  return guarded(mp, -2, [&] { return fa::decode_beam(model(mp), state(sp), *args, counts); });
}

// ------------------------------------------------------------ running batches
// Continuous batching (fa::RunningBatch in csrc/running_batch.h): rows join
// and leave between passes.  One thread drives a running batch (join, run,
// take) on one decoder mp; fa_run_wake may come from any thread.
void* fa_run_new(void* mp, const fa::RunSettings* s) {
  return guarded<void*>(mp, nullptr, [&]() -> void* {
    const bool copies = s->drafter == 0, feature = s->drafter == 1;
    if (!(copies || feature) || s->max_draft < -1 || s->ngram_min < 1 || s->ngram_max < s->ngram_min ||
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
    Decoder* dm = dp ? &model(dp) : nullptr;
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
// an active row leaves unfinished (RunningBatch::drop): 0, or -1 if the slot is not active
int fa_run_drop(void* rp, int slot) { return static_cast<fa::RunningBatch*>(rp)->drop(slot); }
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
    Decoder& m = model(mp);
    weights_to_change(m).mask_embed.assign(v, v + m.cfg.C);
    return 0;
  });
}

// A --verifier-features drafter's projection (C x n_in weights W, bias b) of
// the verifier's features into its prefix inputs; 0, or -2 (fa_model_error).
int fa_set_feature_proj(void* mp, const float* W, const float* b, int n_in) {
  return guarded(mp, -2, [&] {
    Decoder& m = model(mp);
    weights_to_change(m).feat_proj.pack(W, nullptr, b, m.cfg.C, n_in);
    return 0;
  });
}

// A --feature-ar drafter's projection of its own output (C x C, bias C) where
// the verifier's features are wider than the drafter (fa_set_feature_proj
// projects those); 0, or -2 (fa_model_error).
int fa_set_own_feature_proj(void* mp, const float* W, const float* b) {
  return guarded(mp, -2, [&] {
    Decoder& m = model(mp);
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
    Decoder& m = model(mp);
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
