// The engine's results on fixed inputs, as bits: one line per check, a hash of
// every output byte (FNV-1a) beside a few values.  Built for each target (the
// x86 generic one, aarch64's neon and generic) by scripts/arm/check_bits.py,
// run natively or under qemu-user, and the lines compared: every target must
// give the same bits (fairseq_aggressive/native/csrc/cpu/vec.h).
//
// Checks: the linear layers (float32, float16 weights, int8) by rows 1..13 on
// 1 and 2 threads; the row reductions (logsumexp, argmax); a small random model
// (float32, float16 and int8 weights) decoded greedily and with IAD's copy
// drafts (the copy source: its own greedy output with edits, so drafts are
// accepted and rejected), tokens and scores.
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "loop/running_batch.h"
#include "model/weights.h"

extern "C" {
const char* fa_isa();
void* fa_model_new(const fa::Config* cfg);
const char* fa_new_error();
int fa_set_weight(void* mp, const char* name, int layer, int dtype, const void* data, int rows, int cols);
int fa_model_build(void* mp);
const char* fa_model_error(void* mp);
void fa_model_free(void* mp);
int fa_set_threads(void* mp, int n);
void* fa_begin(void* mp, int B, const int32_t* tokens, const int32_t* src_len, int cap);
void fa_state_free(void* sp);
int fa_decode(void* mp, void* sp, void* dp, void* ds, const fa::RunSettings* s, const int32_t* copy,
              const int32_t* copy_len, int max_len, const fa::StaticOutput* out, fa::RunStats* stats);
int fa_test_linear(int threads, int kind, int N, int K, int M, const void* W, const float* scale, const float* bias,
                   const float* x, float* y);
int fa_test_row_reductions(int n, const float* x, float* lse, int* arg, float* ref_lse, int* ref_arg);
}

namespace {

struct Rng {  // a 64-bit linear congruential generator: the same numbers everywhere
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 6364136223846793005ULL + 1442695040888963407ULL) {}
  uint32_t next() {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(s >> 33);
  }
  float uniform(float a) { return a * ((float)(next() & 0xffffff) / 8388608.f - 1.f); }  // [-a, a)
};

uint64_t fnv(const void* p, size_t n, uint64_t h = 1469598103934665603ULL) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ULL;
  return h;
}

// IEEE half of a float (round to nearest even; normal range only, as these weights are)
uint16_t to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  int e = (int)((x >> 23) & 0xff) - 127 + 15;
  uint32_t man = x & 0x7fffffu;
  if (e <= 0) return (uint16_t)sign;  // (tiny: zero)
  uint32_t h = sign | ((uint32_t)e << 10) | (man >> 13);
  const uint32_t rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return (uint16_t)h;
}

int failures = 0;

void linear_checks() {
  const int N = 27, K = 42;  // a partial panel of outputs, k not a multiple of 4
  for (int kind = 0; kind < 3; ++kind) {
    Rng r(100 + kind);
    std::vector<float> w((size_t)N * K), bias(N), scale(N);
    for (float& v : w) v = r.uniform(0.5f);
    for (float& v : bias) v = r.uniform(0.1f);
    for (float& v : scale) v = 0.002f + (r.next() % 1000) * 1e-5f;
    std::vector<uint16_t> wh(w.size());
    std::vector<int8_t> wq(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      wh[i] = to_half(w[i]);
      wq[i] = (int8_t)((int)(r.next() % 255) - 127);
    }
    const void* W = kind == 0 ? (const void*)w.data() : kind == 1 ? (const void*)wh.data() : (const void*)wq.data();
    for (int threads = 1; threads <= 2; ++threads)
      for (int M : {1, 2, 3, 5, 7, 9, 13}) {
        std::vector<float> x((size_t)M * K), y((size_t)M * N);
        for (float& v : x) v = r.uniform(1.f);
        if (fa_test_linear(threads, kind, N, K, M, W, scale.data(), bias.data(), x.data(), y.data()) != 0) {
          std::printf("linear kind %d threads %d rows %d: FAILED\n", kind, threads, M);
          ++failures;
          continue;
        }
        std::printf("linear kind %d threads %d rows %d: %016" PRIx64 " y[0] %a\n", kind, threads, M,
                    fnv(y.data(), y.size() * 4), (double)y[0]);
      }
  }
}

void reduction_checks() {
  for (int n : {1, 7, 8, 9, 31, 64, 100, 1000}) {
    Rng r(200 + n);
    std::vector<float> x(n);
    for (float& v : x) v = r.uniform(8.f);
    float lse, ref_lse;
    int arg, ref_arg;
    if (fa_test_row_reductions(n, x.data(), &lse, &arg, &ref_lse, &ref_arg) != 0) {
      std::printf("reductions n %d: FAILED\n", n);
      ++failures;
      continue;
    }
    std::printf("reductions n %d: lse %a argmax %d (reference %a %d)\n", n, (double)lse, arg, (double)ref_lse, ref_arg);
  }
}

// A small random pre-norm Transformer: C 32, 4 heads, FFN 64, 2 + 2 layers, 60 types
struct Model {
  fa::Config cfg{};
  void* h = nullptr;
  int dtype;  // of the linear weights: 0 float32, 1 float16, 2 int8
  Rng r;

  explicit Model(int dtype_) : dtype(dtype_), r(300 + dtype_) {
    cfg.C = 32;
    cfg.H = 4;
    cfg.F = 64;
    cfg.enc_layers = 2;
    cfg.dec_layers = 2;
    cfg.src_vocab = cfg.tgt_vocab = 60;
    cfg.enc_normalize_before = cfg.dec_normalize_before = 1;
    cfg.act = fa::kRelu;
    cfg.pad = 1;
    cfg.unk = 3;
    cfg.eos = 2;
    cfg.enc_embed_scale = cfg.dec_embed_scale = 5.656854f;  // sqrt(32)
    cfg.ln_eps = 1e-5f;
    cfg.enc_dim = 32;
    h = fa_model_new(&cfg);
    if (!h) throw std::string("fa_model_new: ") + fa_new_error();
    for (const char* side : {"encoder", "decoder"}) {
      const std::string s(side);
      put(s + ".embed_tokens.weight", -1, 60, 32, 1.f);
      put(s + ".embed_positions.weight", -1, 64, 32, 1.f);
      norm(s + ".layer_norm", -1);
      for (int l = 0; l < 2; ++l) {
        std::vector<std::string> attns = {"self_attn"};
        if (s == "decoder") attns.push_back("encoder_attn");
        for (const std::string& a : attns) {
          for (const char* p : {"q_proj", "k_proj", "v_proj", "out_proj"}) linear(s + ".layers." + a + "." + p, l, 32, 32);
          norm(s + ".layers." + a + "_layer_norm", l);
        }
        linear(s + ".layers.fc1", l, 64, 32);
        linear(s + ".layers.fc2", l, 32, 64);
        norm(s + ".layers.final_layer_norm", l);
      }
    }
    linear("decoder.output_projection", -1, 60, 32, false);
    if (fa_model_build(h) != 0) throw std::string("fa_model_build: ") + fa_model_error(h);
  }
  ~Model() { fa_model_free(h); }

  void set(const std::string& name, int layer, int dt, const void* data, int rows, int cols) {
    if (fa_set_weight(h, name.c_str(), layer, dt, data, rows, cols) != 0)
      throw name + ": " + fa_model_error(h);
  }
  void put(const std::string& name, int layer, int rows, int cols, float a) {
    std::vector<float> v((size_t)rows * cols);
    for (float& x : v) x = r.uniform(a);
    set(name, layer, fa::F32, v.data(), rows, cols);
  }
  void norm(const std::string& name, int layer) {
    std::vector<float> w(32), b(32);
    for (int i = 0; i < 32; ++i) {
      w[i] = 1.f + r.uniform(0.2f);
      b[i] = r.uniform(0.1f);
    }
    set(name + ".weight", layer, fa::F32, w.data(), 32, 1);
    set(name + ".bias", layer, fa::F32, b.data(), 32, 1);
  }
  void linear(const std::string& name, int layer, int out, int in, bool bias = true) {
    const float a = 1.5f / std::sqrt((float)in);
    std::vector<float> w((size_t)out * in);
    for (float& x : w) x = r.uniform(a);
    if (dtype == 2) {
      std::vector<int8_t> q(w.size());
      std::vector<float> scale(out, a / 127.f);
      for (size_t i = 0; i < w.size(); ++i) q[i] = (int8_t)std::lround(w[i] / (a / 127.f));
      set(name + ".weight", layer, fa::I8, q.data(), out, in);
      set(name + ".scale", layer, fa::F32, scale.data(), out, 1);
    } else if (dtype == 1) {
      std::vector<uint16_t> hw(w.size());
      for (size_t i = 0; i < w.size(); ++i) hw[i] = to_half(w[i]);
      set(name + ".weight", layer, fa::F16, hw.data(), out, in);
    } else {
      set(name + ".weight", layer, fa::F32, w.data(), out, in);
    }
    if (bias) {
      std::vector<float> b(out);
      for (float& x : b) x = r.uniform(0.1f);
      set(name + ".bias", layer, fa::F32, b.data(), out, 1);
    }
  }

  // Decodes the sentences with copy drafts from `copy` (max_draft 0: greedy); tokens and scores per sentence
  void decode(const std::vector<std::vector<int32_t>>& src, const std::vector<std::vector<int32_t>>& copy,
              int max_draft, int threads, std::vector<std::vector<int32_t>>& toks,
              std::vector<std::vector<float>>& scores) {
    const int B = (int)src.size(), max_len = 24;
    if (fa_set_threads(h, threads) != 0) throw std::string("fa_set_threads");
    std::vector<int32_t> flat, len, cflat, clen;
    for (int b = 0; b < B; ++b) {
      flat.insert(flat.end(), src[b].begin(), src[b].end());
      len.push_back((int32_t)src[b].size());
      cflat.insert(cflat.end(), copy[b].begin(), copy[b].end());
      clen.push_back((int32_t)copy[b].size());
    }
    void* st = fa_begin(h, B, flat.data(), len.data(), max_len + 1);
    if (!st) throw std::string("fa_begin: ") + fa_model_error(h);
    std::vector<int32_t> out_tokens((size_t)B * (max_len + 1)), out_len(B), passes(B);
    std::vector<float> out_scores(out_tokens.size());
    fa::RunSettings a{};
    a.drafter = max_draft == 0 ? "greedy" : "copy";
    a.first = cfg.eos;
    a.budget = 0;
    a.min_len = 1;
    a.unk_penalty = 0.f;
    a.temperature = 1.f;
    a.beta = 1;
    a.tau = 0.f;
    a.draft.max_draft = max_draft;
    a.draft.ngram_min = 1;
    a.draft.ngram_max = 4;
    const fa::StaticOutput out{max_len + 1, out_tokens.data(), out_scores.data(), out_len.data(), passes.data()};
    fa::RunStats stats{};
    const int rc = fa_decode(h, st, nullptr, nullptr, &a, cflat.data(), clen.data(), max_len, &out, &stats);
    fa_state_free(st);
    if (rc != 0) throw std::string("fa_decode: ") + fa_model_error(h);
    toks.assign(B, {});
    scores.assign(B, {});
    for (int b = 0; b < B; ++b) {
      const size_t o = (size_t)b * (max_len + 1);
      toks[b].assign(out_tokens.begin() + o, out_tokens.begin() + o + out_len[b]);
      scores[b].assign(out_scores.begin() + o, out_scores.begin() + o + out_len[b]);
    }
  }
};

void model_checks() {
  const std::vector<std::vector<int32_t>> src = {
      {12, 7, 33, 41, 9, 2}, {5, 18, 18, 27, 50, 44, 31, 2}, {59, 4, 22, 2}, {40, 41, 42, 43, 44, 45, 46, 47, 2}};
  for (int dtype = 0; dtype < 3; ++dtype) {
    try {
      Model m(dtype);
      for (int threads = 1; threads <= 2; ++threads) {
        std::vector<std::vector<int32_t>> greedy, iad;
        std::vector<std::vector<float>> gs, is;
        m.decode(src, src, 0, threads, greedy, gs);
        // the copy source: greedy's own output with every third token changed
        std::vector<std::vector<int32_t>> edited = greedy;
        for (auto& t : edited)
          for (size_t i = 2; i < t.size(); i += 3) t[i] = 4 + (t[i] + 7) % 50;
        m.decode(src, edited, 4, threads, iad, is);
        uint64_t hg = 1469598103934665603ULL, hi = hg;
        for (size_t b = 0; b < src.size(); ++b) {
          hg = fnv(greedy[b].data(), greedy[b].size() * 4, fnv(gs[b].data(), gs[b].size() * 4, hg));
          hi = fnv(iad[b].data(), iad[b].size() * 4, fnv(is[b].data(), is[b].size() * 4, hi));
        }
        const bool same = greedy == iad && gs == is;
        std::printf("model dtype %d threads %d greedy: %016" PRIx64 " (%zu tokens in sentence 0)\n", dtype, threads, hg,
                    greedy[0].size());
        std::printf("model dtype %d threads %d iad: %016" PRIx64 " equals greedy: %s\n", dtype, threads, hi,
                    same ? "yes" : "NO");
        if (!same) ++failures;
      }
    } catch (const std::string& e) {
      std::printf("model dtype %d: FAILED (%s)\n", dtype, e.c_str());
      ++failures;
    }
  }
}

}  // namespace

int main() {
  std::fprintf(stderr, "engine target %s\n", fa_isa());
  linear_checks();
  reduction_checks();
  model_checks();
  return failures == 0 ? 0 : 1;
}
