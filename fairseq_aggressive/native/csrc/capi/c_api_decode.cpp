// The C API's decoding entries (see c_api.cpp): verification passes, the
// engine's decoding loop (running batches, and static batches decoded whole),
// beam search, drafters and proposal heads.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "beam/beam_search.h"
#include "capi/c_api_support.h"
#include "loop/block_drafter.h"
#include "loop/draft_lengths.h"
#include "loop/drafter.h"
#include "loop/running_batch.h"
#include "model/decoder.h"
#include "model/pass.h"

using fa::Decoder;
using fa::State;
using namespace fa::capi;  // model(), state(), guarded(), weights_to_change()

int fa::capi::decode_struct_size(const char* name) {
  static const std::pair<const char*, size_t> sizes[] = {
      {"LoopStats", sizeof(fa::LoopStats)},         {"CopyRates", sizeof(fa::CopyRates)},
      {"RunStats", sizeof(fa::RunStats)},           {"DrafterSettings", sizeof(fa::DrafterSettings)},
      {"RunSettings", sizeof(fa::RunSettings)},     {"StaticOutput", sizeof(fa::StaticOutput)},
      {"BeamArgs", sizeof(fa::BeamArgs)},           {"BeamCounts", sizeof(fa::BeamCounts)}};
  for (const auto& s : sizes)
    if (std::strcmp(name, s.first) == 0) return (int)s.second;
  return -1;
}

#pragma GCC visibility push(default)
extern "C" {

// ------------------------------------------------------------ decoding
// One verification pass (fa::PassArgs in csrc/model/pass.h); 0, -1 (nothing
// changed) if a row does not fit its sentence's cache or its branches do not
// add up to it, or -2 if the pass failed (fa_model_error says why; the batch's
// state is then undefined).
int fa_pass(void* mp, void* sp, const fa::PassArgs* args) {
  return guarded(mp, -2, [&] { return fa::verify_pass(model(mp), state(sp), *args); });
}

// A batch just begun (sp; dp/ds: a feature drafter's decoder and its state of
// the batch, or null) decoded whole by the engine's loop with the drafter
// s->drafter (fa::decode_static in csrc/loop/running_batch.h): each sentence's
// copy source (target ids, copy_len[b] each, concatenated), the batch's length
// limit max_len; outputs into *out, counters into *stats.  0, -1 (nothing
// decoded) if an argument does not fit the batch, or -2 if it failed
// (fa_model_error of mp says why, for either decoder; the states are then
// undefined).  The batch's caches are used up.
int fa_decode(void* mp, void* sp, void* dp, void* ds, const fa::RunSettings* s, const int32_t* copy,
              const int32_t* copy_len, int max_len, const fa::StaticOutput* out, fa::RunStats* stats) {
  return guarded(mp, -2, [&] {
    return fa::decode_static(model(mp), state(sp), dp ? &model(dp) : nullptr, ds ? &state(ds) : nullptr, *s, copy,
                             copy_len, max_len, *out, *stats);
  });
}

// Beam search over an encoded batch whose caches are unused (fa::decode_beam,
// csrc/beam/beam_search.h): fairseq's SequenceGenerator, step for step, drafted
// where args->src is given; what it did into *counts; 0, -1 (nothing decoded:
// an argument does not fit), or -2 (fa_model_error).
int fa_decode_beam(void* mp, void* sp, const fa::BeamArgs* args, fa::BeamCounts* counts) {
  return guarded(mp, -2, [&] { return fa::decode_beam(model(mp), state(sp), *args, counts); });
}

// ------------------------------------------------------------ running batches
// Continuous batching (fa::RunningBatch in csrc/loop/running_batch.h): rows join
// and leave between passes.  One thread drives a running batch (join, run,
// take) on one decoder mp; fa_run_wake may come from any thread.
// dp: the drafter's own decoder (a feature drafter's), or null; null if the
// drafter is unknown or its settings do not fit (fa_model_error says why)
void* fa_run_new(void* mp, void* dp, const fa::RunSettings* s) {
  return guarded<void*>(mp, nullptr, [&]() -> void* { return new fa::RunningBatch(*s, dp ? &model(dp) : nullptr); });
}
void fa_run_free(void* rp) { delete static_cast<fa::RunningBatch*>(rp); }

// n sentences join (RunningBatch::join); 0, -1 (nothing joined: an argument
// out of range, or a drafter that cannot draft for this verifier), or -2
// (fa_model_error; the rows joined before stay as they were)
int fa_run_join(void* mp, void* rp, int n, const int32_t* tokens, const int32_t* src_len, const int32_t* copy,
                const int32_t* copy_len, const int32_t* max_len, int32_t* slot_out) {
  return guarded(mp, -2, [&] {
    return static_cast<fa::RunningBatch*>(rp)->join(model(mp), n, tokens, src_len, copy, copy_len, max_len, slot_out);
  });
}

// passes until a row finishes, max_passes or a wake, not before min_ms while rows remain (RunningBatch::run): the
// number of finished slots written, or -2 (fa_model_error; the batch is then undefined)
int fa_run_step(void* mp, void* rp, int max_passes, double min_ms, int32_t* finished, int cap) {
  return guarded(mp, -2, [&] {
    return static_cast<fa::RunningBatch*>(rp)->run(model(mp), max_passes, min_ms, finished, cap);
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

// One block-drafter pass (fa::DraftArgs in csrc/loop/block_drafter.h); 0, -1 if a
// row does not fit its sentence's cache, or -2 (fa_model_error).
int fa_draft(void* mp, void* sp, const fa::DraftArgs* args) {
  return guarded(mp, -2, [&] { return fa::draft_pass(model(mp), state(sp), *args); });
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

}  // extern "C"
#pragma GCC visibility pop
