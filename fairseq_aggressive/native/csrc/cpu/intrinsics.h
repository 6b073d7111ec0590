// The compiler's x86 intrinsics.  GCC 11 and 12 report "'__Y' may be used
// uninitialized" inside their own headers wherever an intrinsic starts from an
// undefined vector (_mm512_cvtepi32_epi8, _mm512_castps512_ps256, ...), a
// false alarm that GCC 13 no longer gives.  The warning is silenced for the
// headers' lines only: the engine's own code keeps it.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
