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
#include <string>
#include <thread>
#include <vector>

#include "beam/beam_search.h"
#include "loop/block_drafter.h"
#include "loop/draft_lengths.h"
#include "model/pass.h"
#include "loop/running_batch.h"
#include "cpu/amx.h"
#include "capi/c_api_support.h"
#include "model/decoder.h"
#include "pool/parallel.h"
#include "cpu/vec.h"

using fa::Decoder;
using fa::State;

namespace {

// The version of this API; c_api.py's API_VERSION must equal it (a library
// built from other sources is refused with a message to rebuild it).
constexpr int kApiVersion = 21;

// why this thread's last fa_model_new failed
std::string& new_error() {
  static thread_local std::string e;
  return e;
}

}  // namespace

using namespace fa::capi;  // model(), state(), guarded(), weights_to_change()

// The library's only exported symbols (it is built with -fvisibility=hidden)
#pragma GCC visibility push(default)
extern "C" {

// ------------------------------------------------------------ library
int fa_version() { return kApiVersion; }

// sizeof the structs c_api.py mirrors ("Config", "PassArgs", "DraftArgs",
// "LoopStats", "CopyRates", "RunStats", "DrafterSettings", "RunSettings",
// "StaticOutput", "BeamArgs", "BeamCounts"); -1 for another name
int fa_sizeof(const char* name) {
  static const std::pair<const char*, size_t> sizes[] = {
      {"Config", sizeof(fa::Config)}, {"PassArgs", sizeof(fa::PassArgs)}, {"DraftArgs", sizeof(fa::DraftArgs)}};
  for (const auto& s : sizes)
    if (std::strcmp(name, s.first) == 0) return (int)s.second;
  return fa::capi::decode_struct_size(name);  // the decoding loops' (c_api_decode.cpp)
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
// fa_set_weight (names in csrc/model/weights.h), then pack them with fa_model_build.
// nullptr if it cannot be made (a shape it cannot take, memory): fa_new_error
// says why, on the calling thread.
void* fa_model_new(const fa::Config* cfg) {
  new_error().clear();
  try {
    new_error() = fa::check_config(*cfg);
    return new_error().empty() ? new Decoder(*cfg) : nullptr;
  } catch (const std::exception& e) {
    new_error() = std::string("model: ") + e.what();
  } catch (...) {
    new_error() = "model: unknown failure";
  }
  return nullptr;
}

// Why this thread's last fa_model_new returned nullptr ("" if it did not)
const char* fa_new_error() { return new_error().c_str(); }

// Copies one named tensor (rows x cols, row-major; dtype 0 float32, 1 float16,
// 2 int8) of `layer` (-1 for a tensor outside the layers).  0, or -1 when the
// name, layer, shape or dtype is wrong (fa_model_error says which).
int fa_set_weight(void* mp, const char* name, int layer, int dtype, const void* data, int rows, int cols) {
  return guarded(mp, -1, [&] {
    Decoder& m = model(mp);
    m.error = weights_to_change(m).staged.put(m.cfg, name, layer, dtype, data, rows, cols);
    return m.error.empty() ? 0 : -1;
  });
}

// Packs the tensors given; 0, or -1 when one is missing or inconsistent (fa_model_error)
int fa_model_build(void* mp) {
  return guarded(mp, -1, [&] {
    Decoder& m = model(mp);
    fa::Weights& w = weights_to_change(m);
    m.error = fa::build_weights(*m.shared, m.cfg);
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
    const Decoder& m = model(mp);
    if (!m.w.built) throw std::logic_error("the model is not built (fa_model_build) yet");
    return new Decoder(Decoder::ShareWeightsOf{m});
  });
}

// why the last fa_set_weight, fa_model_build, fa_begin*, fa_pass or fa_draft failed
const char* fa_model_error(void* mp) { return model(mp).error.c_str(); }

void fa_model_free(void* mp) {
  try {
    fa::keep_policy(model(mp));  // what it learnt, for the decoders made after it
  } catch (...) {
  }
  delete static_cast<Decoder*>(mp);
}

// linear layers stored as float16 / as int8
int fa_half_linears(void* mp) { return model(mp).w.half_linears(); }
int fa_int8_linears(void* mp) { return model(mp).w.int8_linears(); }
// bytes of the weights a verification pass reads (Weights::pass_bytes)
int64_t fa_pass_weight_bytes(void* mp) { return (int64_t)model(mp).w.pass_bytes(); }

// the address of the weights a decoder reads: equal for decoders that share them (fa_model_share)
int64_t fa_weights_id(void* mp) { return (int64_t)(intptr_t)&model(mp).w; }

// ------------------------------------------------------------ threads
// 0, or -2 if the threads could not be started (fa_model_error says why)
int fa_set_threads(void* mp, int n) {
  return guarded(mp, -2, [&] {
    Decoder& m = model(mp);
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

// A state of the sentences which[0..n) of sp (just encoded, none decoded),
// moved out of it: their caches, encoder output rows and shortlist; any
// decoder over the same weights decodes it (a static batch split among
// lanes).  sp's other sentences stay as they were; the ones taken are left
// empty, so sp decodes no more.  Null (nothing moved) if an index is out of
// range or repeated, or a sentence reads another's encoder keys (a beam's).
void* fa_state_take(void* sp, int n, const int32_t* which) {
  State& src = state(sp);
  const int B = (int)src.sents.size();
  std::vector<char> seen(B, 0);
  std::vector<size_t> start(B + 1, 0);
  for (int b = 0; b < B; ++b) start[b + 1] = start[b] + (size_t)src.sents[b].src_len;
  for (int i = 0; i < n; ++i) {
    const int b = which[i];
    if (b < 0 || b >= B || seen[b] || src.sents[b].enc != nullptr || src.sents[b].len != 0) return nullptr;
    seen[b] = 1;
  }
  try {
    const size_t width = start[B] ? src.enc_out.size() / start[B] : 0;
    auto* out = new State();
    out->shortlist = src.shortlist;
    out->sents.reserve(n);
    for (int i = 0; i < n; ++i) {
      const int b = which[i];
      out->enc_out.insert(out->enc_out.end(), src.enc_out.begin() + start[b] * width,
                          src.enc_out.begin() + start[b + 1] * width);
      out->sents.push_back(std::move(src.sents[b]));
      src.sents[b] = fa::Sentence();
      src.sents[b].len = -1;  // taken: never decoded, never taken again
    }
    return out;
  } catch (const std::exception&) {
    return nullptr;
  }
}

// The encoder output of the batch (sum of src_len rows x C, sentences in order)
// into out, which holds cap floats; the number of floats written, or -1
// (nothing written) if they do not fit.  A drafter that shares the verifier's
// encoder reads it (GAD with a --shared-encoder drafter).
int64_t fa_encoder_out(void* sp, float* out, int64_t cap) {
  const State& st = state(sp);
  if ((int64_t)st.enc_out.size() > cap) return -1;
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

}  // extern "C"
#pragma GCC visibility pop
