// A linear layer's weights packed into the panels its kernels read
// (linear.h: float32, float16 or int8 with per-row scales), and a layer of
// some of another's rows (a shortlist's output projection).
#include <algorithm>
#include <vector>

#include "cpu/linear.h"

namespace fa {

namespace {

template <typename T>
void pack_into(LineVector<T>& dst, const T* W, int n, int k, int P) {
  dst.assign((size_t)P * k * PANEL, T(0));
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < k; ++c) dst[((size_t)(r / PANEL) * k + c) * PANEL + r % PANEL] = W[(size_t)r * k + c];
}

}  // namespace

void Linear::pack(const float* W, const uint16_t* Wh, const float* bias, int n, int k) {
  std::vector<float> widened;
  if (Wh != nullptr && !kVectorISA) {  // (float16 storage pays only where one instruction widens a
    // vector of halves; the generic code would convert every weight of every pass, so it widens them once here)
    widened.resize((size_t)n * k);
    for (size_t i = 0; i < widened.size(); ++i) widened[i] = half_to_float(Wh[i]);
    W = widened.data();
    Wh = nullptr;
  }
  N = n;
  K = k;
  P = (n + PANEL - 1) / PANEL;
  q8 = false;
  half = Wh != nullptr;
  if (half) {
    pack_into(wh, Wh, n, k, P);
    w.clear();
  } else {
    pack_into(w, W, n, k, P);
    wh.clear();
  }
  b.assign(n, 0.f);
  if (bias) std::copy(bias, bias + n, b.begin());
  has_bias = bias != nullptr;
}

void Linear::pack_q8(const int8_t* Wq, const float* scale, const float* bias, int n, int k) {
  N = n;
  K = k;
  P = (n + PANEL - 1) / PANEL;
  q8 = true;
  half = false;
  w.clear();
  wh.clear();
  wq.assign((size_t)P * KG() * PANEL * Q8_GROUP, 0);
  wsum.assign((size_t)P * PANEL, 0);
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < k; ++c) {
      wq[q8_index(r, c)] = Wq[(size_t)r * k + c];
      wsum[r] += Wq[(size_t)r * k + c];
    }
  ws.assign((size_t)P * PANEL, 0.f);
  std::copy(scale, scale + n, ws.begin());
  b.assign(n, 0.f);
  if (bias) std::copy(bias, bias + n, b.begin());
  has_bias = bias != nullptr;
}

void gather_rows(const Linear& src, const int32_t* ids, int n, Linear& dst) {
  const int K = src.K;
  std::vector<float> bias(n);
  for (int i = 0; i < n; ++i) bias[i] = src.b[ids[i]];
  const float* bp = src.has_bias ? bias.data() : nullptr;
  if (src.q8) {
    std::vector<int8_t> q((size_t)n * K);
    std::vector<float> scale(n);
    for (int i = 0; i < n; ++i) {
      const int r = ids[i];
      for (int c = 0; c < K; ++c) q[(size_t)i * K + c] = src.wq[src.q8_index(r, c)];
      scale[i] = src.ws[r];
    }
    dst.pack_q8(q.data(), scale.data(), bp, n, K);
  } else if (src.half) {
    std::vector<uint16_t> wh((size_t)n * K);
    for (int i = 0; i < n; ++i)
      for (int c = 0; c < K; ++c)
        wh[(size_t)i * K + c] = src.wh[((size_t)(ids[i] / PANEL) * K + c) * PANEL + ids[i] % PANEL];
    dst.pack(nullptr, wh.data(), bp, n, K);
  } else {
    std::vector<float> w((size_t)n * K);
    for (int i = 0; i < n; ++i)
      for (int c = 0; c < K; ++c)
        w[(size_t)i * K + c] = src.w[((size_t)(ids[i] / PANEL) * K + c) * PANEL + ids[i] % PANEL];
    dst.pack(w.data(), nullptr, bp, n, K);
  }
}

}  // namespace fa
