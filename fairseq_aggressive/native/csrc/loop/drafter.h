// What proposes the tokens a running batch's pass verifies: a drafter, one
// C++ type behind one interface, made by name from one table (drafter.cpp).
//
// The loop (running_batch.h) owns the rows, their outputs and the verifier's
// caches; a drafter keeps what it needs per row, by the row's slot.  Per pass
// the loop asks it for every active row's draft (propose), verifies them, and
// tells it what each row emitted and how many drafted tokens were accepted
// (learn).  A drafter only decides what a pass verifies, never what it
// emits: every drafter's output is greedy's.
//
// A new drafter: its own .cpp with a class derived from Drafter and a factory,
// one line in the table of drafter.cpp, and its settings in DrafterSettings
// where it needs new ones (mirrored in c_api.py).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loop/counters.h"
#include "loop/draft_lengths.h"
#include "model/decoder.h"

namespace fa {

// Every drafter's settings, each reading its own (mirrored by DrafterSettings in c_api.py)
struct DrafterSettings {
  int32_t max_draft;             // the longest draft a pass verifies (-1: no cap)
  int32_t ngram_min, ngram_max;  // copy: the output suffixes that re-anchor a copy after a rejection
  // feature, nar: a --feature-ar or GAD block drafter (a second decoder)
  // drafting up to k tokens per pass while bos, the output and the draft fit
  // its room positions; feature: each draft ending after its first token
  // below min_prob (0: off); shared_encoder: its rows start from the
  // verifier's encoder output (else its own encoder's)
  int32_t bos, k, room;
  float min_prob;
  int32_t shared_encoder;
  // nar: a causal-prefix drafter (its prefix cached across passes; else bidirectional)
  int32_t causal;
};

// Rows that join at once: their slots, the verifier's state they were
// encoded into (their encoder output: enc.enc_out, rows concatenated), their
// source ids (tokens, src_len[i] each; null where the caller encoded them),
// their copy sources (target ids, copy_len[i] each), the verifier's cache
// positions per row, and (or null) a drafter state the caller began for them
// (sentence i its row i)
struct Joining {
  int n;
  const int32_t* slot;
  const State& enc;
  const int32_t* tokens;
  const int32_t* src_len;
  const int32_t* copy;
  const int32_t* copy_len;
  int cap;
  State* given;
};

// The active rows before a pass, in the pass's order: each one's slot, its
// output so far, the most tokens it may draft (its length limit and the cap)
// and the confidence class of its last token (Acceptance::confidence)
struct PassRows {
  int n;
  const int32_t* slot;
  std::vector<const std::vector<int32_t>*> out;
  std::vector<int> room, conf;
};

// A pass's drafts: per row its length and its tokens (valid until learn),
// what the draft-length policy saw of each (for its acceptance estimates),
// and whether the drafter worked this pass (for the policy's check)
struct Drafts {
  std::vector<int> len;
  std::vector<const int32_t*> tokens;
  std::vector<DraftCandidate> cand;
  bool drafted = false;
};

// A verified pass, per row in the pass's order: its slot, its first position
// among the pass's positions (rows concatenated: the last token, then the
// draft), its drafted and accepted tokens, the tokens it emitted and whether
// it ended; the chosen tokens and (reads_features) the verifier's features
// that chose them (feat_width floats each) by position
struct Verified {
  int n;
  const int32_t* slot;
  const int32_t* offset;
  const int32_t* drafted;
  const int32_t* accepted;
  const int32_t* n_emit;
  const int32_t* done;
  const int32_t* choice;
  const float* feats;
  int feat_width;
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  // whether it drafts at all (greedy search does not: no draft-length policy)
  virtual bool drafts() const { return true; }
  // whether learn needs the verifier's features of the emitted tokens
  virtual bool reads_features() const { return false; }
  // -1 if this drafter cannot draft for verifier m (its decoder does not
  // read m's features, the model has no proposal heads), else 0
  virtual int check(const Decoder&) const { return 0; }
  virtual void join(Decoder& m, const Joining& j) = 0;
  // a row left (finished, taken or dropped): what the drafter kept of it goes
  virtual void leave(int slot) = 0;
  // this pass's drafts (lengths chosen by policy, or null: as made)
  virtual void propose(Decoder& m, const PassRows& rows, DraftPolicy* policy, Drafts& out) = 0;
  // after the pass (rows that ended included: done)
  virtual void learn(Decoder& m, State& st, const Verified& v, RunStats& stats) = 0;
};

// The drafter registered as `name` ("greedy", "copy", "feature", "blockwise", "nar"),
// with `own` its decoder where it has one (feature, nar); null if no drafter has
// that name; throws std::invalid_argument for settings it cannot use
std::unique_ptr<Drafter> make_drafter(const std::string& name, const DrafterSettings& s, Decoder* own);

// The factories the table of drafter.cpp lists (each in its drafter's file)
std::unique_ptr<Drafter> make_greedy_drafter(const DrafterSettings& s, Decoder* own);
std::unique_ptr<Drafter> make_copy_drafter(const DrafterSettings& s, Decoder* own);
std::unique_ptr<Drafter> make_feature_drafter(const DrafterSettings& s, Decoder* own);
std::unique_ptr<Drafter> make_blockwise_drafter(const DrafterSettings& s, Decoder* own);
std::unique_ptr<Drafter> make_nar_drafter(const DrafterSettings& s, Decoder* own);

// (a drafter with a decoder of its own: feature, nar) the joining rows' slots
// in its state st (grown to hold them): moved from the drafter state the
// caller began for them (j.given), else made here from its own encoder, or
// from the verifier's encoder output where shared_encoder (or no source ids
// were given), with `extra` cache positions beyond the verifier's
void join_own_decoder(Decoder& dm, State& st, const Joining& j, int extra, bool shared_encoder);

// (blockwise) the proposal heads of a transformer_blockwise model over n
// sentences sent[r] from their feature rows x (C floats each): m.w.n_heads
// tokens each at out[r * n_heads + j] (each the argmax of its logits over the
// sentence's columns, pad excluded).  0, or -1 if the model has no heads.
int heads_pass(Decoder& m, State& st, int n, const int32_t* sent, const float* x, int32_t* out);

}  // namespace fa
