// Beam hypotheses' cache slots (see beam_slots.h).
#include "beam/beam_slots.h"

#include <algorithm>

namespace fa {

void fit_slot(const Decoder& m, Sentence& h, int need, int most) {
  if (need <= h.cap) return;
  const int nl = (int)m.w.dec.size(), H = m.cfg.H, D = m.D;
  const int cap = std::min(std::max(need, std::max(16, 2 * h.cap)), most);
  CacheVector k((size_t)nl * H * cap * D), v((size_t)nl * H * cap * D);  // (unset beyond the copied positions)
  for (int l = 0; l < nl; ++l)
    for (int hh = 0; hh < H; ++hh) {
      const size_t from = kv_at(l, hh, 0, H, h.cap, D), to = kv_at(l, hh, 0, H, cap, D);
      std::copy(h.self_k.begin() + from, h.self_k.begin() + from + (size_t)h.len * D, k.begin() + to);
      std::copy(h.self_v.begin() + from, h.self_v.begin() + from + (size_t)h.len * D, v.begin() + to);
    }
  h.self_k.swap(k);
  h.self_v.swap(v);
  h.cap = cap;
}

void copy_slot(const Decoder& m, const Sentence& from, Sentence& to, int n, int most) {
  fit_slot(m, to, n, most);
  const int nl = (int)m.w.dec.size(), H = m.cfg.H, D = m.D;
  for (int l = 0; l < nl; ++l)
    for (int hh = 0; hh < H; ++hh) {
      const size_t a = kv_at(l, hh, 0, H, from.cap, D), z = kv_at(l, hh, 0, H, to.cap, D);
      std::copy(from.self_k.begin() + a, from.self_k.begin() + a + (size_t)n * D, to.self_k.begin() + z);
      std::copy(from.self_v.begin() + a, from.self_v.begin() + a + (size_t)n * D, to.self_v.begin() + z);
    }
  to.len = n;
}

}  // namespace fa
