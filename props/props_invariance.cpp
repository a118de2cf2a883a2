// SPDX-License-Identifier: Apache-2.0
// Properties of batch-invariant inference (SPEC §12): a query row's out and
// lse, and a sequence's dq, dk and dv, are bitwise the same however the call
// around it is shaped — the Sq of the call (a prefill, a decode step, a
// chunk of a chunked prefill against the same keys, bottom-right causal),
// the batch it is in, packed sequences or separate calls, a paged cache or
// the same keys contiguous, and the backend's geometry and threads. Each
// property compares bits, at one storage type (float32, bfloat16 or
// float16) and on one SIMD target. They run on the subjects that promise it
// (Subject::invariant): the reference, the scalar fixtures and the
// optimized backend with Geometry::invariant set.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <numeric>
#include <optional>
#include <sstream>

#include "checks.hpp"
#include "lowp.hpp"

namespace tandem::props {
namespace {

/// The storage type of every call of a case (SPEC §10.1).
enum class Storage { f32, bf16, f16 };
const char* to_string(Storage s) {
  return s == Storage::f32 ? "f32" : s == Storage::bf16 ? "bf16" : "f16";
}

/// What every sequence of every call of a case shares: heads, widths,
/// mask, scale, softcap, sinks (their values too), whether ALiBi is on, the
/// storage type, and the seed of the data.
struct Shared {
  i64 H = 1, Hkv = 1, D = 1, Dv = 1;
  MaskKind mask = MaskKind::none;
  i64 window = 0;
  std::optional<double> scale;
  double softcap = 0.0;
  bool alibi = false;
  std::vector<float> sinks;  ///< [H], empty without sinks
  double qk_mag = 1.0;       ///< q and k uniform in [−qk_mag, qk_mag]
  Storage storage = Storage::f32;
  std::uint64_t seed = 0;

  [[nodiscard]] bool banded() const { return mask != MaskKind::none; }
  [[nodiscard]] std::string describe() const {
    std::ostringstream os;
    os << "H=" << H << " Hkv=" << Hkv << " D=" << D << " Dv=" << Dv << " mask=" << to_string(mask);
    if (mask == MaskKind::sliding_window) os << "(" << window << ")";
    if (scale) os << " scale=" << *scale;
    if (softcap > 0) os << " softcap=" << softcap;
    if (!sinks.empty()) os << " sinks";
    if (alibi) os << " alibi";
    os << " qk_mag=" << qk_mag << " " << to_string(storage) << " seed=" << seed;
    return os.str();
  }
};

/// Draws the shared options: GQA groups of 1, 2 or 4, widths up to 24,
/// every mask kind without an input (none, causal, sliding window), sinks,
/// ALiBi and softcap sometimes, one call in five in bfloat16 and in float16.
Shared draw_shared() {
  Shared s;
  s.Hkv = *rc::gen::inRange<i64>(1, 3);
  s.H = s.Hkv * *rc::gen::element<i64>(1, 2, 4);
  s.D = *rc::gen::inRange<i64>(1, 25);
  s.Dv = *rc::gen::arbitrary<bool>() ? s.D : *rc::gen::inRange<i64>(1, 25);
  s.mask = *rc::gen::element(MaskKind::none, MaskKind::causal, MaskKind::sliding_window);
  if (s.mask == MaskKind::sliding_window) {
    s.window = *rc::gen::oneOf(rc::gen::inRange<i64>(0, 9), rc::gen::inRange<i64>(0, 200),
                               rc::gen::inRange<i64>(0, 2500));
  }
  if (*rc::gen::inRange(0, 4) == 0) s.scale = *rc::gen::element(0.05, 0.5, 1.3);
  if (*rc::gen::inRange(0, 4) == 0) s.softcap = *rc::gen::element(0.7, 5.0, 30.0);
  s.alibi = *rc::gen::inRange(0, 4) == 0;
  s.qk_mag = *rc::gen::element(0.5, 1.0, 3.0);
  s.storage =
      *rc::gen::element(Storage::f32, Storage::f32, Storage::f32, Storage::bf16, Storage::f16);
  s.seed = *rc::gen::inRange<std::uint64_t>(0, 1u << 30);
  if (*rc::gen::inRange(0, 4) == 0) {
    Rng r(s.seed ^ 0x5eedu);
    s.sinks = r.values(static_cast<std::size_t>(s.H), 2.0);
  }
  return s;
}

/// Keys of a sequence: mostly up to 200 (several 64-key blocks), one in
/// six from 900 to 3100 (across the 1024-key chunks; half of them from 2048,
/// two chunks or more, where split-key decode starts).
i64 draw_keys() {
  if (*rc::gen::inRange(0, 6) == 0) {
    return *rc::gen::oneOf(rc::gen::inRange<i64>(900, 2048), rc::gen::inRange<i64>(2048, 3101));
  }
  return *rc::gen::inRange<i64>(1, 201);
}

/// Queries of a sequence of `Sk` keys: up to 40 (16 against a long cache),
/// at most Sk under a band so that every query has a key of its own.
i64 draw_queries(const Shared& o, i64 Sk) {
  i64 cap = Sk > 256 ? 16 : 40;
  if (o.banded()) cap = std::min(cap, Sk);
  return *rc::gen::inRange<i64>(1, cap + 1);
}

/// One sequence's logical data: q `[Sq,H,D]`, k `[Sk,Hkv,D]`, v
/// `[Sk,Hkv,Dv]`, dout `[Sq,H,Dv]` and its ALiBi slopes `[H]`.
struct Seq {
  i64 Sq = 0, Sk = 0;
  std::vector<float> q, k, v, dout, slopes;
};

Seq make_seq(const Shared& o, i64 Sq, i64 Sk, std::uint64_t stream) {
  Rng r(o.seed * 1000003u + stream);
  Seq s;
  s.Sq = Sq;
  s.Sk = Sk;
  s.q = r.values(static_cast<std::size_t>(Sq * o.H * o.D), o.qk_mag);
  s.k = r.values(static_cast<std::size_t>(Sk * o.Hkv * o.D), o.qk_mag);
  s.v = r.values(static_cast<std::size_t>(Sk * o.Hkv * o.Dv), 1.0);
  s.dout = r.values(static_cast<std::size_t>(Sq * o.H * o.Dv), 1.0);
  for (i64 h = 0; h < o.H; ++h) s.slopes.push_back(static_cast<float>(r.uniform(0.0, 0.3)));
  return s;
}

/// Queries [q0, q0 + nq) of s against its first nk keys.
Seq sub_seq(const Shared& o, const Seq& s, i64 q0, i64 nq, i64 nk) {
  const auto rows = [](const std::vector<float>& t, i64 first, i64 count, i64 width) {
    return std::vector<float>(t.begin() + first * width, t.begin() + (first + count) * width);
  };
  Seq e;
  e.Sq = nq;
  e.Sk = nk;
  e.q = rows(s.q, q0, nq, o.H * o.D);
  e.dout = rows(s.dout, q0, nq, o.H * o.Dv);
  e.k = rows(s.k, 0, nk, o.Hkv * o.D);
  e.v = rows(s.v, 0, nk, o.Hkv * o.Dv);
  e.slopes = s.slopes;
  return e;
}

using Seqs = std::vector<const Seq*>;

AttentionParams base_params(const Shared& o, i64 sequences) {
  AttentionParams e;
  e.H = o.H;
  e.Hkv = o.Hkv;
  e.D = o.D;
  e.Dv = o.Dv;
  e.mask = o.mask;
  e.window = o.window;
  e.scale = o.scale;
  e.softcap = o.softcap;
  e.sinks = !o.sinks.empty();
  if (o.alibi) e.alibi = sequences == 1 ? AlibiKind::per_head : AlibiKind::per_batch_head;
  return e;
}

void append(std::vector<float>& to, const std::vector<float>& t) {
  to.insert(to.end(), t.begin(), t.end());
}

/// The data of a call of `e` over `seqs`, the sinks and slopes filled in.
AttentionData call_data(const Shared& o, const AttentionParams& e, const Seqs& seqs) {
  AttentionData d;
  d.plan = AttentionPlan::make(e);
  d.sinks = o.sinks;
  if (o.alibi) {
    for (const Seq* s : seqs) append(d.slopes, s->slopes);
  }
  return d;
}

/// One dense call: the sequences (all of one Sq and Sk) as batch entries.
AttentionData dense_call(const Shared& o, const Seqs& seqs) {
  AttentionParams e = base_params(o, static_cast<i64>(seqs.size()));
  e.B = static_cast<i64>(seqs.size());
  e.Sq = seqs[0]->Sq;
  e.Sk = seqs[0]->Sk;
  AttentionData d = call_data(o, e, seqs);
  for (const Seq* s : seqs) {
    append(d.q, s->q);
    append(d.k, s->k);
    append(d.v, s->v);
    append(d.dout, s->dout);
  }
  return d;
}

/// One packed call (SPEC §2.9): sequence n in a key slot of its Sk keys and
/// pads[n] more (random keys no query may read), with seqused_k when `used`.
AttentionData packed_call(const Shared& o, const Seqs& seqs, const std::vector<i64>& pads,
                          bool used, std::uint64_t stream) {
  Rng r(o.seed * 7919u + stream);
  AttentionParams e = base_params(o, static_cast<i64>(seqs.size()));
  e.num_seqs = static_cast<i64>(seqs.size());
  std::vector<i64> cu_q{0}, cu_k{0}, seqused;
  for (std::size_t n = 0; n < seqs.size(); ++n) {
    cu_q.push_back(cu_q.back() + seqs[n]->Sq);
    cu_k.push_back(cu_k.back() + seqs[n]->Sk + (used ? pads[n] : 0));
    seqused.push_back(seqs[n]->Sk);
  }
  e.Sq = cu_q.back();
  e.Sk = cu_k.back();
  AttentionData d = call_data(o, e, seqs);
  for (std::size_t n = 0; n < seqs.size(); ++n) {
    const Seq& s = *seqs[n];
    append(d.q, s.q);
    append(d.dout, s.dout);
    append(d.k, s.k);
    append(d.v, s.v);
    if (used) {
      append(d.k, r.values(static_cast<std::size_t>(pads[n] * o.Hkv * o.D), 1.0));
      append(d.v, r.values(static_cast<std::size_t>(pads[n] * o.Hkv * o.Dv), 1.0));
    }
  }
  d.cu_q = cu_q;
  d.cu_k = cu_k;
  if (used) d.used = seqused;
  d.index64 = (stream & 1u) != 0;
  return d;
}

/// One paged call (SPEC §2.10): the sequences (all of one Sq) as batch
/// entries whose keys sit in shuffled blocks of `block_size` slots, `spare`
/// blocks and the unused slots holding random keys, spare table entries −1
/// or any block.
AttentionData paged_call(const Shared& o, const Seqs& seqs, i64 block_size, i64 spare,
                         std::uint64_t stream) {
  Rng r(o.seed * 104729u + stream);
  const i64 B = static_cast<i64>(seqs.size());
  i64 used_blocks = 0, max_blocks = 1;
  for (const Seq* s : seqs) {
    const i64 n = (s->Sk + block_size - 1) / block_size;
    used_blocks += n;
    max_blocks = std::max(max_blocks, n);
  }
  max_blocks += r.index(2);
  AttentionParams e = base_params(o, B);
  e.B = B;
  e.Sq = seqs[0]->Sq;
  e.num_blocks = used_blocks + spare;
  e.block_size = block_size;
  e.max_blocks = max_blocks;
  e.Sk = max_blocks * block_size;
  AttentionData d = call_data(o, e, seqs);
  std::vector<i64> blocks(static_cast<std::size_t>(e.num_blocks));
  std::iota(blocks.begin(), blocks.end(), 0);
  for (std::size_t i = blocks.size(); i > 1; --i) {
    std::swap(blocks[i - 1], blocks[static_cast<std::size_t>(r.index(static_cast<i64>(i)))]);
  }
  d.k = r.values(static_cast<std::size_t>(e.num_blocks * block_size * o.Hkv * o.D), 1.0);
  d.v = r.values(static_cast<std::size_t>(e.num_blocks * block_size * o.Hkv * o.Dv), 1.0);
  std::size_t next = 0;
  for (i64 b = 0; b < B; ++b) {
    const Seq& s = *seqs[b];
    append(d.q, s.q);
    append(d.dout, s.dout);
    d.lens.push_back(s.Sk);
    const i64 n = (s.Sk + block_size - 1) / block_size;
    for (i64 t = 0; t < max_blocks; ++t) {
      d.table.push_back(t < n ? blocks[next++] : (r.coin(0.5) ? -1 : r.index(e.num_blocks)));
    }
    for (i64 j = 0; j < s.Sk; ++j) {
      const i64 slot = d.table[b * max_blocks + j / block_size] * block_size + j % block_size;
      std::copy_n(s.k.begin() + j * o.Hkv * o.D, o.Hkv * o.D, d.k.begin() + slot * o.Hkv * o.D);
      std::copy_n(s.v.begin() + j * o.Hkv * o.Dv, o.Hkv * o.Dv, d.v.begin() + slot * o.Hkv * o.Dv);
    }
  }
  d.index64 = (stream & 1u) != 0;
  return d;
}

// ------------------------------------------------------------------ results

/// A sequence's rows of one call: out `[Sq,H,Dv]` of attention_forward_lse
/// and of attention_forward, lse `[Sq,H]`; the gradients dq `[Sq,H,D]`, dk
/// `[Sk,Hkv,D]`, dv `[Sk,Hkv,Dv]` (its own keys only). Values as stored
/// (a bfloat16 or float16 exactly as a double).
struct Rows {
  std::vector<double> out, out_plain, lse;
  std::vector<double> dq, dk, dv;
};

/// out (of forward_lse and of forward) and lse of a call as logical
/// tensors, at the case's storage type.
struct Whole {
  std::vector<double> out, out_plain, lse;
};
template <class T>
Whole forward_whole(const Backend& be, const AttentionData& d) {
  const AttentionPlan& p = d.plan;
  Whole w;
  if constexpr (std::is_same_v<T, float>) {
    const Saved s = run_forward_lse(be, d);
    w.out = to_double(gather<float>(p.o, p.B, p.Sq, p.H, p.Dv, std::span<const float>(s.out)));
    w.lse = to_double(s.lse);
    w.out_plain = to_double(run_forward(be, d));
  } else {
    const AttentionData st = stored_as<T>(d);
    w.out = run_forward_t<T>(be.kernels<T>(), st, &w.lse);
    w.out_plain = run_forward_t<T>(be.kernels<T>(), st);
  }
  return w;
}

template <class T>
Grads backward_whole(const Backend& be, const AttentionData& d) {
  if constexpr (std::is_same_v<T, float>) {
    return run_backward(be, d, Want{true, true, true, false});
  } else {
    return run_backward_t<T>(be.kernels<T>(), stored_as<T>(d));
  }
}

template <class T>
std::vector<Rows> rows_at(const Backend& be, const AttentionData& d, bool forward, bool backward) {
  const AttentionPlan& p = d.plan;
  Whole w;
  if (forward) w = forward_whole<T>(be, d);
  Grads g;
  if (backward) g = backward_whole<T>(be, d);
  const Sequences seqs(d);
  std::vector<Rows> out(static_cast<std::size_t>(seqs.size()));
  for (i64 n = 0; n < seqs.size(); ++n) {
    const AttentionSeq s = seqs[n];
    Rows& r = out[static_cast<std::size_t>(n)];
    for (i64 i = 0; i < s.Sq; ++i) {
      const i64 row = (s.b * p.Sq + s.q_row(i)) * p.H;
      for (i64 h = 0; h < p.H; ++h) {
        if (forward) r.lse.push_back(w.lse[p.lse_at(s.b, h, s.q_row(i))]);
        for (i64 e = 0; forward && e < p.Dv; ++e) {
          r.out.push_back(w.out[(row + h) * p.Dv + e]);
          r.out_plain.push_back(w.out_plain[(row + h) * p.Dv + e]);
        }
        for (i64 e = 0; backward && e < p.D; ++e) r.dq.push_back(g.dq[(row + h) * p.D + e]);
      }
    }
    for (i64 j = 0; backward && j < s.Sk; ++j) {
      const KeyRow kr = s.key_row(j);
      const i64 key = (kr.batch * p.kv_seq() + kr.seq) * p.Hkv;
      for (i64 e = 0; e < p.Hkv * p.D; ++e) r.dk.push_back(g.dk[key * p.D + e]);
      for (i64 e = 0; e < p.Hkv * p.Dv; ++e) r.dv.push_back(g.dv[key * p.Dv + e]);
    }
  }
  return out;
}

/// The rows of every sequence of the call d (whose sequences are in order):
/// the forward's, and the gradients when `backward` (not for a paged
/// cache), without the forward's when `forward` is false.
std::vector<Rows> rows_of(const Backend& be, const Shared& o, const AttentionData& d,
                          bool backward = false, bool forward = true) {
  switch (o.storage) {
    case Storage::bf16:
      return rows_at<bfloat16>(be, d, forward, backward);
    case Storage::f16:
      return rows_at<float16>(be, d, forward, backward);
    default:
      return rows_at<float>(be, d, forward, backward);
  }
}

/// Empty when a and b hold the same bits, else where they first differ:
/// element i of a tensor of rows of `heads` × `width`, as (row, head, e).
std::string bits_differ(const std::string& what, std::span<const double> a,
                        std::span<const double> b, i64 heads, i64 width, i64 row0 = 0) {
  if (a.size() != b.size()) return what + ": sizes differ";
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<std::uint64_t>(a[i]) == std::bit_cast<std::uint64_t>(b[i])) continue;
    const i64 n = static_cast<i64>(i);
    std::ostringstream os;
    os.precision(9);
    os << what << " differs at row " << row0 + n / (heads * width) << ", head "
       << (n / width) % heads << ", element " << n % width << ": " << a[i] << " vs " << b[i];
    return os.str();
  }
  return {};
}

/// Rows [first, first + got's rows) of `whole` against `got`, forward only.
std::string forward_differs(const Shared& o, const std::string& what, const Rows& got,
                            const Rows& whole, i64 first = 0) {
  const auto part = [&](const std::vector<double>& t, i64 width) {
    const i64 n = static_cast<i64>(got.lse.size()) / o.H;
    return std::span<const double>(t).subspan(static_cast<std::size_t>(first * o.H * width),
                                              static_cast<std::size_t>(n * o.H * width));
  };
  std::string m = bits_differ(what + ": out", got.out, part(whole.out, o.Dv), o.H, o.Dv, first);
  if (m.empty()) {
    m = bits_differ(what + ": out of attention_forward", got.out_plain, part(whole.out_plain, o.Dv),
                    o.H, o.Dv, first);
  }
  if (m.empty()) m = bits_differ(what + ": lse", got.lse, part(whole.lse, 1), o.H, 1, first);
  return m;
}

/// A sequence's dq, dk and dv against another call's.
std::string backward_differs(const Shared& o, const std::string& what, const Rows& a,
                             const Rows& b) {
  std::string m = bits_differ(what + ": dq", a.dq, b.dq, o.H, o.D);
  if (m.empty()) m = bits_differ(what + ": dk (key rows)", a.dk, b.dk, o.Hkv, o.D);
  if (m.empty()) m = bits_differ(what + ": dv (key rows)", a.dv, b.dv, o.Hkv, o.Dv);
  return m;
}

/// Fails with the case and the difference unless `m` is empty.
void require_same(const std::string& label, const std::string& m) {
  if (!m.empty()) RC_FAIL(label + "\n" + m);
}

/// " (Sq=…, Sk=…)" of a sequence, appended to a case's label.
std::string seq_label(const Seq& s) {
  std::string l = " (Sq=";
  l += std::to_string(s.Sq);
  l += ", Sk=";
  l += std::to_string(s.Sk);
  l += ")";
  return l;
}

// --------------------------------------------------------------- properties

/// Each chunk of a chunked prefill — decode steps of one to four queries
/// among them — against the keys up to its last query gives the bits of
/// those rows of the whole prefill (bottom-right causal: query t of either
/// call sits at key position t). Without a band every call keeps all the
/// keys, and with ALiBi only the last chunk keeps its queries' positions.
void decode_equals_prefill(const Backend& be) {
  const Shared o = draw_shared();
  const i64 N = draw_keys(), P = draw_queries(o, N);
  const Seq whole = make_seq(o, P, N, 0);
  const Rows pre = rows_of(be, o, dense_call(o, {&whole}))[0];
  const i64 longest = *rc::gen::element<i64>(1, 2, 4, P);
  std::string label = o.describe() + "; prefill" + seq_label(whole) + ", chunks";
  for (i64 a = 0; a < P;) {
    const i64 c = *rc::gen::inRange<i64>(1, std::min(longest, P - a) + 1);
    label += ' ';
    label += std::to_string(c);
    const bool positions_kept = o.banded() || !o.alibi || a + c == P;
    if (positions_kept) {
      const Seq part = sub_seq(o, whole, a, c, o.banded() ? N - P + a + c : N);
      const Rows got = rows_of(be, o, dense_call(o, {&part}))[0];
      require_same(label, forward_differs(o,
                                          "chunk of queries from " + std::to_string(a) +
                                              seq_label(part) + " vs the prefill's rows",
                                          got, pre, a));
    }
    a += c;
  }
}

/// How a sequence is put among others.
enum class Form { dense, packed, paged };
const char* to_string(Form f) {
  return f == Form::dense ? "dense batch" : f == Form::packed ? "packed" : "paged";
}

/// `count` other sequences beside a target of `Sq` queries and `Sk` keys:
/// of the same shapes (`same`), of the same Sq (`same_sq`) or of any.
std::vector<Seq> others(const Shared& o, i64 count, i64 Sq, i64 Sk, bool same, bool same_sq) {
  std::vector<Seq> v;
  for (i64 n = 0; n < count; ++n) {
    i64 sk = Sk, sq = Sq;
    if (!same) {
      sk = *rc::gen::inRange<i64>(same_sq && o.banded() ? Sq : 1, 151 + Sq);
      if (!same_sq) sq = draw_queries(o, sk);
    }
    v.push_back(make_seq(o, sq, sk, static_cast<std::uint64_t>(n + 1)));
  }
  return v;
}

/// The target at a random position among `rest`.
std::pair<Seqs, std::size_t> with_target(const Seq& target, const std::vector<Seq>& rest) {
  Seqs all;
  for (const Seq& s : rest) all.push_back(&s);
  const auto at = static_cast<std::size_t>(*rc::gen::inRange<std::size_t>(0, all.size() + 1));
  all.insert(all.begin() + static_cast<std::ptrdiff_t>(at), &target);
  return {all, at};
}

/// Random key padding of each slot of a packed call (0 to 70 keys each).
std::vector<i64> draw_pads(std::size_t n) {
  std::vector<i64> pads;
  for (std::size_t i = 0; i < n; ++i) pads.push_back(*rc::gen::inRange<i64>(0, 71));
  return pads;
}

i64 draw_block_size() {
  return *rc::gen::element<i64>(1, 2, 3, 5, 16, 63, 64, 65, 128, 1000);
}

/// s without its first `drop` keys: a cache that has dropped its oldest.
Seq without_first_keys(const Shared& o, const Seq& s, i64 drop) {
  const auto from = [](const std::vector<float>& t, i64 first, i64 width) {
    return std::vector<float>(t.begin() + first * width, t.end());
  };
  Seq e = s;
  e.Sk = s.Sk - drop;
  e.k = from(s.k, drop, o.Hkv * o.D);
  e.v = from(s.v, drop, o.Hkv * o.Dv);
  return e;
}

/// A cache that has dropped its oldest `drop` keys, called with key_origin
/// = drop (as a dense call, one packed sequence or a paged cache), gives
/// the bits of the whole cache's rows, whose sliding window hides the
/// dropped keys from every query: the invariant order's blocks and chunks
/// are counted from the sequence's start, wherever its key 0 sits (SPEC
/// §12.1). The drop crosses 64-key blocks and 1024-key chunks, and a decode
/// step (one query) against a cache of 2048 keys or more takes split-key
/// decode, whose chunks and steps are counted from key_origin too.
void origin_invariant(const Backend& be) {
  Shared o = draw_shared();
  o.mask = MaskKind::sliding_window;
  // windows past 2048 keys: a decode step against the cache takes split-key decode
  o.window = *rc::gen::oneOf(rc::gen::inRange<i64>(0, 130), rc::gen::inRange<i64>(0, 2300),
                             rc::gen::inRange<i64>(2050, 4200));
  const i64 P = *rc::gen::element<i64>(1, 1, 2, *rc::gen::inRange<i64>(1, 17));
  const i64 drop = *rc::gen::oneOf(rc::gen::inRange<i64>(1, 130), rc::gen::inRange<i64>(1, 2100));
  const i64 N = P + o.window + drop + *rc::gen::inRange<i64>(0, 40);
  const Seq whole = make_seq(o, P, N, 0);
  const Seq kept = without_first_keys(o, whole, drop);
  const Form form = *rc::gen::element(Form::dense, Form::packed, Form::paged);
  AttentionData d = form == Form::dense    ? dense_call(o, {&kept})
                    : form == Form::packed ? packed_call(o, {&kept}, draw_pads(1), false, 2)
                                           : paged_call(o, {&kept}, draw_block_size(), 1, 3);
  d.origin = {drop};
  const std::string label = o.describe() + "; " + to_string(form) + " cache of" + seq_label(kept) +
                            " from key_origin " + std::to_string(drop) + " vs the whole" +
                            seq_label(whole);
  require_same(label, forward_differs(o, "without its first keys vs whole", rows_of(be, o, d)[0],
                                      rows_of(be, o, dense_call(o, {&whole}))[0]));
}

/// A sequence alone gives the bits it gives in a batch of random others:
/// a dense batch of its shapes, packed among sequences of other lengths
/// (with seqused_k padding sometimes), or a paged batch whose caches have
/// other lengths (against the sequence alone in the same paged form).
void batch_invariant(const Backend& be) {
  const Shared o = draw_shared();
  const i64 N = draw_keys(), P = draw_queries(o, N);
  const Seq target = make_seq(o, P, N, 0);
  const Form form = *rc::gen::element(Form::dense, Form::packed, Form::paged);
  const auto rest =
      others(o, *rc::gen::inRange<i64>(1, 4), P, N, form == Form::dense, form == Form::paged);
  const auto [all, at] = with_target(target, rest);
  std::string label = o.describe() + "; target" + seq_label(target) + " at " + std::to_string(at) +
                      " of a " + to_string(form) + " call of";
  for (const Seq* s : all) label += seq_label(*s);
  Rows alone, got;
  if (form == Form::dense) {
    alone = rows_of(be, o, dense_call(o, {&target}))[0];
    got = rows_of(be, o, dense_call(o, all))[at];
  } else if (form == Form::packed) {
    const bool used = *rc::gen::arbitrary<bool>();
    const auto pads = draw_pads(all.size());
    label += used ? " with seqused_k" : "";
    alone = rows_of(be, o, dense_call(o, {&target}))[0];
    got = rows_of(be, o, packed_call(o, all, pads, used, 1))[at];
  } else {
    const i64 bs = draw_block_size();
    label += ", block size " + std::to_string(bs);
    alone = rows_of(be, o, paged_call(o, {&target}, bs, 0, 2))[0];
    got = rows_of(be, o, paged_call(o, all, bs, *rc::gen::inRange<i64>(0, 3), 3))[at];
  }
  require_same(label, forward_differs(o, "in the batch vs alone", got, alone));
}

/// Packed sequences (cu_seqlens, seqused_k padding sometimes) give the bits
/// of one dense call per sequence.
void packed_equals_separate(const Backend& be) {
  const Shared o = draw_shared();
  const i64 n = *rc::gen::inRange<i64>(1, 6);
  std::vector<Seq> seqs;
  for (i64 s = 0; s < n; ++s) {
    const i64 sk = s == 0 ? draw_keys() : *rc::gen::inRange<i64>(1, 201);
    seqs.push_back(make_seq(o, draw_queries(o, sk), sk, static_cast<std::uint64_t>(s)));
  }
  Seqs all;
  for (const Seq& s : seqs) all.push_back(&s);
  const bool used = *rc::gen::arbitrary<bool>();
  std::string label = o.describe() + "; packed" + (used ? " with seqused_k:" : ":");
  for (const Seq& s : seqs) label += seq_label(s);
  const auto packed = rows_of(be, o, packed_call(o, all, draw_pads(all.size()), used, 4));
  for (i64 s = 0; s < n; ++s) {
    const Rows alone = rows_of(be, o, dense_call(o, {all[s]}))[0];
    require_same(label, forward_differs(o, "sequence " + std::to_string(s) + " packed vs alone",
                                        packed[s], alone));
  }
}

/// A paged cache (any block size, a shuffled block table, spare blocks)
/// gives the bits of the same keys contiguous, batch entry by batch entry.
void paged_equals_contiguous(const Backend& be) {
  const Shared o = draw_shared();
  const i64 B = *rc::gen::inRange<i64>(1, 4);
  const i64 N0 = draw_keys(), P = draw_queries(o, N0);
  std::vector<Seq> seqs{make_seq(o, P, N0, 0)};
  for (auto& s : others(o, B - 1, P, N0, false, true)) seqs.push_back(std::move(s));
  Seqs all;
  for (const Seq& s : seqs) all.push_back(&s);
  const i64 bs = draw_block_size();
  std::string label = o.describe() + "; paged, block size " + std::to_string(bs) + ":";
  for (const Seq& s : seqs) label += seq_label(s);
  const auto paged = rows_of(be, o, paged_call(o, all, bs, *rc::gen::inRange<i64>(0, 3), 5));
  for (i64 b = 0; b < B; ++b) {
    const Rows contiguous = rows_of(be, o, dense_call(o, {all[b]}))[0];
    require_same(label,
                 forward_differs(o, "batch entry " + std::to_string(b) + " paged vs contiguous",
                                 paged[b], contiguous));
  }
}

/// A call drawn in any form, and its data.
struct AnyCall {
  std::vector<Seq> seqs;
  AttentionData d;
  std::string label;
};
AnyCall draw_any_call(const Shared& o) {
  AnyCall c;
  const Form form = *rc::gen::element(Form::dense, Form::packed, Form::paged);
  const i64 N = draw_keys(), P = draw_queries(o, N);
  c.seqs.push_back(make_seq(o, P, N, 0));
  for (auto& s :
       others(o, *rc::gen::inRange<i64>(0, 3), P, N, form == Form::dense, form == Form::paged)) {
    c.seqs.push_back(std::move(s));
  }
  Seqs all;
  for (const Seq& s : c.seqs) all.push_back(&s);
  c.label = o.describe() + "; a " + std::string(to_string(form)) + " call of";
  for (const Seq& s : c.seqs) c.label += seq_label(s);
  if (form == Form::dense) {
    c.d = dense_call(o, all);
  } else if (form == Form::packed) {
    c.d = packed_call(o, all, draw_pads(all.size()), *rc::gen::arbitrary<bool>(), 6);
  } else {
    const i64 bs = draw_block_size();
    c.label += ", block size " + std::to_string(bs);
    c.d = paged_call(o, all, bs, *rc::gen::inRange<i64>(0, 3), 7);
  }
  return c;
}

/// The subject's bits on a call in any form (and the gradients, but of a
/// paged cache) equal those of the same backend at a random other geometry
/// with invariant set — split-key decode forced on and off, other key
/// blocks, tiles, decode tiles and backward parts — at 1 to 3 threads
/// (Subject::invariant_variant; a subject without one: a thread variant).
void geometry_invariant(const Subject& s) {
  const Shared o = draw_shared();
  const AnyCall c = draw_any_call(o);
  std::pair<Backend, std::string> other;
  if (s.invariant_variant) {
    other = s.invariant_variant();
  } else {
    const auto t = *rc::gen::inRange<std::size_t>(0, s.thread_variants.size());
    other = {s.thread_variants[t], "thread variant " + std::to_string(t)};
  }
  const bool backward = !c.d.plan.paged();
  const auto a = rows_of(s.backend, o, c.d, backward);
  const auto b = rows_of(other.first, o, c.d, backward);
  const std::string label = c.label + "; against " + other.second;
  for (std::size_t n = 0; n < a.size(); ++n) {
    const std::string what = "sequence " + std::to_string(n);
    require_same(label, forward_differs(o, what, b[n], a[n]));
    if (backward) require_same(label, backward_differs(o, what, b[n], a[n]));
  }
}

/// A sequence's dq, dk and dv alone give the bits they give in a dense
/// batch of its shapes or packed among others (seqused_k padding sometimes).
void backward_batch_invariant(const Backend& be) {
  const Shared o = draw_shared();
  const i64 N = draw_keys(), P = draw_queries(o, N);
  const Seq target = make_seq(o, P, N, 0);
  const bool dense = *rc::gen::arbitrary<bool>();
  const auto rest = others(o, *rc::gen::inRange<i64>(1, 4), P, N, dense, false);
  const auto [all, at] = with_target(target, rest);
  std::string label = o.describe() + "; target" + seq_label(target) + " at " + std::to_string(at) +
                      " of a " + (dense ? "dense batch" : "packed") + " call of";
  for (const Seq* s : all) label += seq_label(*s);
  const Rows alone = rows_of(be, o, dense_call(o, {&target}), true, false)[0];
  Rows got;
  if (dense) {
    got = rows_of(be, o, dense_call(o, all), true, false)[at];
  } else {
    const bool used = *rc::gen::arbitrary<bool>();
    label += used ? " with seqused_k" : "";
    got = rows_of(be, o, packed_call(o, all, draw_pads(all.size()), used, 8), true, false)[at];
  }
  require_same(label, backward_differs(o, "in the batch vs alone", got, alone));
}

template <void (*F)(const Backend&)>
std::function<void(const Subject&)> on_backend() {
  return [](const Subject& s) { F(s.backend); };
}

}  // namespace

void register_invariance_properties(std::vector<Property>& v) {
  const auto add = [&v](const char* name, int cases, std::function<void(const Subject&)> body) {
    Property p{name, "invariance", cases, std::move(body), true};
    p.invariance = true;
    v.push_back(std::move(p));
  };
  add("decode_equals_prefill", 40, on_backend<decode_equals_prefill>());
  add("batch_invariant", 32, on_backend<batch_invariant>());
  add("packed_equals_separate", 25, on_backend<packed_equals_separate>());
  add("paged_equals_contiguous", 25, on_backend<paged_equals_contiguous>());
  add("origin_invariant", 25, on_backend<origin_invariant>());
  add("geometry_invariant", 24, geometry_invariant);
  add("backward_batch_invariant", 16, on_backend<backward_batch_invariant>());
}

}  // namespace tandem::props
