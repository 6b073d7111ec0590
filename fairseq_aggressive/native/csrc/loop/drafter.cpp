// The table of the engine's drafters (see drafter.h), and greedy search's:
// no draft at all.
#include "loop/drafter.h"

#include <stdexcept>

namespace fa {

namespace {

using Factory = std::unique_ptr<Drafter> (*)(const DrafterSettings&, Decoder*);

struct Registered {
  const char* name;
  Factory make;
};

// every in-engine drafter, by the name the Python side hands over
const Registered kDrafters[] = {
    {"greedy", make_greedy_drafter},
    {"copy", make_copy_drafter},
    {"feature", make_feature_drafter},
    {"blockwise", make_blockwise_drafter},
    {"nar", make_nar_drafter},
};

class GreedyDrafter : public Drafter {
 public:
  bool drafts() const override { return false; }
  void join(Decoder&, const Joining&) override {}
  void leave(int) override {}
  void propose(Decoder&, const PassRows& rows, DraftPolicy*, Drafts& out) override {
    out.len.assign(rows.n, 0);
    out.tokens.assign(rows.n, nullptr);
    out.cand.assign(rows.n, DraftCandidate{0, false, 0});
    out.drafted = false;
  }
  void learn(Decoder&, State&, const Verified&, RunStats&) override {}
};

}  // namespace

std::unique_ptr<Drafter> make_greedy_drafter(const DrafterSettings&, Decoder*) {
  return std::make_unique<GreedyDrafter>();
}

void join_own_decoder(Decoder& dm, State& st, const Joining& j, int extra, bool shared_encoder) {
  std::unique_ptr<State> made;
  State* from = j.given;
  if (from == nullptr) {
    const int cap = j.cap + extra;
    made.reset(shared_encoder || j.tokens == nullptr
                   ? state_from_encoder_out(dm, j.n, j.enc.enc_out.data(), j.src_len, cap)
                   : encode(dm, j.n, j.tokens, j.src_len, cap));
    from = made.get();
  } else {
    st.shortlist = from->shortlist;
  }
  for (int i = 0; i < j.n; ++i) {
    const int slot = j.slot[i];
    if (slot >= (int)st.sents.size()) st.sents.resize(slot + 1);
    st.sents[slot] = std::move(from->sents[i]);
    from->sents[i] = Sentence();  // (cap 0: used up)
  }
}

std::unique_ptr<Drafter> make_drafter(const std::string& name, const DrafterSettings& s, Decoder* own) {
  if (s.max_draft < -1) throw std::invalid_argument("drafter: max_draft below -1");
  for (const Registered& r : kDrafters)
    if (name == r.name) return r.make(s, own);
  return nullptr;
}

}  // namespace fa
