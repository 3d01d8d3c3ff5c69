// Forward kernels against the fp64 reference on fresh random inputs.
#include <unistd.h>

#include <filesystem>
#include <optional>

#include "tests/gpu/gpu_common.hpp"

using namespace gpu_test;

namespace {
// The forward grid in two doctest cases (its sizes dealt out in turn): whole, it took 384 s of
// the GPU suite's 493 (H200, 12 cases at a time).
constexpr int kForwardGridShards = 2;
// A shard without its TEST_CASE below would leave its sizes unchecked.
static_assert(kForwardGridShards == 2, "one TEST_CASE a shard below");

void check_forward_grid(int shard) {
  // 40960 / 61440: 2-byte x rows of 4-element packs in 1024 threads' registers (sm_90; LayerNorm
  // at 61440 a 2-CTA shared row); 131072: LayerNorm in 8 CTAs, RMSNorm in 4.
  // LayerNorm, 2-byte x: 17408 / 18432 in registers (two CTAs of 544-576 threads per SM), 22528
  // a one-CTA shared row, 32768 in 8-byte packs, 36864-57344 in registers (up to 8 packs a
  // thread), 65536 in 2 CTAs; RMSNorm 65536 in one CTA's shared memory. 50000 / 58584: rows whose
  // packs split over no 1024 threads or cluster evenly, in registers of 8 packs a thread.
  // 98312: 2-byte x past 65536 whose packs no cluster splits evenly: 4 CTAs of unequal segments.
  const std::vector<int64_t> ns = grid_shard(grid_ns({1, 7, 127, 256, 1000, 2880, 4096, 4097, 8192, 17408, 18432, 20001, 20480, 22528, 32768, 36864, 40960, 50000, 57344, 58584, 61440, 65536, 98312, 131072, 262144}),
                                              shard, kForwardGridShards);
  if (ns.empty()) return;
  std::vector<Case> cases;
  for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm, Norm::kAdaLayerNorm, Norm::kAdaRMSNorm})
    for (Phase phase : {Phase::kForwardTraining, Phase::kForwardInference})
      for (DType x : {DType::kF32, DType::kF16, DType::kBF16})
        for (DType w : weight_dtypes_for(x))
          for (int64_t n : ns)
            for (bool bias : {false, true}) {
              Case c;
              c.spec = Spec::make(norm, phase, x, n, bias);
              c.spec.w_dtype = w;
              // rows = 1, an odd count, and enough rows to cover several CTAs; fewer for huge rows.
              for (int64_t rows : {int64_t(1), n >= 65536 ? int64_t(3) : int64_t(37), n <= 1000 ? int64_t(1031) : int64_t(0)}) {
                if (rows == 0) continue;
                c.rows = rows;
                c.rows_per_batch = is_adaptive(norm) ? (rows == 1031 ? 1031 : 1) : 0;
                if (is_adaptive(norm) && rows == 37) c.rows_per_batch = 37;
                cases.push_back(c);
              }
              if (is_adaptive(norm) && n <= 32768) {  // several batches
                c.rows = 4 * 9;
                c.rows_per_batch = 9;
                cases.push_back(c);
              }
            }
  std::vector<Spec> specs;
  for (const auto& c : cases) specs.push_back(c.spec);
  warm(specs);
  for (const Case& c : cases) {
    const std::string name = c.spec.str();
    CAPTURE(name);
    CAPTURE(c.rows);
    CHECK(run_forward(c).worst <= 1.0);
  }
  MESSAGE(cases.size() << " forward cases checked on " << runtime().device().name << " (shard " << shard + 1
                        << " of " << kForwardGridShards << ")");
}
}  // namespace

TEST_CASE("forward kernels match the fp64 reference over ops x dtypes x N x rows, shard 1 of 2") { check_forward_grid(0); }
TEST_CASE("forward kernels match the fp64 reference over ops x dtypes x N x rows, shard 2 of 2") { check_forward_grid(1); }

TEST_CASE("pinned shared-memory rows (smem), alone and across clusters, match the reference") {
  // Pinned configs the heuristic may not pick for these N; the tuner may.
  for (const char* text : {"layernorm.fwd_train.bf16.w_bf16.n65536.bias.cfg_t1024_r1_v8_smem",
                           "rmsnorm.fwd_train.bf16.w_f32.n65536.cfg_t512_r1_v8_smem",
                           "layernorm.fwd_train.f32.w_f32.n32768.bias.relu_bitmask.cfg_t1024_r1_v4_smem",
                           "adalayernorm.fwd_infer.f16.w_f32.n100000.bias.gelu.cfg_t1024_r1_v8_smem",
                           "rmsnorm.fwd_train.bf16.w_bf16.n4097.cfg_t256_r1_v1_smem",
                           "layernorm.fwd_infer.f32.w_bf16.n7.cfg_t64_r1_v1_smem",
                           // A cluster's CTAs each keep one segment (very large rows).
                           "layernorm.fwd_train.bf16.w_bf16.n262144.bias.cfg_t1024_r1_v8_c4_smem",
                           "rmsnorm.fwd_train.f32.w_f32.n262144.cfg_t1024_r1_v4_c8_smem",
                           "layernorm.fwd_train.bf16.w_bf16.n131072.bias.relu_bitmask.cfg_t512_r1_v8_c2_smem",
                           "adalayernorm.fwd_train.f16.w_f32.n98304.bias.cfg_t768_r1_v8_c2_smem",
                           // 512-thread rows capped at two CTAs per SM (64 registers).
                           "layernorm.fwd_train.bf16.w_bf16.n19456.bias.cfg_t512_r1_v8_smem",
                           "rmsnorm.fwd_infer.f16.w_f32.n19968.relu_bitmask.cfg_t512_r1_v8_smem"}) {
    const Case c = pinned_case(text, 100.0);  // x0-centered sums: the mean far from zero
    const std::string name = text;
    CAPTURE(name);
    CHECK(run_forward(c).worst <= 1.0);
  }
}

TEST_CASE("ragged clusters: a forward row's CTAs take unequal segments, in shared memory and registers") {
  // The cluster does not divide the row's packs: each CTA takes the rounded-up share, the last
  // CTA the rest (65608: 8201 packs, 3 x 2051 + 2048 over 4 CTAs).
  for (const char* text : {"layernorm.fwd_train.bf16.w_bf16.n65608.bias.cfg_t288_r1_v8_c4_smem",
                           "rmsnorm.fwd_train.bf16.w_bf16.n65608.cfg_t544_r1_v8_c2_smem",
                           "rmsnorm.fwd_infer.bf16.w_f32.n131112.relu_bitmask.cfg_t288_r1_v8_c8_smem",
                           "layernorm.fwd_train.f32.w_f32.n98316.bias.cfg_t1024_r1_v4_c8_smem",
                           "adalayernorm.fwd_train.f16.w_f32.n200008.bias.gelu.cfg_t416_r1_v8_c8_smem",
                           "layernorm.fwd_infer.bf16.w_bf16.n262136.bias.cfg_t512_r1_v8_c8_smem",
                           "layernorm.fwd_infer.bf16.w_bf16.n4104.bias.cfg_t160_r1_v8_c2_reg",
                           "adarmsnorm.fwd_train.f16.w_f16.n20008.relu_bitmask.cfg_t320_r1_v8_c4_reg",
                           "rmsnorm.fwd_train.bf16.w_bf16.n20008.residual.cfg_t320_r1_v8_c4_reg",
                           "layernorm.fwd_train.bf16.w_bf16.n65608.bias.residual.cfg_t288_r1_v8_c4_smem",
                           // clusters of 3, 5 and 6 CTAs
                           "layernorm.fwd_train.bf16.w_bf16.n65608.bias.cfg_t416_r1_v8_c5_smem",
                           "rmsnorm.fwd_infer.bf16.w_bf16.n20008.cfg_t448_r1_v8_c6_reg",
                           "layernorm.fwd_train.bf16.w_bf16.n24576.bias.cfg_t512_r1_v8_c3_reg"}) {
    const Case c = pinned_case(text, 100.0);
    const std::string name = text;
    CAPTURE(name);
    const ForwardRun r = run_forward(c);
    CHECK(r.worst <= 1.0);
    CHECK(r.mask_mismatches == 0);
  }
  // Quantized outputs over ragged segments: codes and scales against the host references. The
  // block-scaled ones round each CTA's segment up to whole scale blocks (65608 MXFP8 over 4 CTAs:
  // 2052 packs a CTA, 2045 in the last; 65584 over 2 CTAs divides the packs, 4099 each, but not
  // into 32-value blocks: 4100 and 4098).
  for (const char* text : {"layernorm.fwd_train.bf16.w_bf16.n65608.bias.fp8_e4m3.cfg_t288_r1_v8_c4_smem",
                           "rmsnorm.fwd_infer.bf16.w_bf16.n65608.int8_row.cfg_t288_r1_v8_c4_smem",
                           "rmsnorm.fwd_infer.bf16.w_bf16.n98312.fp8_e4m3_row.cfg_t416_r1_v8_c4_smem",
                           "rmsnorm.fwd_infer.bf16.w_bf16.n65608.mxfp8_e4m3.cfg_t288_r1_v8_c4_smem",
                           "rmsnorm.fwd_infer.bf16.w_bf16.n65584.mxfp8_e5m2.cfg_t544_r1_v8_c2_smem",
                           "layernorm.fwd_train.bf16.w_bf16.n98312.bias.mxfp4.cfg_t416_r1_v8_c8_smem",
                           "rmsnorm.fwd_infer.bf16.w_bf16.n131112.nvfp4.cfg_t544_r1_v8_c8_smem",
                           "layernorm.fwd_infer.bf16.w_bf16.n20008.bias.mxfp8_e4m3.cfg_t320_r1_v8_c4_reg"}) {
    Case c = pinned_case(text);
    c.rows = 5;
    c.rows_per_batch = 0;
    const std::string name = text;
    CAPTURE(name);
    const ForwardRun r = run_forward(c);
    CHECK(r.worst <= 1.0);
    CHECK(r.quant_checked == c.rows * c.spec.n);
    CAPTURE(r.quant_first_mismatch);
    CHECK(r.quant_mismatches == 0);
  }
}

TEST_CASE("pipelined rows (pipe, pipe3, pipe4, tma): a persistent grid of 2-4 row buffers matches the reference") {
  for (const char* text : {"layernorm.fwd_train.bf16.w_bf16.n40960.bias.cfg_t1024_r1_v8_pipe",
                           "rmsnorm.fwd_train.bf16.w_f32.n49152.cfg_t1024_r1_v8_pipe",
                           "layernorm.fwd_infer.f16.w_f16.n8192.relu_bitmask.cfg_t256_r1_v8_pipe",
                           "adalayernorm.fwd_train.bf16.w_f32.n12288.bias.gelu.cfg_t384_r1_v8_pipe",
                           "layernorm.fwd_train.f32.w_f32.n4097.bias.cfg_t128_r1_v1_pipe",
                           "rmsnorm.fwd_train.bf16.w_bf16.n1000.cfg_t64_r1_v2_pipe",
                           "layernorm.fwd_train.bf16.w_bf16.n131072.bias.cfg_t1024_r1_v8_c4_pipe",
                           "rmsnorm.fwd_train.bf16.w_bf16.n262144.bias.relu_bitmask.cfg_t1024_r1_v8_c8_pipe",
                           "layernorm.fwd_train.bf16.w_bf16.n65536.bias.cfg_t256_r1_v8_c4_pipe4",
                           "rmsnorm.fwd_train.bf16.w_bf16.n40960.cfg_t512_r1_v8_c2_pipe3",
                           "layernorm.fwd_train.f32.w_f32.n4097.bias.cfg_t128_r1_v1_pipe3",
                           "adalayernorm.fwd_train.bf16.w_f32.n12288.bias.gelu.cfg_t384_r1_v8_pipe4",
                           "rmsnorm.fwd_train.bf16.w_bf16.n262144.cfg_t512_r1_v8_c8_pipe3",
                           // gamma and beta held in registers (<= 512 threads, <= 4 packs)
                           "layernorm.fwd_train.bf16.w_bf16.n65536.bias.cfg_t512_r1_v8_c4_pipe",
                           "layernorm.fwd_train.f16.w_f16.n12288.bias.cfg_t384_r1_v8_pipe3",
                           // Bulk copies: one thread fills the buffer, an mbarrier releases it.
                           "layernorm.fwd_train.bf16.w_bf16.n40960.bias.cfg_t1024_r1_v8_tma",
                           "rmsnorm.fwd_infer.f16.w_f16.n8192.relu_bitmask.cfg_t256_r1_v8_tma3",
                           "adalayernorm.fwd_train.bf16.w_f32.n12288.bias.gelu.cfg_t384_r1_v8_tma",
                           "layernorm.fwd_train.f32.w_f32.n4096.bias.cfg_t128_r1_v4_tma4",
                           "layernorm.fwd_train.bf16.w_bf16.n65536.bias.cfg_t256_r1_v8_c4_tma",
                           "rmsnorm.fwd_train.bf16.w_bf16.n262144.bias.relu_bitmask.cfg_t1024_r1_v8_c8_tma"}) {
    Case c = pinned_case(text, 100.0);
    // Several rows per CTA (cluster) of the persistent grid.
    c.rows = c.spec.n >= 131072 ? 3 * 67 : 3 * 331;
    c.rows_per_batch = is_adaptive(c.spec.norm) ? c.rows / 3 : 0;
    const std::string name = text;
    CAPTURE(name);
    CAPTURE(c.rows);
    CHECK(run_forward(c).worst <= 1.0);
    c.rows = 3;
    c.rows_per_batch = is_adaptive(c.spec.norm) ? 3 : 0;
    CHECK(run_forward(c).worst <= 1.0);
  }
}

TEST_CASE("epilogues forward: relu_bitmask (mask exact) and gelu, with every op") {
  int checked = 0;
  for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm, Norm::kAdaLayerNorm, Norm::kAdaRMSNorm})
    for (Epilogue ep : {Epilogue::kReluBitmask, Epilogue::kGelu})
      for (DType x : {DType::kF32, DType::kF16, DType::kBF16})
        for (int64_t n : {1, 3, 7, 9, 127, 768, 1000, 4097, 8192, 28672, 65536}) {
          Case c;
          c.spec = Spec::make(norm, Phase::kForwardTraining, x, n, true);
          c.spec.epilogue = ep;
          c.rows = n >= 65536 ? 3 : 37;
          c.rows_per_batch = is_adaptive(norm) ? c.rows : 0;
          c.clip_lower = 0.f;
          c.clip_upper = 1.5f;  // both clips bind often with y ~ N(0, 1.2)
          const std::string name = c.spec.str();
          CAPTURE(name);
          const ForwardRun r = run_forward(c);
          CHECK(r.worst <= 1.0);
          CHECK(r.mask_mismatches == 0);
          CHECK(r.mask_ref_mismatches == 0);
          ++checked;
        }
  MESSAGE(checked << " epilogue forward cases");
}

// The most of a quantized case's codes (N >= 32) that may sit on a rounding boundary: 1 / this (+ 5).
constexpr int64_t kAmbiguousPerCase = 20;

// Per-tensor FP8 over every op x dtype x N x row layout; generic: through the generic kernels.
void gpu_test::check_fp8_grid(bool generic) {
  std::optional<GenericKernelsOn> generic_on;
  if (generic) generic_on.emplace();
  int64_t checked = 0, ambiguous = 0;
  int cases = 0;
  for (Epilogue ep : {Epilogue::kFp8E4M3, Epilogue::kFp8E5M2})
    for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm, Norm::kAdaLayerNorm, Norm::kAdaRMSNorm})
      for (DType x : {DType::kF32, DType::kF16, DType::kBF16})
        for (int64_t n : {1, 7, 127, 768, 4097, 20001, 65536})
          for (int layout = 0; layout < 3; ++layout) {  // contiguous; strided; strided and unaligned
            Case c;
            c.spec = Spec::make(norm, (n + layout) % 2 ? Phase::kForwardTraining : Phase::kForwardInference, x, n,
                                norm != Norm::kRMSNorm);
            c.spec.epilogue = ep;
            c.spec.residual = layout == 1 && n % 7 == 0;
            c.rows = n >= 65536 ? 3 : 37;
            c.rows_per_batch = is_adaptive(norm) ? c.rows : 0;
            c.row_stride = layout > 0 ? n + 9 : 0;
            c.x_offset = layout == 2 ? 1 : 0;
            const std::string name = c.spec.str();
            CAPTURE(name);
            CAPTURE(layout);
            const ForwardRun r = run_forward(c);
            CHECK(r.worst <= 1.0);  // y in x's dtype, written beside the codes
            CHECK(r.quant_checked == c.rows * n);
            CAPTURE(r.quant_first_mismatch);
            CAPTURE(r.quant_ambiguous_where);
            CHECK(r.quant_mismatches == 0);
            CHECK(r.amax_rel_err <= 1e-5);
            // The boundary window must stay narrow, or the exact check would check little: at
            // most 5 % of a case (N >= 32), 1 % of the grid. Not for N < 32: there y is often β or
            // ±β + γ exactly, whose bf16 / f16 bits may sit on an FP8 midpoint (round half to even
            // decides; the window accepts either). A small case's count swings with its data: at
            // N = 127 with per-row scales, y · 448 / amax is a ratio of products of bf16 values
            // and lands near midpoints more often than uniform values would (one seed: 89 of 4699
            // codes, at most 4 a row, 0.14 % over the grid).
            if (n >= 32) CHECK(r.quant_ambiguous <= r.quant_checked / kAmbiguousPerCase + 5);
            checked += r.quant_checked;
            ambiguous += r.quant_ambiguous;
            ++cases;
          }
  MESSAGE(cases << std::string(generic ? " generic" : "") << " fp8 cases, " << checked
                << " codes checked against the host encoding, " << ambiguous
                << " of them on a rounding boundary (either neighbour accepted)");
  CHECK(ambiguous <= checked / 100);
}

TEST_CASE("quantized output: fp8 e4m3 / e5m2 codes and amax against the host references") { check_fp8_grid(false); }

// The per-row and block-scaled epilogues over every op x dtype x N x row layout (bf16_only: with
// bf16 x only, its code path being another format's), plus pinned specs of other row caches. At
// N >= 32 a case may have at most 5 % of its codes (+ 5) on a rounding boundary, and the grid at
// most 1 / ambiguous_divisor of them (a row of N = 32 is one scale block, and a block with a small
// scale has a wide window for all its codes at once: MXFP8, f16 x, 39 of 1184 in one run).
// Block-scaled formats run each case with both scale layouts (row-major, swizzled 128x4); e2m1
// codes (two a byte) take even row strides and offsets.
void check_quantized_grid(const char* what, std::initializer_list<Epilogue> formats, Epilogue bf16_only,
                          std::initializer_list<int64_t> ns, std::initializer_list<const char*> pinned,
                          int64_t ambiguous_divisor, bool generic) {
  std::optional<GenericKernelsOn> generic_on;
  if (generic) generic_on.emplace();
  int64_t checked = 0, ambiguous = 0;
  int cases = 0;
  auto check = [&](Case& c, int layout) {
    const std::string name = c.spec.str();
    const std::string scale_layout = to_string(c.scale_layout);
    CAPTURE(name);
    CAPTURE(layout);
    CAPTURE(scale_layout);
    c.rows_per_batch = is_adaptive(c.spec.norm) ? c.rows : 0;
    const ForwardRun r = run_forward(c);
    CAPTURE(r.quant_first_mismatch);
    CAPTURE(r.quant_ambiguous_where);
    CHECK(r.worst <= 1.0);  // y in x's dtype, written beside the codes
    CHECK(r.quant_checked == c.rows * c.spec.n);
    CHECK(r.quant_mismatches == 0);
    CHECK(r.row_scale_rel_err <= 2e-5);  // per-row scales (0 elsewhere)
    // See the fp8 case: each case at most 5 %, the grid at most 1 / ambiguous_divisor.
    if (c.spec.n >= 32) CHECK(r.quant_ambiguous <= r.quant_checked / kAmbiguousPerCase + 5);
    checked += r.quant_checked;
    ambiguous += r.quant_ambiguous;
    ++cases;
  };
  auto check_layouts = [&](Case& c, int layout) {
    for (BlockScaleLayout scales : {BlockScaleLayout::kRowMajor, BlockScaleLayout::kSwizzled}) {
      if (scales != BlockScaleLayout::kRowMajor && !scales_per_block(c.spec.epilogue)) continue;
      c.scale_layout = scales;
      check(c, layout);
    }
  };
  for (Epilogue ep : formats)
    for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm, Norm::kAdaLayerNorm, Norm::kAdaRMSNorm})
      for (DType x : {DType::kF32, DType::kF16, DType::kBF16}) {
        if (ep == bf16_only && x != DType::kBF16) continue;
        for (int64_t n : ns)
          for (int layout = 0; layout < (n > 65536 ? 1 : 3); ++layout) {  // contiguous; strided; strided, unaligned
            Case c;
            c.spec = Spec::make(norm, (n + layout) % 2 ? Phase::kForwardTraining : Phase::kForwardInference, x, n,
                                norm != Norm::kRMSNorm);
            c.spec.epilogue = ep;
            c.spec.residual = layout == 1 && n % 7 == 0;
            c.rows = n >= 65536 ? 3 : 37;
            const bool fp4 = packs_fp4(ep);
            c.row_stride = layout > 0 ? n + (fp4 ? 10 : 9) : 0;
            c.x_offset = layout == 2 ? (fp4 ? 2 : 1) : 0;
            check_layouts(c, layout);
          }
      }
  for (const char* spec : pinned) {
    Case c;
    c.spec = Spec::parse(spec);
    c.rows = 300;  // several rows per persistent CTA; three 128-row bands of swizzled scales
    check_layouts(c, 0);
  }
  MESSAGE(cases << std::string(generic ? " generic " : " ") << std::string(what) << " cases, " << checked << " codes checked against the host encoding, " << ambiguous
                << " codes or scales on a rounding boundary (either neighbour accepted)");
  CHECK(ambiguous <= checked / ambiguous_divisor);
}

void gpu_test::check_row_quant_grid(bool generic) {
  // The pinned specs: pipelined rows (pipe, tma), which the heuristic picks at other shapes, and
  // clustered rows (registers, shared memory, bulk-copied), whose amax is reduced over the cluster.
  check_quantized_grid("per-row", {Epilogue::kFp8E4M3Row, Epilogue::kInt8Row, Epilogue::kFp8E5M2Row},
                       Epilogue::kFp8E5M2Row,
                       {1, 7, 127, 768, 4097, 20001, 65536, 262144},
                       {"rmsnorm.fwd_infer.bf16.w_bf16.n8192.int8_row.cfg_t512_r1_v8_tma3",
                        "layernorm.fwd_train.bf16.w_bf16.n12288.bias.fp8_e4m3_row.cfg_t512_r1_v8_pipe",
                        "layernorm.fwd_infer.f16.w_f32.n6144.bias.fp8_e4m3_row.cfg_t256_r1_v8_pipe4",
                        "rmsnorm.fwd_infer.bf16.w_bf16.n65536.fp8_e4m3_row.cfg_t1024_r1_v8_c2_reg",
                        "layernorm.fwd_train.bf16.w_bf16.n98304.bias.int8_row.cfg_t384_r1_v8_c4_smem",
                        "rmsnorm.fwd_infer.bf16.w_bf16.n65536.int8_row.cfg_t512_r1_v8_c4_tma",
                        "layernorm.fwd_infer.bf16.w_f32.n32768.bias.fp8_e5m2_row.cfg_t512_r1_v8_c2_pipe"},
                       100, generic);
}

void gpu_test::check_mxfp8_grid(bool generic) {
  // The window is y's fp32 tolerance divided by X, wide in code units where X is small: 2 %
  // (N = 32 rows with unaligned x had 21 of 1184 codes or scales on a boundary on an H100).
  check_quantized_grid("MXFP8", {Epilogue::kMxfp8E4M3, Epilogue::kMxfp8E5M2}, Epilogue::kMxfp8E5M2,
                       {1, 7, 32, 127, 768, 4097, 20001, 65536, 262144},
                       {"rmsnorm.fwd_infer.bf16.w_bf16.n8192.mxfp8_e4m3.cfg_t512_r1_v8_tma3",
                        "layernorm.fwd_train.bf16.w_bf16.n12288.bias.mxfp8_e4m3.cfg_t512_r1_v8_pipe",
                        "rmsnorm.fwd_infer.bf16.w_bf16.n65536.mxfp8_e4m3.cfg_t512_r1_v8_c4_smem"},
                       50, generic);
}

void gpu_test::check_fp4_grid(bool generic) {
  // Every dtype for both (Epilogue::kNone: no format is bf16 only). Pinned: pipelined and
  // clustered rows, and one-element packs (vec 1), whose lanes pair up to fill a byte, across
  // sub-warp rows too (16 lanes a row, two rows a warp).
  check_quantized_grid("MXFP4 / NVFP4", {Epilogue::kMxfp4, Epilogue::kNvfp4}, Epilogue::kNone,
                       {2, 8, 32, 126, 768, 4098, 20002, 65536, 262144},
                       {"rmsnorm.fwd_infer.bf16.w_bf16.n8192.nvfp4.cfg_t512_r1_v8_tma3",
                        "layernorm.fwd_train.bf16.w_bf16.n12288.bias.mxfp4.cfg_t512_r1_v8_pipe",
                        "rmsnorm.fwd_infer.bf16.w_bf16.n65536.nvfp4.cfg_t512_r1_v8_c4_smem",
                        "rmsnorm.fwd_infer.f32.w_f32.n2048.mxfp4.cfg_t128_r1_v1_reg",
                        "rmsnorm.fwd_infer.f32.w_f32.n256.nvfp4.cfg_t16_r16_v1_reg"},
                       50, generic);
}

TEST_CASE("quantized output: per-row fp8 / int8 scales and codes against the host references") {
  check_row_quant_grid(false);
}
TEST_CASE("quantized output: MXFP8 block scales and codes against the host references") { check_mxfp8_grid(false); }
TEST_CASE("quantized output: MXFP4 and NVFP4 block scales and e2m1 codes against the host references") {
  check_fp4_grid(false);
}

TEST_CASE("variance has no cancellation: x = 1e4 + noise in f32") {
  for (int64_t n : {7, 1000, 4096, 65536, 262144}) {
    Case c;
    c.spec = Spec::make(Norm::kLayerNorm, Phase::kForwardTraining, DType::kF32, n, true);
    c.rows = 5;
    c.center = 1e4;
    CAPTURE(n);
    CHECK(run_forward(c).worst <= 1.0);
  }
}

TEST_CASE("strided rows and unaligned pointers fall back to narrower vectors, still correct") {
  for (const char* text : {"layernorm.fwd_train.bf16.w_bf16.n4096.bias", "rmsnorm.fwd_infer.f16.w_f32.n768",
                           "layernorm.fwd_infer.f32.w_f32.n1000", "rmsnorm.fwd_train.bf16.w_bf16.n65536",
                           "layernorm.fwd_train.f16.w_f16.n768.bias.relu_bitmask",
                           // aligned: 4-element packs in registers; else narrower packs
                           "layernorm.fwd_train.bf16.w_bf16.n40960.bias"}) {
    const std::string name = text;
    for (int64_t offset : {0, 1, 3})
      for (int64_t pad : {0, 1, 8}) {
        Case c;
        c.spec = Spec::parse(text);
        c.rows = 9;
        c.row_stride = c.spec.n + pad;
        c.x_offset = offset;
        CAPTURE(name);
        CAPTURE(offset);
        CAPTURE(pad);
        const ForwardRun r = run_forward(c);
        CHECK(r.worst <= 1.0);
        CHECK(r.mask_mismatches == 0);
      }
  }
}

TEST_CASE("runtime caches: in-process hits after the first get") {
  const Spec s = Spec::parse("rmsnorm.fwd_infer.bf16.w_bf16.n3584");
  const RuntimeCounters before = runtime().counters();
  const Kernel& k1 = runtime().get(s);
  const Kernel& k2 = runtime().get(s);
  const RuntimeCounters after = runtime().counters();
  CHECK(&k1 == &k2);
  CHECK(after.memory_hits == before.memory_hits + 1);
  CHECK(after.compiles + after.disk_hits == before.compiles + before.disk_hits + 1);
}

// normjit-precompile --batch and the tuner store one program's cubin (several specs' kernels) in
// each of its entries: a runtime must load each kernel from such an entry and run it right.
TEST_CASE("batched cache entries: kernels compiled several to a program load from disk and match the reference") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("normjit-batched-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    Runtime rt(0, dir);
    std::vector<Case> cases;
    for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm})
      for (int64_t n : {1024, 2880, 4104, 12288}) {
        Case c;
        c.spec = Spec::make(norm, Phase::kBackward, DType::kBF16, n, norm == Norm::kLayerNorm);
        c.spec.w_dtype = DType::kF32;
        c.rows = 203;
        cases.push_back(c);
      }
    // The backward's forward (training) and the backward itself, each phase one program.
    {
      DiskCacheOptions options;
      DiskCache cache(dir, options);
      for (Phase phase : {Phase::kForwardTraining, Phase::kBackward}) {
        std::vector<Spec> batch;
        for (const Case& c : cases) {
          Spec s = c.spec;
          s.phase = phase;
          batch.push_back(resolve(s, 16, rt.target().arch));
        }
        const std::vector<DiskCache::Lookup> found = cache.lookup_batch(batch, rt.target());
        REQUIRE(found.size() == batch.size());
        for (size_t i = 0; i < found.size(); ++i) {
          CAPTURE(batch[i].str());
          CHECK(found[i].source == DiskCache::Lookup::Source::kCompiled);
          CHECK(found[i].on_disk);
          // One program's image in every entry: all of the batch's kernels are in it.
          CHECK(found[i].binary.image == found[0].binary.image);
        }
      }
    }
    const LaunchingThrough through(rt);
    for (const Case& c : cases) check_backward_case(c);
    const RuntimeCounters counters = rt.counters();
    CHECK(counters.compiles == 0);  // every kernel came from a batched entry
    CHECK(counters.disk_hits == 2 * cases.size());
  }
  fs::remove_all(dir);
}

TEST_CASE("a thread with no current context can launch") {
  const Spec s = Spec::parse("layernorm.fwd_infer.bf16.n512");
  const Kernel& k = runtime().get(s);
  DeviceMem x(512 * 2 * 4), y(512 * 2 * 4), g(512 * 2);
  NORMJIT_CU(cuMemsetD8(x.ptr, 0x3c, 512 * 2 * 4));
  NORMJIT_CU(cuMemsetD8(g.ptr, 0x3c, 512 * 2));
  LaunchArgs a;
  a.x = x.get();
  a.y = y.get();
  a.gamma = g.get();
  a.rows = 4;
  a.row_stride = 512;
  std::string error;
  std::thread worker([&] {
    try {
      k.launch(a);
      NORMJIT_CU(cuCtxSynchronize());
    } catch (const Error& e) {
      error = e.what();
    }
  });
  worker.join();
  CHECK(error == "");
}

TEST_CASE("explicit launch arguments are validated before any launch") {
  const Kernel& k = runtime().get(Spec::parse("layernorm.fwd_infer.bf16.n512"));
  LaunchArgs a;
  CHECK_THROWS_WITH_AS(k.launch(a), doctest::Contains("x is null"), Error);
}

TEST_CASE("local memory per kernel: what the tuners prune by") {
  // ptxas reports an 88-byte stack frame for this config (64 fp32 values per thread of each of x
  // and dy), even compiled again with one CTA per SM asked; none for the others.
  CHECK(runtime().get(Spec::parse("rmsnorm.bwd.f32.w_f32.n16384.cfg_t256_r1_v4_reg")).local_memory_bytes() > 0);
  // The default manifest's spills that the recompile removed (tests/runtime/test_compile.cpp).
  CHECK(runtime().get(Spec::parse("rmsnorm.bwd.f32.w_f32.n4096.cfg_t256_r1_v4_reg")).local_memory_bytes() == 0);
  CHECK(runtime().get(Spec::parse("rmsnorm.bwd.bf16.w_f32.n4096")).local_memory_bytes() == 0);
  CHECK(runtime().get(Spec::parse("layernorm.fwd_train.bf16.w_bf16.n4096.bias")).local_memory_bytes() == 0);
}

TEST_CASE("tune on a miss: the winner is recorded, never slower than the heuristic, and read back in db mode") {
  (void)runtime();  // the shared runtime exists before the environment says "tune"
  const std::filesystem::path db =
      std::filesystem::temp_directory_path() / ("normjit-tune-" + std::to_string(std::random_device{}()) + ".json");
  setenv("NORMJIT_TUNING", "tune", 1);
  setenv("NORMJIT_TUNING_DB", db.c_str(), 1);
  setenv("NORMJIT_TUNE_CANDIDATES", "4", 1);
  const Spec forward = Spec::parse("layernorm.fwd_train.bf16.w_bf16.n4096.bias");
  // Each fusion's launch arguments (the fp32 stream's f32 buffers, bias_in, y for the
  // memory-saving backward, the codes and scales) come from the tuner itself.
  std::vector<Spec> specs = {forward, Spec::parse("rmsnorm.bwd.bf16.w_f32.n2048")};
  for (const char* text : {"rmsnorm.fwd_train.bf16.w_bf16.n4096.residual_f32.bias_in",
                           "layernorm.bwd.bf16.w_bf16.n4096.bias.residual_f32",
                           "layernorm.bwd.bf16.w_f32.n2048.bias.memory_efficient",
                           "rmsnorm.fwd_infer.bf16.w_bf16.n4096.residual.fp8_e4m3_row"})
    specs.push_back(Spec::parse(text));
  {
    Runtime tuning(0, runtime().disk_cache().dir());
    CHECK(tuning.tuning_mode() == TuningMode::kTuneOnMiss);
    std::vector<Spec> tuned;
    for (const Spec& spec : specs) tuned.push_back(tuning.get(spec).spec());
    const TuningDb saved = TuningDb::load(db.string());
    for (size_t i = 0; i < specs.size(); ++i) {
      CAPTURE(specs[i].str());
      const auto e = saved.lookup(tuning.tuning_key(specs[i]));
      REQUIRE(e.has_value());
      CHECK(e->config == *tuned[i].block);
      CHECK(e->us <= e->heuristic_us);
      MESSAGE(specs[i].str() << ": tuned " << tuned[i].str() << " " << e->us << " us, heuristic " << e->heuristic_us
                             << " us");
    }
  }
  setenv("NORMJIT_TUNING", "db", 1);
  {
    Runtime reading(0, runtime().disk_cache().dir());
    const TuningDb saved = TuningDb::load(db.string());
    CHECK(reading.get(forward).spec().block == saved.lookup(reading.tuning_key(forward))->config);
  }
  // A tuned config computes the same function: checked through the shared runtime, pinned.
  Case c;
  c.spec = Spec::parse(forward.str());
  c.spec.block = TuningDb::load(db.string()).lookup(runtime().tuning_key(forward))->config;
  c.rows = 37;
  CHECK(run_forward(c).worst <= 1.0);
  unsetenv("NORMJIT_TUNING");
  unsetenv("NORMJIT_TUNING_DB");
  unsetenv("NORMJIT_TUNE_CANDIDATES");
  std::filesystem::remove(db);
  std::filesystem::remove(db.string() + ".lock");
}

TEST_CASE("back-to-back forward launches that feed each other: each waits for the one before") {
  // The unclustered forward kernels are programmatic dependents of the stream's previous kernel:
  // a chain where each launch reads the last one's y, with no synchronization between them, must
  // give what the host gets applying the norm (and the rounding to x's dtype) as many times.
  constexpr int kSteps = 12;
  for (const char* text : {"rmsnorm.fwd_infer.bf16.w_bf16.n4096", "layernorm.fwd_train.bf16.w_f32.n2880.bias",
                           "rmsnorm.fwd_infer.bf16.w_bf16.n768.residual", "layernorm.fwd_infer.f16.w_f16.n18432.bias"}) {
    const Spec s = resolve(Spec::parse(text));
    CAPTURE(text);
    const int64_t rows = 2048, n = s.n, xs = dtype_size(s.x_dtype), ws = dtype_size(s.w_dtype);
    const std::vector<char> x0 = random_tensor(s.x_dtype, rows * n, 0.0, 1.0);
    const std::vector<char> g = random_tensor(s.w_dtype, n, 1.0, 0.2), b = random_tensor(s.w_dtype, n, 0.0, 0.2);
    const std::vector<char> r = random_tensor(s.x_dtype, rows * n, 0.0, 0.1);
    DeviceMem ping(rows * n * xs), pong(rows * n * xs), gamma(n * ws), beta(n * ws), stats(8 * rows),
        residual(rows * n * xs), h(rows * n * xs);
    ping.upload(x0.data(), x0.size());
    gamma.upload(g.data(), g.size());
    beta.upload(b.data(), b.size());
    residual.upload(r.data(), r.size());
    const Kernel& k = runtime().get(s);
    for (int step = 0; step < kSteps; ++step) {
      LaunchArgs a;
      a.x = (step % 2 ? pong : ping).get();
      a.y = (step % 2 ? ping : pong).get();
      a.gamma = gamma.get();
      a.beta = s.has_bias ? beta.get() : nullptr;
      if (s.phase == Phase::kForwardTraining) {
        a.rstd = reinterpret_cast<float*>(stats.get());
        if (subtracts_mean(s.norm)) a.mean = reinterpret_cast<float*>(stats.get() + 4 * rows);
      }
      if (s.residual) {  // h = x + residual each step; the chain carries y
        a.residual = residual.get();
        a.h = h.get();
      }
      a.rows = rows;
      a.row_stride = n;
      a.eps = 1e-5f;
      k.launch(a);
    }
    NORMJIT_CU(cuCtxSynchronize());
    std::vector<char> got(rows * n * xs);
    (kSteps % 2 ? pong : ping).download(got.data(), got.size());
    // The host chain: fp64 norm of the fp32-rounded input, stored in x's dtype, step after step.
    std::vector<char> cur = x0;
    Spec host = s;
    host.residual = false;
    for (int step = 0; step < kSteps; ++step) {
      std::vector<char> in = cur;
      if (s.residual)
        for (int64_t e = 0; e < rows * n; ++e)
          reference::store(in.data(), s.x_dtype, e,
                           reference::load(cur.data(), s.x_dtype, e) + reference::load(r.data(), s.x_dtype, e));
      const auto ref = reference::forward(host, in.data(), g.data(), s.has_bias ? b.data() : nullptr, rows, n, 1e-5);
      for (int64_t e = 0; e < rows * n; ++e) reference::store(cur.data(), s.x_dtype, e, float(ref.y[e]));
    }
    // The GPU's and the host's roundings may part near a tie and the steps carry that on: compare
    // within a few of x's tolerances (a launch that read its input early would be far off), and
    // count exact matches (most elements).
    int64_t exact = 0, far = 0;
    const reference::Tolerance tol = reference::tolerance(s.x_dtype);
    for (int64_t e = 0; e < rows * n; ++e) {
      const double want = reference::load(cur.data(), s.x_dtype, e), have = reference::load(got.data(), s.x_dtype, e);
      exact += std::memcmp(cur.data() + e * xs, got.data() + e * xs, xs) == 0;
      if (!(std::abs(have - want) <= 8 * (tol.atol + tol.rtol * std::abs(want)))) ++far;
    }
    CHECK(far == 0);
    CHECK(exact > rows * n / 2);
    MESSAGE(std::string(text) << ": " << kSteps << " chained launches, " << exact << " of " << rows * n << " elements exact");
  }
}
