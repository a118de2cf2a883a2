// SPDX-License-Identifier: Apache-2.0
/// @file optimized/convert.hpp
/// @brief The optimized backend's per-target conversions between float32
///        and the storage types bfloat16 and float16 (SPEC §10.1), over whole
///        arrays: what its kernels load, store and round with, exposed so
///        that tests can compare them with tandem/storage.hpp's scalar
///        conversions on every Highway target (force_target()).
///
/// They run on the target dynamic dispatch picks now, on one thread; each
/// array is walked in full vectors and a last partial vector, so both the
/// full-vector and the partial-vector code of the target are exercised. Not
/// kernel entry points: they check only that the sizes agree (tandem::Error).
/// For every value that is not a NaN they give the bits of storage.hpp's
/// conversions; a NaN gives a NaN (sign and payload are not specified).
#pragma once

#include <span>

#include "tandem/storage.hpp"

namespace tandem::optimized {

/// out[i] = x[i] as float32 (exact), by the widening loads (LoadWide,
/// LoadWideN). T is bfloat16 or float16.
template <class T>
void convert_widen(std::span<const T> x, std::span<float> out);
/// out[i] = RN_T(x[i]), by the rounding stores (StoreRounded, StoreRoundedN).
template <class T>
void convert_round(std::span<const float> x, std::span<T> out);
/// out[i] = RN_T(x[i]) as float32, by the round trip in a register
/// (RoundAs, a rounding point inside a tile).
template <class T>
void convert_round_trip(std::span<const float> x, std::span<float> out);
/// x0[i] = x[2i], x1[i] = x[2i+1] as float32, by the deinterleaving widening
/// load of GPT-J and axial RoPE pairs (LoadWideInterleaved2); x has 2n values.
template <class T>
void convert_widen_pairs(std::span<const T> x, std::span<float> x0, std::span<float> x1);
/// out[2i] = RN_T(y0[i]), out[2i+1] = RN_T(y1[i]), by the interleaving
/// rounding store (StoreRoundedInterleaved2); out has 2n values.
template <class T>
void convert_round_pairs(std::span<const float> y0, std::span<const float> y1, std::span<T> out);

}  // namespace tandem::optimized
