// A beam hypothesis's self-attention cache slot (a Sentence whose encoder keys
// and values are its sentence's): grown as the hypothesis grows, copied when
// a parent's second child starts from it.
#pragma once

#include "model/decoder.h"

namespace fa {

// room for `need` positions in slot h (the positions written kept), at most `most`
void fit_slot(const Decoder& m, Sentence& h, int need, int most);

// slot `to` holds the first n positions of slot `from` (its own room at most `most`)
void copy_slot(const Decoder& m, const Sentence& from, Sentence& to, int n, int most);

}  // namespace fa
