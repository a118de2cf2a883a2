// SPDX-License-Identifier: Apache-2.0
/// @file optimized/tuning.hpp
/// @brief Tuned geometries of the optimized attention (SPEC §11): per
///        shape class, the fields of Geometry that change speed but never a
///        bit, chosen on one CPU by `tandem tune` and loaded from a small
///        JSON file (by load_tuning or the TANDEM_TUNING variable).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/attention_plan.hpp"
#include "tandem/optimized/options.hpp"

namespace tandem::optimized {

/// The kind of an attention call a tuned geometry is for.
enum class ShapeKind {
  prefill,   ///< a forward whose Sq·G query rows per kv head exceed 16
  decode,    ///< a forward of at most 16 such rows (one vector of rows)
  backward,  ///< any backward
};
/// "prefill", "decode", "backward".
std::string to_string(ShapeKind kind);

/// The class of one call: its kind and its head width D.
struct ShapeClass {
  ShapeKind kind = ShapeKind::prefill;  ///< prefill, decode or backward
  std::int64_t D = 0;                   ///< the head width of q and k
  /// Equal kinds and widths.
  friend bool operator==(const ShapeClass&, const ShapeClass&) = default;
};
/// The class of a forward (`backward` false) or backward call of `plan`:
/// prefill when plan.Sq·plan.group() > 16, else decode.
ShapeClass shape_class(const AttentionPlan& plan, bool backward);

/// The CPU a tuning was made on: cpuid's vendor, family, model and brand
/// string (empty and 0 off x86) and the Highway target dispatch picks (the
/// binary's best, unless TANDEM_TARGET or force_target() chose another).
struct CpuIdentity {
  std::string vendor;       ///< cpuid's vendor string ("AuthenticAMD")
  std::string brand;        ///< cpuid's brand string
  std::string target;       ///< the Highway target dispatch picks ("AVX2")
  std::int64_t family = 0;  ///< cpuid's display family
  std::int64_t model = 0;   ///< cpuid's display model
  /// The same CPU and target.
  friend bool operator==(const CpuIdentity&, const CpuIdentity&) = default;
};
/// This CPU's identity.
CpuIdentity current_cpu();
/// "AuthenticAMD family 25 model 1 (AMD EPYC ...), AVX2".
std::string to_string(const CpuIdentity& cpu);

/// The bit-neutral fields of Geometry, each a value or unset (the Options'
/// geometry then stands). Only rows_per_tile is one: a forward's wide tile
/// holds one query row per lane and visits every row's keys in the same
/// blocks whatever the tile's size (unbanded masks: every block starts at a
/// multiple of key_block), and with at least 64 rows per tile a tile of
/// more than one query row never becomes a decode tile (at most 16 rows per
/// vector here). Not neutral, hence never tuned by default: key_block and
/// edge_block (the blocks of the online softmax), rows_per_tile_banded
/// (where a causal edge starts the edge blocks depends on the tile), the
/// split-key fields (chunks and steps are key ranges of their own) and the
/// backward's (dK/dV sums over tiles and query parts), and rows_per_tile
/// in the backward (the same sums).
struct TunedFields {
  std::optional<std::int64_t> rows_per_tile;  ///< Geometry::rows_per_tile, or unset
  /// The same fields set to the same values.
  friend bool operator==(const TunedFields&, const TunedFields&) = default;
};
/// `base` with the set fields of `t`.
Geometry apply(const TunedFields& t, Geometry base);

/// The values the tuner tries per field for a class (empty: the class has
/// no bit-neutral field to tune): rows_per_tile in {64, 96, ..., 1024} for
/// prefill, nothing for decode (one query per tile whatever the size) and
/// backward.
struct TuningSpace {
  std::vector<std::int64_t> rows_per_tile;  ///< candidates for rows_per_tile
  /// Whether there is nothing to try.
  bool empty() const { return rows_per_tile.empty(); }
};
/// The tuner's space for calls of kind `kind` (spec §11.2).
TuningSpace tuning_space(ShapeKind kind);

/// One tuned class.
struct TunedClass {
  ShapeClass cls;      ///< the calls it is for
  TunedFields fields;  ///< their tuned fields
};

/// A tuning file's content: the CPU it was made on and its classes.
struct Tuning {
  CpuIdentity cpu;                  ///< the CPU and target it was tuned on
  std::vector<TunedClass> classes;  ///< the tuned classes, one entry each
  /// The fields for `cls`, or null when the tuning has none.
  const TunedFields* find(const ShapeClass& cls) const;
  /// The geometry a call of class `cls` runs at: `base` with its fields.
  Geometry geometry(const ShapeClass& cls, const Geometry& base) const;
};

/// The JSON text of `t` (format 1: {"format": 1, "cpu": {...}, "classes":
/// [{"kind", "D", "rows_per_tile"}]}).
std::string to_json(const Tuning& t);
/// Writes to_json(t) to `path`; throws Error when it cannot.
void save_tuning(const Tuning& t, const std::string& path);
/// Parses a tuning file. Throws Error naming the file and the field when it
/// is unreadable or malformed (an unknown field included: a geometry field
/// that reorders float operations is refused, not ignored).
Tuning parse_tuning(const std::string& text, const std::string& path);
/// The tuning of `path` when it was made on this CPU and target; for
/// another one prints one line on stderr naming the file and both CPUs and
/// returns nothing (the defaults stand). Throws as parse_tuning.
std::optional<Tuning> load_tuning(const std::string& path);
/// The tuning TANDEM_TUNING names, loaded once per process (null when the
/// variable is unset or empty, or the file is for another CPU).
std::shared_ptr<const Tuning> environment_tuning();

}  // namespace tandem::optimized
