// SPDX-License-Identifier: Apache-2.0
// Attention benchmarks: forward, backward (all three and each alone), decode
// and the extra memory of a call, for every backend under test.
//
// FLOPs of one forward call: for every (b, h) and every visible (i, j) pair,
// 2·D for <q_i, k_j> and 2·Dv for p_ij·v_j; causal counts only the visible
// pairs. A backward call counts as 2.5× its forward.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <set>
#include <string>
#include <vector>

#include "bench_common.hpp"

namespace tandem::bench {
namespace {

AttnShape square(std::int64_t S, std::int64_t D, bool causal, std::int64_t B = 1,
                 std::int64_t H = 8) {
  AttnShape a;
  a.B = B;
  a.H = a.Hkv = H;
  a.Sq = a.Sk = S;
  a.D = a.Dv = D;
  a.causal = causal;
  return a;
}

/// Buffers of one attention call; gradients only for backward benchmarks,
/// the forward's saved out and lse only for the saved-state backward.
struct AttnFixture {
  AttentionPlan plan;
  std::vector<float> q, k, v, out, dout, dq, dk, dv, lse;
  double extra_bytes = -1.0;  ///< measured on the first call

  AttnFixture(const AttnShape& s, bool backward) : plan(s.plan()) {
    q = random_buffer(static_cast<std::size_t>(plan.q.extent), 1);
    k = random_buffer(static_cast<std::size_t>(plan.k.extent), 2);
    v = random_buffer(static_cast<std::size_t>(plan.v.extent), 3);
    out = zero_buffer(static_cast<std::size_t>(plan.o.extent));
    if (backward) {
      dout = random_buffer(static_cast<std::size_t>(plan.o.extent), 4);
      dq = zero_buffer(static_cast<std::size_t>(plan.dq.extent));
      dk = zero_buffer(static_cast<std::size_t>(plan.dk.extent));
      dv = zero_buffer(static_cast<std::size_t>(plan.dv.extent));
    }
  }
  [[nodiscard]] AttentionInputs<float> inputs() const { return {q, k, v, {}}; }
};

enum class Pass { forward, backward, backward_saved, backward_dq, backward_dk, backward_dv };

const char* op_name(Pass p) {
  switch (p) {
    case Pass::forward:
      return "attention_forward";
    case Pass::backward:
      return "attention_backward";
    case Pass::backward_saved:
      return "attention_backward_saved";
    case Pass::backward_dq:
      return "attention_backward_dq";
    case Pass::backward_dk:
      return "attention_backward_dk";
    case Pass::backward_dv:
      return "attention_backward_dv";
  }
  return "?";
}

/// FLOPs counted for one call, in units of one S×S×D matmul (2·pairs·D):
/// forward = QKᵀ + PV = 2 units; backward = QKᵀ, dO·Vᵀ, dS·K, dSᵀ·Q, Pᵀ·dO =
/// 5 units = 2.5× forward (with or without the forward's saved state: the
/// forward a backward reruns is not counted). One gradient alone: dQ and dK need QKᵀ, dO·Vᵀ and
/// their own product (3 units = 1.5× forward); dV needs QKᵀ and Pᵀ·dO
/// (2 units = 1× forward).
double pass_flops(Pass p, const AttnShape& s) {
  const double f = s.forward_flops();
  switch (p) {
    case Pass::forward:
      return f;
    case Pass::backward:
    case Pass::backward_saved:
      return 2.5 * f;
    case Pass::backward_dq:
    case Pass::backward_dk:
      return 1.5 * f;
    case Pass::backward_dv:
      return f;
  }
  return f;
}

void run_attention(benchmark::State& st, const Backend& be, const AttnShape& shape, Pass pass,
                   int threads, const std::string& key, bool single_shot) {
  bool created = false;
  AttnFixture* fx = nullptr;
  try {
    fx = &cached_fixture<AttnFixture>(
        key, [&] { return std::make_unique<AttnFixture>(shape, pass != Pass::forward); }, &created);
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
    return;
  }
  AttnFixture& f = *fx;
  const AttentionInputs<float> in = f.inputs();
  std::function<void()> call;
  switch (pass) {
    case Pass::forward:
      call = [&] { be.attention_forward(f.plan, in, f.out); };
      break;
    case Pass::backward:
      call = [&] { be.attention_backward(f.plan, in, f.dout, {f.dq, f.dk, f.dv}); };
      break;
    case Pass::backward_saved:
      if (!be.attention_forward_lse || !be.attention_backward_saved) {
        st.SkipWithError("the backend has no saved-state entry points");
        return;
      }
      if (f.lse.empty()) {  // the forward of the training step, once, untimed
        f.lse = zero_buffer(static_cast<std::size_t>(f.plan.lse_size()));
        be.attention_forward_lse(f.plan, in, f.out, f.lse);
      }
      call = [&] {
        be.attention_backward_saved(f.plan, in, {f.out, f.lse}, f.dout, {f.dq, f.dk, f.dv});
      };
      break;
    case Pass::backward_dq:
      call = [&] { be.attention_backward_dq(f.plan, in, f.dout, f.dq); };
      break;
    case Pass::backward_dk:
      call = [&] { be.attention_backward_dk(f.plan, in, f.dout, f.dk); };
      break;
    case Pass::backward_dv:
      call = [&] { be.attention_backward_dv(f.plan, in, f.dout, f.dv); };
      break;
  }
  // The first call of a fixture measures the memory the call needs beyond its
  // inputs and outputs. Normally it is also the warm-up (thread pool,
  // dispatch) before the timed calls; a single-shot benchmark (a call of
  // seconds, run once) times that first call itself instead of paying twice.
  bool measure_in_loop = false;
  try {
    if (created && !single_shot) f.extra_bytes = extra_memory_bytes(call);
    measure_in_loop = created && single_shot;
  } catch (const std::exception& e) {
    st.SkipWithError(e.what());
    return;
  }
  const auto loop_start = std::chrono::steady_clock::now();
  for (auto _ : st) {
    if (measure_in_loop) {
      f.extra_bytes = extra_memory_bytes(call);
      measure_in_loop = false;
    } else {
      call();
    }
    benchmark::ClobberMemory();
  }
  set_flop_counters(st, pass_flops(pass, shape), threads, seconds_since(loop_start));
  st.counters["extra_MiB"] = f.extra_bytes < 0 ? -1.0 : f.extra_bytes / (1024.0 * 1024.0);
}

void add_attention(Pass pass, const BackendUnderTest& bu, const AttnShape& shape,
                   const std::vector<std::string>& tags, bool suffix_threads,
                   double min_time = 0.0) {
  Spec s;
  s.op = op_name(pass);
  s.backend = bu.name;
  s.shape = shape.tag();
  s.threads = bu.threads;
  s.name = s.op + "/" + s.backend + "/" + s.shape;
  if (suffix_threads) s.name += "/threads:" + std::to_string(bu.threads);
  s.tags = tags;
  shape.describe(s);
  s.params["flop"] = pass_flops(pass, shape);
  const std::string key = s.name;
  const int threads = bu.threads;
  auto be = std::make_shared<Backend>(bu.make());
  const bool single_shot = std::find(tags.begin(), tags.end(), "memory") != tags.end();
  add(
      s,
      [be, shape, pass, threads, key, single_shot](benchmark::State& st) {
        run_attention(st, *be, shape, pass, threads, key, single_shot);
      },
      min_time);
}

// ---- decode ------------------------------------------------------------------------

/// Several independent KV caches, together far larger than the last-level
/// cache, visited in turn so each call reads K and V from memory, as a model
/// whose layers each have their own cache does.
struct DecodeFixture {
  AttentionPlan plan;
  std::vector<std::vector<float>> k, v;
  std::vector<float> q, out;
  std::size_t next = 0;

  DecodeFixture(const AttnShape& s, std::size_t caches) : plan(s.plan()) {
    q = random_buffer(static_cast<std::size_t>(plan.q.extent), 11);
    out = zero_buffer(static_cast<std::size_t>(plan.o.extent));
    for (std::size_t c = 0; c < caches; ++c) {
      k.push_back(random_buffer(static_cast<std::size_t>(plan.k.extent), 100 + 2 * c));
      v.push_back(random_buffer(static_cast<std::size_t>(plan.v.extent), 101 + 2 * c));
    }
  }
};

void add_decode(const BackendUnderTest& bu, const AttnShape& shape, std::size_t caches,
                const std::vector<std::string>& tags) {
  Spec s;
  s.op = "decode";
  s.backend = bu.name;
  s.shape = shape.tag();
  s.threads = bu.threads;
  s.name = s.op + "/" + s.backend + "/" + s.shape;
  s.tags = tags;
  shape.describe(s);
  const double kv_bytes = 4.0 * static_cast<double>(shape.B * shape.Sk * shape.Hkv) *
                          static_cast<double>(shape.D + shape.Dv);
  s.params["bytes"] = kv_bytes;
  s.params["caches"] = static_cast<double>(caches);
  s.params["flop"] = shape.forward_flops();
  const std::string key = s.name;
  const int threads = bu.threads;
  auto be = std::make_shared<Backend>(bu.make());
  add(s, [be, shape, caches, kv_bytes, threads, key](benchmark::State& st) {
    DecodeFixture* fx = nullptr;
    try {
      fx = &cached_fixture<DecodeFixture>(
          key, [&] { return std::make_unique<DecodeFixture>(shape, caches); });
      DecodeFixture& f = *fx;
      for (std::size_t c = 0; c < caches; ++c) {  // warm-up: every cache once
        be->attention_forward(f.plan, {f.q, f.k[c], f.v[c], {}}, f.out);
      }
    } catch (const std::exception& e) {
      st.SkipWithError(e.what());
      return;
    }
    DecodeFixture& f = *fx;
    const auto loop_start = std::chrono::steady_clock::now();
    for (auto _ : st) {
      const std::size_t c = f.next;
      f.next = (f.next + 1) % caches;
      be->attention_forward(f.plan, {f.q, f.k[c], f.v[c], {}}, f.out);
      benchmark::ClobberMemory();
    }
    const double seconds = seconds_since(loop_start);
    set_byte_counters(st, kv_bytes, threads, seconds, true);
    st.counters["GFLOP/s"] =
        seconds > 0 ? shape.forward_flops() * static_cast<double>(st.iterations()) / seconds / 1e9
                    : 0;
  });
}

}  // namespace

void register_attention() {
  const Config& c = config();
  const bool quick = c.preset == Preset::quick;
  const bool full = c.preset == Preset::full;
  const std::vector<std::int64_t> dims =
      !c.dims.empty() ? c.dims : std::vector<std::int64_t>{64, 128};
  std::vector<std::int64_t> fwd_seqs, bwd_seqs;
  if (!c.seqs.empty()) {
    fwd_seqs = bwd_seqs = c.seqs;
  } else if (quick) {
    fwd_seqs = {512, 2048};
    bwd_seqs = {512, 2048};
  } else {
    fwd_seqs = {512, 1024, 2048, 4096, 8192};
    bwd_seqs = {512, 1024, 2048, 4096};
    if (full) {
      fwd_seqs.push_back(16384);
      bwd_seqs.push_back(8192);
    }
  }
  // Shapes the peers are measured on too (the report compares there).
  // (Every length given with --seqs; else the middle of the preset's range.)
  const std::set<std::int64_t> peer_seqs =
      !c.seqs.empty() ? std::set<std::int64_t>(c.seqs.begin(), c.seqs.end())
      : quick         ? std::set<std::int64_t>{512, 2048}
                      : std::set<std::int64_t>{1024, 2048, 4096};
  const std::int64_t ref_seq = quick ? 128 : 256;
  const std::int64_t scaling_seq = 2048;
  const auto main_backends = backends_at(c.threads, false);

  for (Pass pass : {Pass::forward, Pass::backward, Pass::backward_saved}) {
    if (!op_selected(op_name(pass))) continue;
    const auto& seqs = pass == Pass::forward ? fwd_seqs : bwd_seqs;
    for (std::int64_t D : dims) {
      for (bool causal : {false, true}) {
        // reference (and the optimized backend beside it) at a small size
        for (const auto& bu : backends_at(c.threads, true)) {
          add_attention(pass, bu, square(ref_seq, D, causal), {"small"}, false);
        }
        for (std::int64_t S : seqs) {
          if (S == ref_seq) continue;
          std::vector<std::string> tags{"main"};
          // (the peers' backward is compared with both tandem backwards, so
          // the saved-state one needs no peer run of its own)
          if (peer_seqs.count(S) && (pass == Pass::forward || D == 128) &&
              pass != Pass::backward_saved) {
            tags.push_back("peer");
          }
          for (const auto& bu : main_backends)
            add_attention(pass, bu, square(S, D, causal), tags, false);
        }
        // thread scaling at S = 2048, D = 128
        if (D == 128 && pass != Pass::backward_saved) {
          for (int t : c.scaling_threads) {
            if (t == c.threads) continue;
            for (const auto& bu : backends_at(t, false)) {
              add_attention(pass, bu, square(scaling_seq, D, causal), {"scaling", "peer"}, true);
            }
          }
        }
      }
    }
  }
  // Each gradient alone.
  for (Pass pass : {Pass::backward_dq, Pass::backward_dk, Pass::backward_dv}) {
    if (!op_selected(op_name(pass)) || quick) continue;
    for (const auto& bu : main_backends) {
      add_attention(pass, bu, square(2048, 128, false), {"main"}, false);
    }
    for (const auto& bu : backends_at(c.threads, true)) {
      add_attention(pass, bu, square(ref_seq, 128, false), {"small"}, false);
    }
  }
  // Extra memory against sequence length (the largest only once: seconds a call).
  if (op_selected("attention_memory")) {
    const std::vector<std::int64_t> mem_seqs =
        quick ? std::vector<std::int64_t>{4096} : std::vector<std::int64_t>{16384};
    for (std::int64_t S : mem_seqs) {
      for (Pass pass : {Pass::forward, Pass::backward}) {
        if (!op_selected(op_name(pass))) continue;
        const auto& seqs = pass == Pass::forward ? fwd_seqs : bwd_seqs;
        if (std::find(seqs.begin(), seqs.end(), S) != seqs.end()) {
          continue;  // already measured by the main set
        }
        for (const auto& bu : main_backends) {
          add_attention(pass, bu, square(S, 128, false), {"memory"}, false, 1e-9);
        }
      }
    }
  }
  // Attention as it runs inside the BERT block (to separate the block's
  // projections from its attention).
  if (op_selected("attention_block")) {
    for (const auto& bu : main_backends) {
      add_attention(Pass::forward, bu, square(512, 64, false, quick ? 2 : 8, 12), {"block_part"},
                    false);
    }
  }
  // Decode: one query of a batch of B sequences against GQA caches of Sk
  // tokens (H = 32, Hkv = 8, D = 128).
  if (op_selected("decode")) {
    std::vector<std::pair<std::int64_t, std::int64_t>> batch_keys;  // (B, Sk)
    if (quick) {
      batch_keys = {{1, 4096}};
    } else {
      batch_keys = {{1, 1024}, {1, 4096}, {1, 32768}, {8, 1024}, {8, 4096}};
      if (full) batch_keys.emplace_back(8, 32768);
    }
    for (const auto& [B, Sk] : batch_keys) {
      const AttnShape d = AttnShape::decode_step(B, Sk);
      const double cache_bytes = 4.0 * static_cast<double>(B * Sk * d.Hkv * (d.D + d.Dv));
      // Enough caches for the roofline's array size of K and V in all (none
      // stays in the last-level cache), at least two below it.
      const double all = static_cast<double>(beyond_cache_bytes()) * (quick ? 0.5 : 1.0);
      const auto caches = static_cast<std::size_t>(
          std::max(cache_bytes >= all ? 1.0 : 2.0, std::ceil(all / cache_bytes)));
      for (const auto& bu : backends_at(c.threads, B == 1 && Sk == 4096)) {
        if (bu.name == "reference") {
          add_decode(bu, d, 2, {"small"});
        } else {
          add_decode(bu, d, caches, {"main", "peer"});
        }
      }
    }
  }
}

}  // namespace tandem::bench
