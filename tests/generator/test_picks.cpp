// The heuristic as data: the per-GPU pick tables, their fallback, and a golden summary of the picks.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "generator/pick_table.hpp"
#include "normjit/normjit.hpp"
#include "tests/compile_batches.hpp"
#include "tests/compile_record.hpp"
#include "tests/generator/picks_summary.hpp"

using namespace normjit;

namespace {

template <class F>
void parallel_for(size_t count, F&& body) {
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next++) < count;) body(i);
  };
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < std::max(2u, std::thread::hardware_concurrency()); ++t) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
}

// The one block of a one-row table of `phase` over every bf16 N of 8-element packs.
detail::TableBlock parse_one_block(const char* phase, const std::string& block_text) {
  return detail::parse_pick_table("test.txt", std::string(phase) + " * * x2 v8 8 262144 " + block_text)
      .rows.at(0)
      .blocks.at(0);
}

Spec spec(const char* text) { return Spec::parse(text); }

}  // namespace

TEST_CASE("the picks match the golden summary, and every N from 1 to 262144 resolves to a valid config") {
  // picks_summary_line() resolves every N of each class; resolve() validates what it picks.
  const auto classes = testing::pick_classes();
  std::vector<std::string> lines(classes.size());
  std::mutex mutex;
  std::vector<std::string> failures;
  parallel_for(classes.size(), [&](size_t i) {
    try {
      lines[i] = testing::picks_summary_line(classes[i]);
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(mutex);
      failures.push_back(testing::pick_class_name(classes[i]) + ": " + e.what());
    }
  });
  for (const auto& f : failures) FAIL_CHECK(f);
  std::string got;
  for (const auto& l : lines) got += l + "\n";
  const std::string path = std::string(NORMJIT_GOLDEN_DIR) + "/picks_summary.txt";
  if (const char* update = std::getenv("NORMJIT_UPDATE_GOLDEN"); update && std::string(update) == "1") {
    std::ofstream(path) << got;
    MESSAGE("wrote " << path);
  }
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "missing " << path << " (NORMJIT_UPDATE_GOLDEN=1 writes it)");
  std::stringstream want;
  want << in.rdbuf();
  // Line by line, so a change names its class.
  auto split = [](const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  };
  const auto now = split(got), golden = split(want.str());
  size_t differ = 0;
  for (size_t i = 0; i < std::max(now.size(), golden.size()); ++i) {
    const std::string a = i < now.size() ? now[i] : "", b = i < golden.size() ? golden[i] : "";
    if (a != b && ++differ <= 10) FAIL_CHECK("picks_summary.txt line " << i + 1 << ":\n  golden: " << b << "\n  now:    " << a);
  }
  CHECK_MESSAGE(differ == 0, differ << " lines of the picks summary changed; if intended, regenerate with "
                                       "NORMJIT_UPDATE_GOLDEN=1 and say why in the commit");
}

TEST_CASE("the tables are read: a row's block is what resolve() returns inside its range, the fallback outside") {
  auto block = [](const char* text, int sm = 90, int max_cluster = kMaxCluster) {
    return *resolve(Spec::parse(text), 16, sm, max_cluster).block;
  };
  // A p<K> row: 2 packs a thread over a ragged row, filled by bulk copies (sm_90); on sm_80 no row
  // holds it and the fallback splits it.
  CHECK(block("layernorm.bwd.bf16.w_f32.n10000.bias") == BlockConfig{640, 1, 8, RowCache::kSharedPipelined, 1, 3, true});
  CHECK(block("layernorm.bwd.bf16.w_f32.n10000.bias", 80) == BlockConfig{1024, 1, 8, RowCache::kGlobal});
  // Alternatives: the 2-CTA row where the packs split in two, else one CTA's shared memory.
  CHECK(block("layernorm.bwd.bf16.w_f32.n20480.bias") == BlockConfig{640, 1, 8, RowCache::kSharedPipelined, 2, 2, true});
  CHECK(block("layernorm.bwd.bf16.w_f32.n20488.bias") == BlockConfig{864, 1, 8, RowCache::kShared});
  // @even: 1024 threads of 8-byte packs only where they take whole packs (RMSNorm forward), else
  // 8 packs of 16 bytes a thread.
  CHECK(block("rmsnorm.fwd_train.bf16.n40960") == BlockConfig{1024, 1, 4, RowCache::kRegisters});
  CHECK(block("rmsnorm.fwd_train.bf16.n40968") == BlockConfig{672, 1, 8, RowCache::kRegisters});
  // The GPU's cluster limit: a 16-CTA row only where 16 may run, else the split route.
  CHECK(block("layernorm.bwd.bf16.w_f32.n262144.bias").cluster == 16);
  CHECK(block("layernorm.bwd.bf16.w_f32.n262144.bias", 90, kMaxPortableCluster) == BlockConfig{1024, 1, 8, RowCache::kGlobal});
  // Outside every row: the fallback (tiny rows, warp rows, CTA rows in registers, streaming).
  CHECK(block("rmsnorm.fwd_train.bf16.n7") == BlockConfig{8, 32, 1, RowCache::kRegisters});
  CHECK(block("layernorm.fwd_train.bf16.n1024") == BlockConfig{32, 4, 8, RowCache::kRegisters});
  CHECK(block("layernorm.fwd_train.bf16.n4096") == BlockConfig{128, 1, 8, RowCache::kRegisters});
  CHECK(block("layernorm.fwd_train.bf16.n40960", 80).cache == RowCache::kGlobal);
  // A newer GPU takes the sm_90 table.
  CHECK(block("layernorm.bwd.bf16.w_f32.n10000.bias", 100) == block("layernorm.bwd.bf16.w_f32.n10000.bias", 90));
}

TEST_CASE("a block applies only where its segments, mask bytes, cluster and @even threads allow") {
  auto parse_one = [](const std::string& block_text) { return parse_one_block("bwd", block_text); };
  const auto pair = parse_one("p2_r1_v8_c2_tma");
  // 20480 / 8 = 2560 packs, 1280 a CTA, 2 a thread: 640 threads.
  CHECK(detail::apply_pick_block(pair, spec("layernorm.bwd.bf16.w_f32.n20480.bias"), 16)->threads_per_row == 640);
  CHECK_FALSE(detail::apply_pick_block(pair, spec("layernorm.bwd.bf16.w_f32.n20488.bias"), 16));  // 2561 packs
  CHECK_FALSE(detail::apply_pick_block(pair, spec("layernorm.bwd.bf16.w_f32.n20480.bias"), 1));   // no clusters
  const auto quad = parse_one("t1024_r1_v2_c4_smem");
  // N = 65544 splits into 4 segments of 8193 2-element packs, but with the mask each CTA's 16386
  // values would share a mask byte with its neighbour's.
  CHECK(detail::apply_pick_block(quad, spec("layernorm.bwd.bf16.w_f32.n65544.bias"), 16));
  CHECK_FALSE(detail::apply_pick_block(quad, spec("layernorm.bwd.bf16.w_f32.n65544.bias.relu_bitmask"), 16));
  CHECK(detail::apply_pick_block(quad, spec("layernorm.bwd.bf16.w_f32.n65536.bias.relu_bitmask"), 16));
  const auto even = parse_one("t1024_r1_v4_reg@even");
  CHECK(detail::apply_pick_block(even, spec("rmsnorm.bwd.bf16.n40960"), 16));
  CHECK_FALSE(detail::apply_pick_block(even, spec("rmsnorm.bwd.bf16.n40968"), 16));
}

TEST_CASE("@warps4 rounds a p<K> block's threads up to whole groups of four warps") {
  auto parse_one = [](const std::string& block_text) { return parse_one_block("bwd", block_text); };
  const auto warps = parse_one("p2_r1_v8_c4_tma");
  const auto groups = parse_one("p2_r1_v8_c4_tma@warps4");
  // 36864 / 8 / 4 = 1152 packs a CTA, 2 a thread: 576 threads (18 warps), or 640 (20).
  CHECK(detail::apply_pick_block(warps, spec("layernorm.bwd.bf16.w_f32.n36864.bias"), 16)->threads_per_row == 576);
  CHECK(detail::apply_pick_block(groups, spec("layernorm.bwd.bf16.w_f32.n36864.bias"), 16)->threads_per_row == 640);
  // Already whole groups: the same block. 40960: 1280 packs a CTA, 640 threads.
  CHECK(detail::apply_pick_block(groups, spec("rmsnorm.bwd.bf16.w_f32.n40960"), 16) ==
        detail::apply_pick_block(warps, spec("rmsnorm.bwd.bf16.w_f32.n40960"), 16));
  // 1024 is whole groups: where 32-thread rounding fits a CTA, so does this (46976: 1468 packs
  // a CTA, 734 -> 736 or 768 threads).
  CHECK(detail::apply_pick_block(groups, spec("rmsnorm.bwd.bf16.w_f32.n46976"), 16)->threads_per_row == 768);
  // With another flag, in either order.
  const auto both = parse_one("p4_r1_v8_c8_smem@ragged@warps4");
  CHECK(both.ragged);
  CHECK(both.whole_warp_groups);
  const auto b = detail::apply_pick_block(both, spec("rmsnorm.bwd.bf16.w_f32.n65608"), 16);
  REQUIRE(b);
  // 65608 / 8 = 8201 packs, 1026 a CTA, 4 a thread: 257 threads, 384 in whole groups.
  CHECK(b->threads_per_row == 384);
}

TEST_CASE("@ragged blocks apply where the cluster splits a row's packs unevenly") {
  auto parse_one = [](const std::string& block_text) { return parse_one_block("fwd", block_text); };
  const auto plain = parse_one("p8_r1_v8_c4_smem");
  const auto ragged = parse_one("p8_r1_v8_c4_smem@ragged");
  // 65608 / 8 = 8201 packs: 2051 a CTA, 2048 in the last; 8 a thread: 257 -> 288 threads.
  CHECK_FALSE(detail::apply_pick_block(plain, spec("rmsnorm.fwd_train.bf16.n65608"), 16));
  const auto b = detail::apply_pick_block(ragged, spec("rmsnorm.fwd_train.bf16.n65608"), 16);
  REQUIRE(b);
  CHECK(b->threads_per_row == 288);
  CHECK(b->cluster == 4);
  // Where the cluster divides the packs, both apply alike.
  CHECK(detail::apply_pick_block(plain, spec("rmsnorm.fwd_train.bf16.n65536"), 16) ==
        detail::apply_pick_block(ragged, spec("rmsnorm.fwd_train.bf16.n65536"), 16));
  // The backward's rows too (a table row of phase bwd); not where the mask bytes or MXFP8 scale
  // blocks would straddle CTAs.
  const auto backward = detail::apply_pick_block(ragged, spec("rmsnorm.bwd.bf16.w_f32.n65608"), 16);
  REQUIRE(backward);
  CHECK(backward->threads_per_row == 288);
  CHECK_FALSE(detail::apply_pick_block(plain, spec("rmsnorm.bwd.bf16.w_f32.n65608"), 16));
  const auto v4 = detail::parse_pick_table("test.txt", "fwd * * x2 v4 8 262144 t1024_r1_v4_c2_smem@ragged")
                      .rows.at(0).blocks.at(0);
  // 65612 / 4 = 16403 packs, 8202 a CTA: 32808 values, whole mask bytes; MXFP8 rounds the
  // segments up to whole 32-value blocks, 8208 packs (the last CTA 8195);
  // 65604: 8201 a CTA, 32804 values, a mask byte shared with the next CTA.
  CHECK(detail::apply_pick_block(v4, spec("rmsnorm.fwd_train.bf16.n65612"), 16));
  CHECK(detail::apply_pick_block(v4, spec("rmsnorm.fwd_train.bf16.n65612.relu_bitmask"), 16));
  const Spec mx = spec("rmsnorm.fwd_train.bf16.n65612.mxfp8_e4m3");
  const auto mx_block = detail::apply_pick_block(v4, mx, 16);
  REQUIRE(mx_block);
  CHECK(segment_packs(mx, *mx_block) == 8208);
  CHECK(last_segment_packs(mx, *mx_block) == 8195);
  CHECK(detail::apply_pick_block(v4, spec("rmsnorm.fwd_train.bf16.n65604"), 16));
  CHECK_FALSE(detail::apply_pick_block(v4, spec("rmsnorm.fwd_train.bf16.n65604.relu_bitmask"), 16));
}

TEST_CASE("a bad pick table names the table, the line and the problem") {
  struct Bad {
    const char* text;
    const char* needle;
  };
  const Bad bad[] = {
      {"fwd layernorm * x2 v8 1 8", "expected: phase norm bias x vec n_from n_to block"},
      {"mid layernorm * x2 v8 1 8 t32_r1_v8_reg", "phase must be fwd, bwd, bwd+residual, fwd+residual_f32 or bwd+residual_f32, with +quant for the forward's, not 'mid'"},
      {"bwd+quant * * x2 v8 1 8 t32_r1_v8_reg", "+quant names quantized outputs, a forward's: not 'bwd+quant'"},
      {"+quant * * x2 v8 1 8 t32_r1_v8_reg", "not '+quant'"},
      {"fwd groupnorm * x2 v8 1 8 t32_r1_v8_reg", "norm must be layernorm, rmsnorm or *"},
      {"fwd * yes x2 v8 1 8 t32_r1_v8_reg", "bias must be bias, - or *"},
      {"fwd * * x3 v8 1 8 t32_r1_v8_reg", "x must be x2 or x4"},
      {"fwd * * x2 v3 1 8 t32_r1_v8_reg", "vec must be v1, v2, v4 or v8"},
      {"fwd * * x2 v8 9 8 t32_r1_v8_reg", "bad range 9..8"},
      {"fwd * * x2 v8 1 300000 t32_r1_v8_reg", "bad range"},
      {"fwd * * x2 v8 1 8 q32_r1_v8_reg", "must start with t<threads> or p<packs per thread>"},
      {"fwd * * x2 v8 1 8 t32_r1_v8_reg@odd", "unknown block flag '@odd'"},
      {"fwd * * x2 v8 1 8 p2_r1_v8_reg@even", "@even needs a fixed thread count"},
      {"fwd * * x2 v8 1 8 t256_r1_v8_reg@warps4", "@warps4 needs a thread count from packs (p<K>)"},
      {"fwd * * x2 v8 1 8 p2_r1_v8_c2_tma@warps4@four", "unknown block flag '@four'"},
      {"fwd * * x2 v8 1 8 t256_r1_v8_pipe@ragged", "@ragged needs a cluster (c<C>) of rows in registers, smem or tma (the backward's)"},
      {"fwd * * x2 v8 1 8 t256_r1_v8_c2_pipe@ragged", "@ragged needs a cluster"},
      {"fwd * * x2 v8 1 8 t32_r1_v8_reg t64_r1_v8_reg", "blocks are separated by ' | '"},
      {"fwd * * x2 v8 1 8 t32_r1_v8_cache", "bad block 't32_r1_v8_cache'"},
  };
  for (const Bad& b : bad) {
    const std::string text = std::string("# header\n\n") + b.text + "\n";
    CAPTURE(text);
    bool threw = false;
    try {
      detail::parse_pick_table("sm99.txt", text);
    } catch (const Error& e) {
      threw = true;
      const std::string what = e.what();
      CHECK(what.find("pick table sm99.txt:3: ") != std::string::npos);
      CHECK(what.find(b.needle) != std::string::npos);
    }
    CHECK(threw);
  }
}

TEST_CASE("every block of every table row compiles without local memory at the top of its range, but the known spills") {
  // Registers grow with N inside a row, so its largest N is where a block would spill first. Each
  // block is compiled there for every norm the row covers (AdaLayerNorm holds per-batch weights),
  // fp32 weights, bias where the row allows it, and each epilogue the block allows (the backward's
  // @ragged blocks: none). The spills
  // that remain are listed in tests/golden/known_spills.txt: a new one fails, and so does a
  // listed one that no longer spills (NORMJIT_UPDATE_GOLDEN=1 rewrites the list).
  struct Job {
    Spec spec;
    int sm;
  };
  std::vector<Job> jobs;
  std::set<std::string> seen;
  for (int sm : {80, 90}) {
    const detail::PickTable* table = detail::pick_table_for_sm(sm);
    REQUIRE(table != nullptr);
    REQUIRE(!table->rows.empty());
    for (const detail::TableRow& r : table->rows)
      for (const detail::TableBlock& tb : r.blocks) {
        std::vector<Norm> norms;
        if (!r.norm || *r.norm == Norm::kLayerNorm) norms = {Norm::kLayerNorm, Norm::kAdaLayerNorm};
        if (!r.norm || *r.norm == Norm::kRMSNorm) norms.push_back(Norm::kRMSNorm);
        bool applies = false;
        // The backward's @ragged blocks apply without an epilogue only (apply_pick_block).
        std::vector<Epilogue> epilogues = {Epilogue::kGelu, Epilogue::kReluBitmask};
        if (tb.ragged && r.backward) epilogues = {Epilogue::kNone};
        for (Norm norm : norms)
          for (Epilogue ep : epilogues)
            for (int64_t n = r.n_to; n >= r.n_from; n -= r.vec) {
              // An fp32 residual stream's rows (x4) hold f16 x beside its fp32 h.
              Spec s = Spec::make(norm, r.backward ? Phase::kBackward : Phase::kForwardTraining,
                                  r.x_bytes == 2 || r.stream_f32_only ? DType::kF16 : DType::kF32, n,
                                  r.has_bias.value_or(true));
              s.w_dtype = DType::kF32;
              s.epilogue = ep;
              s.residual = r.residual_only || r.stream_f32_only;
              s.residual_f32 = r.stream_f32_only;
              if (const auto b = detail::apply_pick_block(tb, s, kMaxCluster)) {
                s.block = b;
                if (seen.insert(s.str() + " sm_" + std::to_string(sm)).second) jobs.push_back({s, sm});
                applies = true;
                break;
              }
            }
        CHECK_MESSAGE(applies, "a block of a row of " << table->name << " applies nowhere in its range");
      }
  }
  std::vector<std::string> failures;
  std::vector<testing::CompileJob> compile_jobs;
  for (const Job& j : jobs) compile_jobs.push_back({j.spec, Target{j.sm}});
  // Recorded compiles (tests/compile_record.hpp): a job whose kernel cache key is in the record
  // takes its recorded report, every 32nd is compiled to check it, the rest are compiled.
  // One spec a program: a fifth of these blocks spill at the top of their rows, and a batch
  // compiles each spilling member again alone (batched, the test took 417 s against 324).
  const testing::RecordedCompiles compiled = testing::compile_with_record(
      compile_jobs, std::string(NORMJIT_GOLDEN_DIR) + "/spill_check_record.txt",
      [&](size_t, const testing::CompiledJob& c) {
        if (!c.error.empty()) failures.push_back(c.error);
      },
      /*batch=*/1);
  failures.insert(failures.end(), compiled.failures.begin(), compiled.failures.end());
  std::set<std::string> spills;
  for (size_t i = 0; i < jobs.size(); ++i)
    for (const KernelResources& k : compiled.resources[i])
      if (k.spill_store_bytes > 0 || k.spill_load_bytes > 0 || k.stack_frame_bytes > 0)
        spills.insert(jobs[i].spec.str() + " sm_" + std::to_string(jobs[i].sm) + " " + k.function + " " +
                      std::to_string(k.stack_frame_bytes) + " B");
  for (const auto& f : failures) FAIL_CHECK(f);
  const std::string path = std::string(NORMJIT_GOLDEN_DIR) + "/known_spills.txt";
  if (const char* update = std::getenv("NORMJIT_UPDATE_GOLDEN"); update && std::string(update) == "1") {
    std::ofstream out(path);
    out << "# Table blocks that use local memory at the top of their row (spec, arch, function, stack bytes).\n"
           "# Written by tests/generator/test_picks.cpp with NORMJIT_UPDATE_GOLDEN=1; docs/picks.md says why.\n";
    for (const auto& s : spills) out << s << "\n";
  }
  std::set<std::string> known;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') known.insert(line);
  for (const auto& s : spills)
    if (!known.count(s)) FAIL_CHECK("new local memory: " << s);
  for (const auto& s : known)
    if (!spills.count(s)) FAIL_CHECK("listed in known_spills.txt but no longer spills (update the list): " << s);
  MESSAGE(jobs.size() << " table blocks at the top of their rows: " << compiled.summary() << "; " << spills.size()
                       << " known spills");
}

namespace {

// Sizes that fall between two rows of one class: a gap of a few sizes sends those N to the
// fallback (streamed or split rows at large N) while N - vec and the next row's first N take the
// rows' blocks. Gaps of more than 64 elements are the fallback's own ranges.
std::vector<std::string> seams(const detail::PickTable& table) {
  std::vector<std::string> found;
  for (bool backward : {false, true})
    for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm})
      for (bool bias : {false, true})
        for (int x_bytes : {2, 4})
          for (int vec : {1, 2, 4, 8}) {
            std::vector<std::pair<int64_t, int64_t>> ranges;
            for (const detail::TableRow& r : table.rows)
              if (r.backward == backward && !r.residual_only && !r.stream_f32_only && !r.quant_only &&
                  (!r.norm || *r.norm == norm) && (!r.has_bias || *r.has_bias == bias) && r.x_bytes == x_bytes &&
                  r.vec == vec)
                ranges.emplace_back(r.n_from, r.n_to);
            std::sort(ranges.begin(), ranges.end());
            int64_t end = -1;
            for (const auto& [from, to] : ranges) {
              if (end >= 0 && from > end + vec && from - end <= 64) {
                std::ostringstream where;
                where << table.name << ": " << (backward ? "bwd " : "fwd ") << to_string(norm) << (bias ? " bias" : " -")
                      << " x" << x_bytes << " v" << vec << ": N = " << end + vec << ".." << from - vec;
                found.push_back(where.str());
              }
              end = std::max(end, to);
            }
          }
  return found;
}

}  // namespace

TEST_CASE("where two rows of a class meet, no size falls between them") {
  // RMS forward at N = 51208 streamed its row twice where 51200 and 51216 held theirs in registers.
  for (int sm : {80, 90}) {
    const detail::PickTable* table = detail::pick_table_for_sm(sm);
    REQUIRE(table != nullptr);
    for (const std::string& seam : seams(*table)) FAIL_CHECK(seam << " falls between two rows");
  }
  // The check itself: 2056 falls between these rows; a gap of 512 is the fallback's range.
  const auto seamed = detail::parse_pick_table("seamed", "fwd * * x2 v8 1024 2048 t128_r1_v8_reg\n"
                                                         "fwd * * x2 v8 2064 4096 t256_r1_v8_reg\n"
                                                         "fwd * * x2 v8 4608 8192 t512_r1_v8_reg\n");
  const std::vector<std::string> found = seams(seamed);
  REQUIRE(found.size() == 4);  // LN and RMS, with and without bias
  CHECK(found[0] == "seamed: fwd layernorm - x2 v8: N = 2056..2056");
}

TEST_CASE("bf16 rows never fall to the streamed or split route: forward up to 262144, LN backward up to 131072, RMS backward up to 262144") {
  // Off the round sizes the pick rows used to fall to the fallback's streamed forward (or a slow
  // pipelined row) and split backward: 10-37 % slower on the H200 than register or shared rows
  // below 65536, 14-52 % past it (bench/RESULTS.md, "picks for sizes off the round grid",
  // "Clusters of unequal segments", "Backward clusters of unequal segments"). Every multiple of 8
  // is held; LayerNorm's backward with a bias still splits at 131136-196600 and past 229376.
  std::vector<std::string> fallen;
  int checked = 0;
  for (int64_t n = 8; n <= 262144; n += 8)
    for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm}) {
      const Spec f = resolve(Spec::make(norm, Phase::kForwardTraining, DType::kBF16, n, norm == Norm::kLayerNorm));
      ++checked;
      if (f.block->cache == RowCache::kGlobal) fallen.push_back(f.str());
      if (n > (norm == Norm::kRMSNorm ? 262144 : 131072)) continue;
      Spec bwd = Spec::make(norm, Phase::kBackward, DType::kBF16, n, norm == Norm::kLayerNorm);
      bwd.w_dtype = DType::kF32;
      const Spec b = resolve(bwd);
      ++checked;
      if (b.block->cache == RowCache::kGlobal) fallen.push_back(b.str());
    }
  CHECK(checked == 2 * 32768 + 16384 + 32768);
  CHECK_MESSAGE(fallen.empty(), fallen.size() << " specs stream or split their rows, the first "
                                              << (fallen.empty() ? std::string("-") : fallen.front()));
}

TEST_CASE("block-scaled outputs past 65536 take clusters of whole scale blocks, never the streamed row") {
  // Segments rounded up to whole scale blocks (segment_packs): before, about 75 % of the MXFP8 /
  // MXFP4 and 50 % of the NVFP4 sizes past 65536 streamed.
  std::vector<std::string> fallen;
  for (int64_t n = 65544; n <= 262144; n += 8)
    for (Epilogue e : {Epilogue::kMxfp8E4M3, Epilogue::kMxfp4, Epilogue::kNvfp4}) {
      Spec s = Spec::make(Norm::kLayerNorm, Phase::kForwardInference, DType::kBF16, n, true);
      s.epilogue = e;
      const Spec r = resolve(s);
      if (r.block->cache == RowCache::kGlobal) fallen.push_back(r.str());
      if (r.block->cluster > 1) CHECK(segment_packs(r, *r.block) * r.block->vec % scale_block_size(e) == 0);
    }
  CHECK_MESSAGE(fallen.empty(), fallen.size() << " stream their rows, the first "
                                              << (fallen.empty() ? std::string("-") : fallen.front()));
}

TEST_CASE("+quant rows serve quantized outputs only") {
  const auto pick = [](const char* text) { return testing::block_text(*resolve(Spec::parse(text), 16, 90).block); };
  // sm90.txt: fwd+residual_f32+quant layernorm * x4 v4 12288..14336 t512_r1_v4_smem.
  CHECK(pick("layernorm.fwd_infer.bf16.w_bf16.n14336.bias.residual_f32.fp8_e4m3") == "t512_r1_v4_smem");
  CHECK(pick("layernorm.fwd_infer.bf16.w_bf16.n12288.residual_f32.int8_row") == "t512_r1_v4_smem");
  CHECK(pick("layernorm.fwd_infer.bf16.w_bf16.n14336.bias.residual_f32") != "t512_r1_v4_smem");
  // Not a bf16 stream, and not past the row's range.
  CHECK(pick("layernorm.fwd_infer.bf16.w_bf16.n14336.bias.residual.fp8_e4m3") != "t512_r1_v4_smem");
  CHECK(pick("layernorm.fwd_infer.bf16.w_bf16.n15360.bias.residual_f32.fp8_e4m3") != "t512_r1_v4_smem");
  // RMSNorm at 16384: p6 (704 threads) with a quantized output only.
  CHECK(pick("rmsnorm.fwd_infer.bf16.w_bf16.n16384.residual_f32.fp8_e4m3") == "t704_r1_v4_smem");
  CHECK(pick("rmsnorm.fwd_infer.bf16.w_bf16.n16384.residual_f32") != "t704_r1_v4_smem");
}

TEST_CASE("bwd+residual rows serve residual backward specs only, and the plain rows serve the sizes they leave out") {
  const auto pick = [](const char* text) { return testing::block_text(*resolve(Spec::parse(text), 16, 90).block); };
  // sm90.txt: bwd+residual layernorm bias x2 v8 768..1536 p1_r1_v8_reg.
  CHECK(pick("layernorm.bwd.bf16.w_f32.n1024.bias.residual") == "t128_r1_v8_reg");
  CHECK(pick("adalayernorm.bwd.bf16.w_f32.n1024.bias.residual") == "t128_r1_v8_reg");
  CHECK(pick("layernorm.bwd.bf16.w_f32.n1024.bias") != "t128_r1_v8_reg");
  // No residual row at 9224-10752 nor at 12296-13304 for LayerNorm: the plain row's block.
  CHECK(pick("layernorm.bwd.bf16.w_f32.n10240.bias.residual") == pick("layernorm.bwd.bf16.w_f32.n10240.bias"));
  CHECK(pick("layernorm.bwd.bf16.w_f32.n12800.bias.residual") == pick("layernorm.bwd.bf16.w_f32.n12800.bias"));
  // bwd+residual layernorm bias x2 v8 5128..9216 p2_r1_v8_tma: two-stage bulk-copied rows, two
  // packs a thread (7168: 448 threads), where the plain rows take other caches.
  CHECK(pick("layernorm.bwd.bf16.w_f32.n7168.bias.residual") == "t448_r1_v8_tma");
  CHECK(pick("layernorm.bwd.bf16.w_f32.n9216.bias.residual") == "t576_r1_v8_tma");
  CHECK(pick("layernorm.bwd.bf16.w_f32.n8192.bias.residual") == "t512_r1_v8_tma3");  // three stages there
  CHECK(pick("layernorm.bwd.bf16.w_f32.n7168.bias") != "t448_r1_v8_tma");
  CHECK(pick("layernorm.bwd.bf16.w_f32.n13824.bias.residual") == "t864_r1_v8_tma");
  // bwd+residual layernorm bias x2 v8 10760..12288 p2_r1_v8_c6_tma@ragged: 1536 packs in six
  // CTAs of 128 threads; 11264 (1408 packs) ragged, the last CTA's segment 233 packs of 235.
  CHECK(pick("layernorm.bwd.bf16.w_f32.n12288.bias.residual") == "t128_r1_v8_c6_tma");
  CHECK(pick("layernorm.bwd.bf16.w_f32.n11264.bias.residual") == "t128_r1_v8_c6_tma");
  CHECK(pick("layernorm.bwd.bf16.w_f32.n12288.bias") != "t128_r1_v8_c6_tma");
  // RMSNorm's three-stage rows at 9736-10752 and two-stage ones at 13312-16384.
  CHECK(pick("rmsnorm.bwd.bf16.w_f32.n10240.residual") == "t640_r1_v8_tma3");
  CHECK(pick("rmsnorm.bwd.bf16.w_f32.n13312.residual") == "t832_r1_v8_tma");
  // Two-CTA rows where one CTA would take 1024 threads (RMS 15880-16384) and LN 14344-16384,
  // ragged where the packs split unevenly (16376: 2047 packs).
  CHECK(pick("rmsnorm.bwd.bf16.w_f32.n16384.residual") == "t512_r1_v8_c2_tma");
  CHECK(pick("rmsnorm.bwd.bf16.w_f32.n16376.residual") == "t512_r1_v8_c2_tma");
  CHECK(pick("layernorm.bwd.bf16.w_f32.n15360.bias.residual") == "t480_r1_v8_c2_tma");
  // RMSNorm's clusters of 5 (pipelined bulk copies) at 16392-18424, of two past them, and of 14
  // CTAs at 26624-28664; 28672 takes the plain row's two CTAs.
  CHECK(pick("rmsnorm.bwd.bf16.w_f32.n17408.residual") == "t224_r1_v8_c5_tma3");
  CHECK(pick("rmsnorm.bwd.bf16.w_f32.n18432.residual") == "t640_r1_v8_c2_tma");
  CHECK(pick("rmsnorm.bwd.bf16.w_f32.n18440.residual") == "t256_r1_v8_c5_tma3");
  CHECK(pick("rmsnorm.bwd.bf16.w_f32.n27648.residual") == "t128_r1_v8_c14_tma");
  CHECK(pick("rmsnorm.bwd.bf16.w_f32.n28672.residual") == pick("rmsnorm.bwd.bf16.w_f32.n28672"));
  CHECK(pick("rmsnorm.bwd.bf16.w_f32.n30720.residual") == pick("rmsnorm.bwd.bf16.w_f32.n30720"));
  // A residual forward is not a bwd+residual spec.
  CHECK(pick("layernorm.fwd_train.bf16.n1024.bias.residual") == pick("layernorm.fwd_train.bf16.n1024.bias"));
}
