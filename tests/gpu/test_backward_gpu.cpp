// Backward kernels against the fp64 reference (with the GPU forward's mean/rstd/mask), the
// seeds' cases with their tolerances, and bitwise determinism.
#include "tests/gpu/gpu_common.hpp"

using namespace gpu_test;

namespace {
void check_within_tolerance(const BackwardRun& r) {
  CHECK(r.dx <= 1.0);
  CHECK(r.dgamma <= 1.0);
  CHECK(r.dbeta <= 1.0);
}

// The backward grid in three doctest cases (its sizes dealt out in turn): whole, it took 491 of
// the GPU suite's 493 s (H200, 12 cases at a time).
constexpr int kBackwardGridShards = 3;
// A shard without its TEST_CASE below would leave its sizes unchecked.
static_assert(kBackwardGridShards == 3, "one TEST_CASE a shard below");

void check_backward_grid(int shard) {
  // On sm_90 with 2-byte x: 12288-18432 keep x and dy in one CTA's shared memory (or registers
  // at 768 threads), 20001 too with the dbeta sums there, 32768 one CTA or a 2-CTA cluster, 65536
  // a cluster, 262144 an 8-CTA cluster without dbeta and the split route with it; fp32 x registers
  // up to 10240 (12288 without dbeta), then the split route. 12289 and 20001 are odd rows past the
  // register route (1-element packs). Ragged one-buffer cluster segments: 40960 (2 CTAs without
  // dbeta), 81920 (4 CTAs). 20480 / 22528: RMSNorm's one-CTA 3-pack rows by bulk copies; 19456:
  // LayerNorm's 2-CTA bulk row of 608 threads. 40008: 2 CTAs of shared memory in 8-byte packs, where 4
  // CTAs do not divide the packs; 50000, 65608, 131112: clusters of unequal segments in shared
  // memory (ragged), where the split route ran before. 36864, 73728, 172032: bulk-copied clusters
  // whose 2-pack threads are rounded up to whole four-warp groups (1152 packs on 640 threads).
  const std::vector<int64_t> ns = grid_shard(grid_ns({1, 7, 127, 256, 1000, 1024, 2880, 4096, 4097, 8192, 12288, 12289, 16384, 18432, 19456, 20001, 20480, 22528, 32768, 36864, 40008, 40960, 50000, 65536, 65608, 73728, 81920, 131112, 172032, 262144}),
                                              shard, kBackwardGridShards);
  if (ns.empty()) return;
  const std::vector<Case> cases = ops_grid_cases(Phase::kBackward, ns);
  std::vector<Spec> specs;
  for (const auto& c : cases) {
    specs.push_back(c.spec);
    Spec f = c.spec;
    f.phase = Phase::kForwardTraining;
    specs.push_back(f);
  }
  warm(specs);
  for (const Case& c : cases) {
    const std::string name = c.spec.str();
    CAPTURE(name);
    CAPTURE(c.rows);
    CAPTURE(c.rows_per_batch);
    check_within_tolerance(run_backward(c));
  }
  MESSAGE(cases.size() << " backward cases checked on " << runtime().device().name << " (shard " << shard + 1
                        << " of " << kBackwardGridShards << ")");
}
}  // namespace

TEST_CASE("backward matches the fp64 reference over ops x dtypes x N x rows, shard 1 of 3") { check_backward_grid(0); }
TEST_CASE("backward matches the fp64 reference over ops x dtypes x N x rows, shard 2 of 3") { check_backward_grid(1); }
TEST_CASE("backward matches the fp64 reference over ops x dtypes x N x rows, shard 3 of 3") { check_backward_grid(2); }

TEST_CASE("epilogue backward: relu_bitmask consumes the mask, gelu recomputes its input") {
  for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm, Norm::kAdaLayerNorm, Norm::kAdaRMSNorm})
    for (Epilogue ep : {Epilogue::kReluBitmask, Epilogue::kGelu})
      for (DType x : {DType::kF32, DType::kBF16})
        for (int64_t n : {1, 7, 9, 768, 4097, 8192, 16384, 28672, 65536}) {
          Case c;
          c.spec = Spec::make(norm, Phase::kBackward, x, n, true);
          c.spec.w_dtype = DType::kF32;
          c.spec.epilogue = ep;
          c.rows = n >= 65536 ? 5 : 67;
          c.rows_per_batch = is_adaptive(norm) ? c.rows : 0;
          c.clip_upper = 1.5f;
          const std::string name = c.spec.str();
          CAPTURE(name);
          check_within_tolerance(run_backward(c));
        }
}

TEST_CASE("pinned block configurations: clusters of every size and shared-memory rows, forward and backward") {
  // The heuristic picks clusters only where they measured faster; the tuner may pick any valid one.
  for (const char* text : {"layernorm.fwd_train.bf16.w_f32.n32768.bias.cfg_t512_r1_v8_c2_reg",
                           "rmsnorm.fwd_train.f16.w_f16.n65536.bias.relu_bitmask.cfg_t256_r1_v8_c8_reg",
                           "adalayernorm.fwd_train.f32.w_f32.n18432.bias.gelu.cfg_t288_r1_v4_c4_reg",
                           "layernorm.bwd.bf16.w_f32.n28672.bias.relu_bitmask.cfg_t448_r1_v8_c4_reg",
                           "adalayernorm.bwd.f16.w_f32.n12288.bias.gelu.cfg_t384_r1_v8_c2_reg",
                           "rmsnorm.bwd.f32.w_f32.n65536.cfg_t512_r1_v4_c8_reg",
                           // x and dy in shared memory, one CTA or a cluster sharing the row.
                           "layernorm.bwd.bf16.w_f32.n16384.bias.cfg_t512_r1_v8_smem",
                           "rmsnorm.bwd.bf16.w_f32.n16384.cfg_t512_r1_v8_smem",
                           "layernorm.bwd.bf16.w_f32.n18432.bias.cfg_t576_r1_v8_smem",
                           "adalayernorm.bwd.f16.w_f32.n12288.bias.relu_bitmask.cfg_t512_r1_v8_smem",
                           "rmsnorm.bwd.f32.w_f32.n8192.bias.gelu.cfg_t512_r1_v4_smem",
                           "layernorm.bwd.bf16.w_f32.n65536.bias.cfg_t1024_r1_v8_c4_smem",
                           "rmsnorm.bwd.f16.w_f32.n32768.relu_bitmask.cfg_t512_r1_v8_c2_smem",
                           "adalayernorm.bwd.bf16.w_f32.n28672.bias.gelu.cfg_t448_r1_v8_c8_smem",
                           "layernorm.bwd.f16.w_f32.n262144.cfg_t1024_r1_v8_c8_smem"}) {
    const Case c = pinned_case(text);
    const std::string name = text;
    CAPTURE(name);
    if (c.spec.phase == Phase::kBackward) {
      check_within_tolerance(run_backward(c));
    } else {
      CHECK(run_forward(c).worst <= 1.0);
    }
  }
}

TEST_CASE("dbeta sums in shared memory: one CTA, clusters, fp32 x; several rows per CTA") {
  for (const char* text : {"layernorm.bwd.bf16.w_f32.n24576.bias.cfg_t1024_r1_v8_smem",
                           "layernorm.bwd.bf16.w_bf16.n20480.bias.cfg_t864_r1_v8_smem",
                           "layernorm.bwd.bf16.w_f32.n28672.bias.cfg_t896_r1_v8_smem",
                           "adalayernorm.bwd.bf16.w_f32.n49152.bias.relu_bitmask.cfg_t1024_r1_v8_c2_smem",
                           "rmsnorm.bwd.f16.w_bf16.n98304.bias.gelu.cfg_t1024_r1_v8_c4_smem",
                           "layernorm.bwd.f32.w_f32.n12288.bias.cfg_t384_r1_v4_smem"}) {
    Case c = pinned_case(text);
    REQUIRE(dbeta_sums_in_shared(c.spec, *c.spec.block));
    // More rows than the persistent grid has CTAs (clusters), so the sums carry across rows.
    c.rows = 3 * 101 * (c.spec.block->cluster > 1 ? 2 : 1);
    c.rows_per_batch = is_adaptive(c.spec.norm) ? c.rows / 3 : 0;
    const std::string name = text;
    CAPTURE(name);
    check_within_tolerance(run_backward(c));
  }
}

TEST_CASE("pipelined rows (pipe, pipe3, pipe4, tma): later rows copied in while this one runs") {
  // Rows well past the persistent grid (132 CTAs on an H100; clusters: fewer), so every CTA
  // refills its buffers several times and the dgamma/dbeta sums carry across rows.
  for (const char* text : {"layernorm.bwd.bf16.w_f32.n16384.bias.cfg_t1024_r1_v8_pipe",
                           "rmsnorm.bwd.bf16.w_f32.n24576.cfg_t768_r1_v8_pipe",
                           "layernorm.bwd.bf16.w_bf16.n7168.bias.cfg_t448_r1_v8_pipe",
                           "adalayernorm.bwd.f16.w_f32.n12288.bias.relu_bitmask.cfg_t512_r1_v8_pipe",
                           "rmsnorm.bwd.f32.w_f32.n4096.bias.gelu.cfg_t256_r1_v4_pipe",
                           "layernorm.bwd.bf16.w_f32.n18432.bias.cfg_t768_r1_v8_pipe",
                           "layernorm.bwd.bf16.w_f32.n32768.bias.cfg_t1024_r1_v8_c2_pipe",
                           "rmsnorm.bwd.bf16.w_f32.n65536.cfg_t1024_r1_v8_c4_pipe",
                           "layernorm.bwd.bf16.w_f32.n4097.cfg_t160_r1_v1_pipe",
                           "layernorm.bwd.f16.w_f16.n1000.bias.cfg_t64_r1_v2_pipe",
                           // 3-4 buffers: two or three rows in flight, buffers recycled in turn.
                           "layernorm.bwd.bf16.w_f32.n16384.bias.cfg_t512_r1_v8_c2_pipe3",
                           "rmsnorm.bwd.bf16.w_f32.n8192.cfg_t512_r1_v8_pipe4",
                           "layernorm.bwd.bf16.w_f32.n12288.bias.cfg_t128_r1_v8_c2_pipe3",
                           "adalayernorm.bwd.bf16.w_f32.n4096.bias.cfg_t256_r1_v8_pipe3",
                           "layernorm.bwd.f16.w_f16.n1000.bias.cfg_t64_r1_v2_pipe4",
                           // Bulk copies: one thread fills the buffer, an mbarrier releases it.
                           "layernorm.bwd.bf16.w_f32.n16384.bias.cfg_t1024_r1_v8_tma",
                           "rmsnorm.bwd.bf16.w_f32.n4096.cfg_t256_r1_v8_tma",
                           "adalayernorm.bwd.f16.w_f32.n12288.bias.relu_bitmask.cfg_t512_r1_v8_tma",
                           "rmsnorm.bwd.f32.w_f32.n4096.bias.gelu.cfg_t256_r1_v4_tma3",
                           "layernorm.bwd.bf16.w_f32.n32768.bias.cfg_t1024_r1_v8_c2_tma",
                           "rmsnorm.bwd.bf16.w_f32.n65536.cfg_t1024_r1_v8_c4_tma",
                           "layernorm.bwd.bf16.w_f32.n12288.bias.cfg_t128_r1_v8_c2_tma3",
                           "layernorm.bwd.f16.w_f16.n1000.bias.cfg_t64_r1_v8_tma4"}) {
    Case c = pinned_case(text);
    c.rows = c.spec.n >= 32768 ? 2 * 3 * 101 : 3 * 331;
    c.rows_per_batch = is_adaptive(c.spec.norm) ? c.rows / 3 : 0;
    const std::string name = text;
    CAPTURE(name);
    CAPTURE(c.rows);
    check_within_tolerance(run_backward(c));
    c.rows = 5;  // fewer rows than CTAs: a CTA with no row must not prefetch
    c.rows_per_batch = is_adaptive(c.spec.norm) ? 5 : 0;
    check_within_tolerance(run_backward(c));
  }
}

TEST_CASE("ragged clusters backward: a row's CTAs take unequal segments, in shared memory, registers and bulk copies") {
  // 65608: 8201 packs, 7 x 1026 + 1019 over 8 CTAs; the last CTA's partial columns are fewer.
  // 50000: 6250 packs, 3 x 1563 + 1561 over 4; the last CTA's bulk copies are shorter.
  for (const char* text : {"rmsnorm.bwd.bf16.w_f32.n65608.cfg_t544_r1_v8_c8_smem",
                           "layernorm.bwd.bf16.w_f32.n50000.bias.cfg_t800_r1_v8_c4_tma",
                           "rmsnorm.bwd.bf16.w_f32.n65608.cfg_t544_r1_v8_c8_tma3",
                           "layernorm.bwd.bf16.w_f32.n98312.bias.relu_bitmask.cfg_t640_r1_v8_c8_tma",
                           "adalayernorm.bwd.bf16.w_f32.n50000.bias.cfg_t800_r1_v8_c4_tma",
                           "layernorm.bwd.bf16.w_f32.n196600.bias.cfg_t768_r1_v8_c16_tma",  // 1536 x 15 + 1535
                           "layernorm.bwd.bf16.w_f32.n65608.bias.cfg_t544_r1_v8_c4_smem",  // dbeta sums in shared memory
                           "layernorm.bwd.bf16.w_f32.n98312.bias.relu_bitmask.cfg_t800_r1_v8_c8_smem",
                           "adalayernorm.bwd.f16.w_f32.n131112.bias.gelu.cfg_t704_r1_v8_c8_smem",
                           "rmsnorm.bwd.bf16.w_f32.n65608.residual.cfg_t544_r1_v8_c8_smem",
                           "layernorm.bwd.f32.w_f32.n98316.bias.cfg_t1024_r1_v4_c8_smem",
                           "layernorm.bwd.bf16.w_f32.n4104.bias.cfg_t160_r1_v8_c2_reg",
                           "rmsnorm.bwd.bf16.w_f32.n20008.memory_efficient.cfg_t320_r1_v8_c4_reg",
                           "layernorm.bwd.bf16.w_f32.n20008.bias.memory_efficient.cfg_t320_r1_v8_c4_smem",
                           // clusters of any CTA count: 57352 1434 x 4 + 1433 packs over 5, 131112 1821 x 9 (not portable)
                           "layernorm.bwd.bf16.w_f32.n57352.bias.cfg_t736_r1_v8_c5_tma",
                           "rmsnorm.bwd.bf16.w_f32.n131112.cfg_t928_r1_v8_c9_tma",
                           "rmsnorm.bwd.bf16.w_f32.n4104.cfg_t192_r1_v8_c3_reg",
                           "layernorm.bwd.bf16.w_f32.n24576.bias.cfg_t512_r1_v8_c2_smem",  // then c6: keyed apart
                           "layernorm.bwd.bf16.w_f32.n24576.bias.cfg_t512_r1_v8_c6_smem",
                           "adalayernorm.bwd.f16.w_f32.n100008.bias.gelu.cfg_t704_r1_v8_c12_smem"}) {
    Case c = pinned_case(text);
    c.rows = 2 * 3 * 37;
    c.rows_per_batch = is_adaptive(c.spec.norm) ? c.rows / 3 : 0;
    const std::string name = text;
    CAPTURE(name);
    check_within_tolerance(run_backward(c));
  }
}

TEST_CASE("producer-warp rows (ws): one warp fills a ring of 2-8 buffers for the others") {
  for (const char* text : {"layernorm.bwd.bf16.w_f32.n18432.bias.cfg_t576_r1_v8_ws",  // dbeta sums in shared memory
                           "layernorm.bwd.bf16.w_f32.n8192.bias.cfg_t512_r1_v8_ws",   // dbeta sums in registers
                           "rmsnorm.bwd.bf16.w_f32.n16384.cfg_t512_r1_v8_ws",
                           "rmsnorm.bwd.bf16.w_f32.n12288.cfg_t768_r1_v8_ws3",
                           "rmsnorm.bwd.bf16.w_f32.n1024.cfg_t128_r1_v8_ws8",  // one pack a thread: held in registers
                           "rmsnorm.bwd.bf16.w_f32.n4096.cfg_t512_r1_v8_ws4",
                           "layernorm.bwd.bf16.w_f32.n4104.bias.cfg_t544_r1_v8_ws5",  // the last warp's lanes idle
                           "adalayernorm.bwd.f16.w_f32.n12288.bias.relu_bitmask.cfg_t512_r1_v8_ws",
                           "rmsnorm.bwd.f32.w_f32.n4096.bias.gelu.cfg_t256_r1_v4_ws3",
                           "rmsnorm.bwd.bf16.w_f32.n4096.zero_centered.residual.cfg_t256_r1_v8_ws",
                           "layernorm.bwd.bf16.w_bf16.n7168.bias.cfg_t448_r1_v8_ws6"}) {
    Case c = pinned_case(text);
    c.rows = 3 * 331;
    c.rows_per_batch = is_adaptive(c.spec.norm) ? c.rows / 3 : 0;
    const std::string name = text;
    CAPTURE(name);
    CAPTURE(c.rows);
    check_within_tolerance(run_backward(c));
    c.rows = 5;  // fewer rows than CTAs: most producers copy nothing
    c.rows_per_batch = is_adaptive(c.spec.norm) ? 5 : 0;
    check_within_tolerance(run_backward(c));
  }
}

TEST_CASE("16-CTA clusters (non-portable): pinned, and the heuristic's picks past 8 CTAs' shared memory") {
  const int arch = runtime().target().arch;
  if (arch < 90) {
    MESSAGE("SKIPPED: thread-block clusters need sm_90 or newer; this GPU is sm_" << arch);
    return;
  }
  for (const char* text : {"rmsnorm.bwd.f16.w_f16.n8192.cfg_t64_r1_v8_c16_smem",
                           "adalayernorm.bwd.bf16.w_f32.n16384.bias.relu_bitmask.cfg_t128_r1_v8_c16_tma",
                           "layernorm.bwd.bf16.w_f32.n262144.bias.cfg_t1024_r1_v8_c16_smem",
                           "layernorm.bwd.bf16.w_f32.n262144.bias.cfg_t1024_r1_v8_c16_tma",
                           "layernorm.bwd.bf16.w_f32.n262144.bias", "rmsnorm.bwd.f16.w_f32.n262144.bias",
                           // Two packs a thread in 16 CTAs: 640-896 threads, with and without dbeta.
                           "rmsnorm.bwd.bf16.w_f32.n163840", "layernorm.bwd.bf16.w_f32.n196608.bias",
                           "layernorm.bwd.f16.w_f16.n229376.relu_bitmask"}) {
    Case c;
    c.spec = Spec::parse(text);
    const Spec chosen = runtime().choose(c.spec);
    const std::string name = chosen.str();
    CAPTURE(name);
    // The heuristic's picks take 16 CTAs only where the runtime allows them on this device; else
    // a portable cluster or the split route.
    const int cluster = chosen.block->cluster;
    if (c.spec.block || runtime().max_cluster() == 16) CHECK(cluster == 16);
    else CHECK(cluster <= kMaxPortableCluster);
    // More rows than co-resident clusters (at most one per GPC), so each walks several rows.
    for (int64_t rows : {int64_t(3 * 7), int64_t(5)}) {
      c.rows = c.spec.n >= 131072 ? rows : 20 * rows;
      c.rows_per_batch = is_adaptive(c.spec.norm) ? c.rows : 0;
      CAPTURE(c.rows);
      check_within_tolerance(run_backward(c));
    }
  }
  MESSAGE("heuristic clusters up to " << runtime().max_cluster() << " CTAs on this device ("
                                      << runtime().device().dram_gb_per_s << " GB/s peak DRAM, "
                                      << runtime().device().sm_count << " SMs)");
  CHECK(runtime().get(Spec::parse("rmsnorm.fwd_train.bf16.w_bf16.n65536.cfg_t512_r1_v8_c16_reg")).spec().block->cluster == 16);
  Case f = pinned_case("rmsnorm.fwd_train.bf16.w_bf16.n65536.cfg_t512_r1_v8_c16_reg");
  CHECK(run_forward(f).worst <= 1.0);
}

TEST_CASE("the heuristic's bulk-copy picks (sm_90) over many rows per CTA") {
  // Sizes whose default is a bulk-copied (tma) row: 2-3-buffer one-CTA rows and 2-CTA rows.
  const int arch = runtime().target().arch;
  if (arch < 90) {
    MESSAGE("SKIPPED: the heuristic picks bulk copies on sm_90 and newer only; this GPU is sm_" << arch);
    return;
  }
  int bulk = 0;
  for (const char* text : {"layernorm.bwd.bf16.w_f32.n4096.bias", "layernorm.bwd.f16.w_f16.n6144.bias",
                           "layernorm.bwd.bf16.w_f32.n7168.bias", "adalayernorm.bwd.bf16.w_f32.n8192.bias",
                           "layernorm.bwd.bf16.w_bf16.n24576.bias", "layernorm.bwd.f16.w_f32.n26624.bias",
                           "layernorm.bwd.bf16.w_f32.n28672.bias.relu_bitmask", "rmsnorm.bwd.bf16.w_f32.n4096",
                           "rmsnorm.bwd.f16.w_f16.n8192.gelu", "layernorm.bwd.bf16.w_f32.n12288.bias",
                           "layernorm.bwd.f16.w_f16.n16384.bias", "layernorm.bwd.bf16.w_f32.n14336.bias.gelu",
                           "layernorm.bwd.bf16.w_f32.n32768.bias", "rmsnorm.bwd.bf16.w_f32.n32768",
                           // 2-pack rows of 640-896 threads (10000: ragged; 13312: mean/rstd at the
                           // row's start), RMSNorm 2-CTA rows, 4-8-CTA rows of 2 packs.
                           "layernorm.bwd.bf16.w_f32.n10000.bias", "layernorm.bwd.bf16.w_f32.n13312.bias.relu_bitmask",
                           "rmsnorm.bwd.bf16.w_f32.n13312", "rmsnorm.bwd.f16.w_f32.n28672.gelu",
                           "layernorm.bwd.bf16.w_f32.n40960.bias", "layernorm.bwd.bf16.w_f32.n57344.bias",
                           "layernorm.bwd.bf16.w_f32.n114688.bias", "rmsnorm.bwd.bf16.w_f32.n131072"}) {
    Case c;
    c.spec = Spec::parse(text);
    const Spec resolved = resolve(c.spec, 16, arch);
    const std::string name = resolved.str();
    CAPTURE(name);
    CHECK(resolved.block->bulk_copy);
    bulk += resolved.block->bulk_copy;
    for (int64_t rows : {int64_t(3 * 331), int64_t(5)}) {
      c.rows = c.spec.n >= 65536 ? std::min<int64_t>(rows, 31) : c.spec.n >= 24576 ? rows / 3 : rows;
      c.rows_per_batch = is_adaptive(c.spec.norm) ? c.rows : 0;
      CAPTURE(c.rows);
      check_within_tolerance(run_backward(c));
    }
  }
  MESSAGE(bulk << " heuristic picks filled by bulk copies checked");
}

TEST_CASE("unaligned and strided backward") {
  for (const char* text : {"layernorm.bwd.bf16.w_f32.n4096.bias", "rmsnorm.bwd.f16.w_f16.n768",
                           "layernorm.bwd.bf16.w_f32.n65536.bias"}) {
    const std::string name = text;
    for (int64_t offset : {0, 1})
      for (int64_t pad : {0, 3}) {
        Case c;
        c.spec = Spec::parse(text);
        c.rows = 33;
        c.row_stride = c.spec.n + pad;
        c.x_offset = offset;
        CAPTURE(name);
        CAPTURE(offset);
        CAPTURE(pad);
        check_within_tolerance(run_backward(c));
      }
  }
}

TEST_CASE("16-bit x far off zero: dx with the row's constants folded stays within tolerance") {
  // dx = rstd*gd + (x*slope + intercept) cancels |mean|/sigma ulps; these centers hold about the
  // largest |mean|/sigma each dtype can represent at unit spread (bf16 spacing 0.5 at 100, f16 0.5
  // at 1000). Register, bulk-copied, clustered and split rows.
  for (const char* dtype : {"bf16", "f16"})
    for (const char* norm : {"layernorm", "adalayernorm"})
      for (int64_t n : {1024, 4096, 16384, 65536, 262144}) {
        Case c;
        c.spec = Spec::parse(std::string(norm) + ".bwd." + dtype + ".w_f32.n" + std::to_string(n) + ".bias");
        c.rows = n >= 65536 ? 5 : 67;
        c.rows_per_batch = is_adaptive(c.spec.norm) ? c.rows : 0;
        c.center = std::string(dtype) == "bf16" ? 100.0 : 1000.0;
        const std::string name = c.spec.str();
        CAPTURE(name);
        check_within_tolerance(run_backward(c));
      }
}

TEST_CASE("seed 000: AdaLayerNorm 4x1024x768 fp16, forward training and backward (atol 5e-3, rtol 3e-3)") {
  Case c;
  c.spec = Spec::parse("adalayernorm.bwd.f16.w_f16.n768.bias");
  c.rows = 4 * 1024;
  c.rows_per_batch = 1024;
  c.atol = 5e-3;
  c.rtol = 3e-3;
  // run_backward runs the forward training pass first, at the same tolerances.
  const BackwardRun r = run_backward(c);
  CHECK(r.forward <= 1.0);
  check_within_tolerance(r);
}

TEST_CASE("seed 001: LayerNorm + clamped ReLU [0, 6] 4096x768 fp32, bitmask exact, grads at 2e-4") {
  Case f;
  f.spec = Spec::parse("layernorm.fwd_train.f32.w_f32.n768.bias.relu_bitmask");
  f.rows = 4096;
  f.clip_lower = 0.f;
  f.clip_upper = 6.f;
  const ForwardRun r = run_forward(f);
  CHECK(r.worst <= 1.0);
  CHECK(r.mask_mismatches == 0);
  CHECK(r.mask_ref_mismatches == 0);
  Case b = f;
  b.spec.phase = Phase::kBackward;
  b.atol = 2e-4;
  b.rtol = 2e-4;
  check_within_tolerance(run_backward(b));
}

TEST_CASE("seed 003: RMSNorm 4096x128 fp16 with bias, forward training and backward with dbias") {
  Case c;
  c.spec = Spec::parse("rmsnorm.bwd.f16.w_f16.n128.bias");
  c.rows = 4096;
  c.atol = 5e-3;
  c.rtol = 3e-3;
  // run_backward runs the forward training pass first, at the same tolerances.
  const BackwardRun r = run_backward(c);
  CHECK(r.forward <= 1.0);
  check_within_tolerance(r);
}

TEST_CASE("dgamma, dbeta and dx are bitwise identical across 10 runs") {
  for (const char* text : {"layernorm.bwd.bf16.w_f32.n4096.bias", "rmsnorm.bwd.bf16.w_bf16.n256.bias",
                           "adalayernorm.bwd.f16.w_f32.n768.bias", "layernorm.bwd.bf16.w_f32.n65536.bias",
                           "layernorm.bwd.f32.w_f32.n7.bias.relu_bitmask", "rmsnorm.bwd.bf16.w_f32.n32768",
                           "layernorm.bwd.bf16.w_f32.n16384.bias.cfg_t512_r1_v8_smem"}) {
    Case c;
    c.spec = Spec::parse(text);
    c.rows = c.spec.n >= 65536 ? 257 : 4099;
    c.rows_per_batch = is_adaptive(c.spec.norm) ? c.rows : 0;
    std::vector<std::vector<char>> dgammas, dxs;
    const BackwardRun r = run_backward(c, 10, &dgammas, &dxs);
    const std::string name = text;
    CAPTURE(name);
    CHECK(r.dgamma <= 1.0);
    REQUIRE(dgammas.size() == 10);
    int identical = 0;
    for (size_t i = 1; i < dgammas.size(); ++i) identical += dgammas[i] == dgammas[0] && dxs[i] == dxs[0];
    CHECK(identical == 9);
  }
}

TEST_CASE("backward with zero rows writes zero dgamma") {
  Case c;
  c.spec = Spec::parse("layernorm.bwd.f32.w_f32.n64.bias");
  c.rows = 0;
  const BackwardRun r = run_backward(c);
  for (size_t i = 0; i < 64; ++i) CHECK(reference::load(r.dgamma_bytes.data(), DType::kF32, i) == 0.f);
}
