// What the translation units of the C API share (c_api.cpp, c_api_decode.cpp):
// handles to objects, and the guard that turns a C++ exception into the
// model's error and a failure code instead of letting it cross into Python.
#pragma once

#include <exception>
#include <stdexcept>

#include "model/decoder.h"

namespace fa::capi {

inline Decoder& model(void* mp) { return *static_cast<Decoder*>(mp); }
inline State& state(void* sp) { return *static_cast<State*>(sp); }

// Runs a call that decodes: an exception (a lost completion in the pool, memory
// exhausted) becomes the model's error and `failed` instead of crossing into Python.
template <class R, class F>
R guarded(void* mp, R failed, F&& call) {
  try {
    return call();
  } catch (const std::exception& e) {
    model(mp).error = e.what();
  } catch (...) {
    model(mp).error = "unknown C++ exception";
  }
  return failed;
}

// The weights of m for a call that changes them: refused (an exception, so the
// call's error) once another decoder reads them
inline Weights& weights_to_change(Decoder& m) {
  if (m.weights_shared()) throw std::logic_error("the weights are shared with another decoder (fa_model_share): they no longer change");
  return *m.shared;
}

// The size of a decoding loop's argument or counter struct named `name`
// (c_api_decode.cpp, beside the loops' entry points), -1 if none: fa_sizeof's
// answer for them
int decode_struct_size(const char* name);

}  // namespace fa::capi
