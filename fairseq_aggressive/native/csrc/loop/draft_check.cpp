// The draft-length policy's check on whole passes (Realized, realized_pass:
// see draft_lengths.h).
#include <algorithm>
#include <chrono>

#include "loop/draft_lengths.h"

namespace fa {

namespace {

// the most a pass counts in the check on whole passes, in times its cost in the table (realized_pass)
constexpr double kRealizedClamp = 3.0;

}  // namespace

#if defined(FA_TEST_HOOKS)
// fa_set_drafted_pass_delay, fa_set_realized_check (testing/test_api.cpp): a drafted pass that
// takes longer than the cost table knows, as on a loaded CPU; the check on or off
int drafted_pass_delay_us = 0;
bool realized_check = true;
#endif

bool Realized::drafts(int rows, bool model_drafts) {
  if (!model_drafts) return false;
  const int c = rows_class(rows, kClasses);
  if (passes_[0][c] < kMinPasses || passes_[1][c] < kMinPasses)  // both sides measured first
    return passes_[1][c] <= passes_[0][c];
  const bool better = drafted_better(c);
  if (++turn_[c] >= kExplore) {
    turn_[c] = 0;
    return !better;
  }
  return better;
}

bool Realized::may_draft(int rows) const {
#if defined(FA_TEST_HOOKS)
  if (!realized_check) return true;  // the check off: the model's choice, with its rows' confidences
#endif
  const int c = rows_class(rows, kClasses);
  if (passes_[0][c] < kMinPasses || passes_[1][c] < kMinPasses) return true;
  return drafted_better(c) || turn_[c] + 1 >= kExplore;
}

void Realized::observe(int rows, bool drafted, int tokens, double ms, double greedy_ms, double carried_ms) {
  if (!(ms > 0) || !(greedy_ms > 0) || rows <= 0) return;
  const int c = rows_class(rows, kClasses), d = drafted ? 1 : 0;
  double t = ms / greedy_ms;
  if (drafted) {
    t += carried_[c];
    carried_[c] = 0;
  } else {
    carried_[c] += std::max(0.0, carried_ms) / greedy_ms;
    // confidences summed for drafts that do not come (the model declines to draft these rows): once
    // they add up to a greedy pass, they count against drafting as that much more time for no more
    // tokens, else a drafted side measured before would keep them summed on every pass
    if (carried_[c] >= 1.0) {
      time_[1][c] += carried_[c];
      carried_[c] = 0;
    }
  }
  tokens_[d][c] = tokens_[d][c] * kKeep + double(tokens) / rows;
  time_[d][c] = time_[d][c] * kKeep + t;
  passes_[d][c] += 1;
}

void realized_pass(DraftPolicy* policy, int rows, int positions, bool drafted, int tokens,
                   std::chrono::steady_clock::time_point began, std::chrono::steady_clock::time_point pass_began,
                   double drafting_ms, double confidences_ms) {
  if (policy == nullptr) return;
#if defined(FA_TEST_HOOKS)
  if (drafted && drafted_pass_delay_us > 0) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(drafted_pass_delay_us);
    while (std::chrono::steady_clock::now() < until) {
    }
  }
#endif
  using Ms = std::chrono::duration<double, std::milli>;
  const auto now = std::chrono::steady_clock::now();
  // the pass counts at most kRealizedClamp times what the cost table expects of it: a pass the OS
  // interrupted (a millisecond where a pass takes 0.05) would otherwise outweigh dozens of others
  // (a drafted one: drafting off for thousands of passes); a lasting change moves the table itself
  const double pass = std::min(Ms(now - pass_began).count(), kRealizedClamp * policy->cost.ms(positions));
  const double spent = Ms(pass_began - began).count() + pass - (drafted ? 0.0 : std::max(0.0, drafting_ms));
  policy->realized.observe(rows, drafted, tokens, std::max(spent, 0.01 * pass), policy->cost.ms(rows),
                           drafted ? 0.0 : std::min(confidences_ms, pass));
}

}  // namespace fa
