// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the tuning file (optimized/tuning.hpp, SPEC §11.3):
// the input is the file's JSON text, a NUL byte, then the bytes of a base
// Geometry (one byte per field, in the order of geometry_of below; missing
// bytes read 0).
//
// parse_tuning must return or throw tandem::Error — never crash, hang,
// overflow or throw anything else. A parsed tuning must
//  - write back (to_json) to a file that parses to the same tuning;
//  - hold each class once, with D >= 1 and a rows_per_tile from the
//    tuner's space of its kind;
//  - change, for each of its classes, only the bit-neutral rows_per_tile of
//    the base geometry: every other field, Geometry::invariant among them,
//    is the base's; a class it does not hold runs at the base geometry.
// load_tuning reads a file and calls parse_tuning, so this is its parser.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tandem/error.hpp"
#include "tandem/optimized/tuning.hpp"

namespace {

using namespace tandem::optimized;

/// A geometry from the bytes after the NUL: any values, valid or not (the
/// tuning never validates its base, it only copies it).
Geometry geometry_of(const std::uint8_t* data, std::size_t size) {
  std::size_t pos = 0;
  const auto next = [&]() -> std::int64_t { return pos < size ? data[pos++] : 0; };
  Geometry g;
  g.key_block = next() * 17;
  g.edge_block = next();
  g.rows_per_tile = next() * 5;
  g.rows_per_tile_banded = next() * 3;
  g.decode_tiles = static_cast<DecodeTiles>(next() % 3);
  g.split_keys_chunk = next() << 6;
  g.split_keys_min_chunks = next();
  g.split_keys_contiguous_heads = next();
  g.split_keys_step = next();
  g.backward_min_tasks = next();
  g.backward_query_parts = next();
  g.invariant = (next() & 1) != 0;
  return g;
}

/// Every field of a and b but rows_per_tile is the same.
bool same_but_rows(const Geometry& a, const Geometry& b) {
  return a.key_block == b.key_block && a.edge_block == b.edge_block &&
         a.rows_per_tile_banded == b.rows_per_tile_banded && a.decode_tiles == b.decode_tiles &&
         a.split_keys_chunk == b.split_keys_chunk &&
         a.split_keys_min_chunks == b.split_keys_min_chunks &&
         a.split_keys_contiguous_heads == b.split_keys_contiguous_heads &&
         a.split_keys_step == b.split_keys_step && a.backward_min_tasks == b.backward_min_tasks &&
         a.backward_query_parts == b.backward_query_parts && a.invariant == b.invariant;
}

bool same_tuning(const Tuning& a, const Tuning& b) {
  if (!(a.cpu == b.cpu) || a.classes.size() != b.classes.size()) return false;
  for (std::size_t i = 0; i < a.classes.size(); ++i) {
    if (!(a.classes[i].cls == b.classes[i].cls) || !(a.classes[i].fields == b.classes[i].fields)) {
      return false;
    }
  }
  return true;
}

void check(const Tuning& t, const Geometry& base) {
  for (std::size_t i = 0; i < t.classes.size(); ++i) {
    const TunedClass& c = t.classes[i];
    if (c.cls.D < 1 || t.find(c.cls) != &c.fields) std::abort();  // D >= 1, each class once
    const Geometry g = t.geometry(c.cls, base);
    if (!same_but_rows(g, base)) std::abort();
    if (c.fields.rows_per_tile) {
      const auto space = tuning_space(c.cls.kind).rows_per_tile;
      if (std::find(space.begin(), space.end(), *c.fields.rows_per_tile) == space.end() ||
          g.rows_per_tile != *c.fields.rows_per_tile) {
        std::abort();
      }
    } else if (g.rows_per_tile != base.rows_per_tile) {
      std::abort();
    }
  }
  // a class the file does not hold (no D is 0) runs at the base geometry
  const Geometry none = t.geometry(ShapeClass{ShapeKind::prefill, 0}, base);
  if (!same_but_rows(none, base) || none.rows_per_tile != base.rows_per_tile) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto* nul = static_cast<const std::uint8_t*>(std::memchr(data, 0, size));
  const std::size_t text_len = nul ? static_cast<std::size_t>(nul - data) : size;
  const std::string text(reinterpret_cast<const char*>(data), text_len);
  const std::size_t rest = nul ? text_len + 1 : size;
  const Geometry base = geometry_of(data + rest, size - rest);
  Tuning t;
  try {
    t = parse_tuning(text, "fuzz.json");
  } catch (const tandem::Error&) {
    return 0;
  }
  check(t, base);
  // what it writes parses back to the same tuning (a throw here is a crash)
  if (!same_tuning(parse_tuning(to_json(t), "written.json"), t)) std::abort();
  return 0;
}
