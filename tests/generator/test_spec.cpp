#include <doctest/doctest.h>

#include <tuple>

#include "normjit/normjit.hpp"

using namespace normjit;

TEST_CASE("spec strings round-trip over the whole forward space and with block configs") {
  int count = 0;
  for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm, Norm::kAdaLayerNorm, Norm::kAdaRMSNorm})
    for (Phase phase : {Phase::kForwardTraining, Phase::kForwardInference, Phase::kBackward})
      for (DType x : {DType::kF32, DType::kF16, DType::kBF16})
        for (DType w : {DType::kF32, DType::kF16, DType::kBF16})
          for (int64_t n : {1, 7, 127, 768, 1000, 4097, 65536, 262144})
            for (bool bias : {false, true}) {
              Spec s = Spec::make(norm, phase, x, n, bias);
              s.w_dtype = w;
              s.epilogue = static_cast<Epilogue>(count % 3);
              CHECK(Spec::parse(s.str()) == s);
              const Spec r = resolve(s);
              REQUIRE(r.block.has_value());
              CHECK(Spec::parse(r.str()) == r);
              CHECK(r.str() != s.str());
              ++count;
            }
  CHECK(count == 4 * 3 * 3 * 3 * 8 * 2);
}

TEST_CASE("canonical form is stable and human readable") {
  const Spec s = Spec::parse("layernorm.fwd_train.bf16.w_f32.n4096.bias");
  CHECK(s.norm == Norm::kLayerNorm);
  CHECK(s.phase == Phase::kForwardTraining);
  CHECK(s.x_dtype == DType::kBF16);
  CHECK(s.w_dtype == DType::kF32);
  CHECK(s.n == 4096);
  CHECK(s.has_bias);
  CHECK(s.str() == "layernorm.fwd_train.bf16.w_f32.n4096.bias");
  // The weight dtype defaults to x; the canonical form always prints it.
  CHECK(Spec::parse("rmsnorm.fwd_infer.f16.n7").str() == "rmsnorm.fwd_infer.f16.w_f16.n7");
  CHECK(Spec::parse("adarmsnorm.bwd.bf16.w_f32.n3072.bias.zero_centered").norm == Norm::kAdaRMSNorm);
  CHECK(is_adaptive(Norm::kAdaRMSNorm));
  CHECK_FALSE(subtracts_mean(Norm::kAdaRMSNorm));
  CHECK(base_norm(Norm::kAdaRMSNorm) == Norm::kRMSNorm);
  CHECK(subtracts_mean(Norm::kAdaLayerNorm));
  CHECK_FALSE(is_adaptive(Norm::kRMSNorm));
  const Spec c = Spec::parse("rmsnorm.fwd_infer.f16.w_f16.n128.cfg_t16_r16_v8_reg");
  REQUIRE(c.block);
  CHECK(c.block->threads_per_row == 16);
  CHECK(c.block->rows_per_cta == 16);
  CHECK(c.block->vec == 8);
  CHECK(c.block->cache == RowCache::kRegisters);
  CHECK(c.block->cluster == 1);
  CHECK(Spec::parse("layernorm.fwd_train.bf16.w_bf16.n65536.cfg_t1024_r1_v8_smem").block->cache == RowCache::kShared);
  // A cluster is named only when there is one.
  const char* clustered = "layernorm.bwd.bf16.w_f32.n16384.bias.cfg_t512_r1_v8_c2_reg";
  CHECK(Spec::parse(clustered).block->cluster == 2);
  CHECK(Spec::parse(clustered).str() == clustered);
  const char* non_portable = "layernorm.bwd.bf16.w_f32.n262144.bias.cfg_t1024_r1_v8_c16_pipe";
  CHECK(Spec::parse(non_portable).block->cluster == 16);
  CHECK(Spec::parse(non_portable).str() == non_portable);
  const Spec e = Spec::parse("adalayernorm.bwd.bf16.w_f32.n768.bias.relu_bitmask");
  CHECK(e.norm == Norm::kAdaLayerNorm);
  CHECK(e.phase == Phase::kBackward);
  CHECK(e.epilogue == Epilogue::kReluBitmask);
  CHECK(e.str() == "adalayernorm.bwd.bf16.w_f32.n768.bias.relu_bitmask");
  CHECK(Spec::parse("rmsnorm.fwd_infer.f16.n64.gelu").epilogue == Epilogue::kGelu);
  // The quantizing epilogues: forward only.
  CHECK(Spec::parse("layernorm.fwd_train.bf16.w_f32.n4096.bias.residual.fp8_e4m3").str() ==
        "layernorm.fwd_train.bf16.w_f32.n4096.bias.residual.fp8_e4m3");
  CHECK(Spec::parse("rmsnorm.fwd_infer.f16.n64.fp8_e5m2").epilogue == Epilogue::kFp8E5M2);
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.bwd.f16.n64.fp8_e4m3"),
                       doctest::Contains("epilogue fp8_e4m3 has no backward"), Error);
  // Per-row scaling: three formats, forward only, never a clustered row.
  CHECK(Spec::parse("rmsnorm.fwd_infer.bf16.n4096.residual.int8_row").str() == "rmsnorm.fwd_infer.bf16.w_bf16.n4096.residual.int8_row");
  CHECK(Spec::parse("layernorm.fwd_train.f16.n64.bias.fp8_e4m3_row").epilogue == Epilogue::kFp8E4M3Row);
  CHECK(Spec::parse("layernorm.fwd_train.f16.n64.bias.fp8_e5m2_row").epilogue == Epilogue::kFp8E5M2Row);
  CHECK(scales_per_row(Epilogue::kInt8Row));
  CHECK(!scales_per_tensor(Epilogue::kInt8Row));
  CHECK(quantizes(Epilogue::kInt8Row));
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.bwd.f16.n64.int8_row"), doctest::Contains("epilogue int8_row has no backward"),
                       Error);
  // Clustered rows reduce the row's amax over the cluster: pinned and picked like the plain spec.
  CHECK(Spec::parse("rmsnorm.fwd_infer.bf16.n65536.fp8_e4m3_row.cfg_t1024_r1_v8_c2_reg").block->cluster == 2);
  CHECK(resolve(Spec::parse("rmsnorm.fwd_infer.bf16.n262144.int8_row"), 8, 90, 16).block ==
        resolve(Spec::parse("rmsnorm.fwd_infer.bf16.n262144"), 8, 90, 16).block);
  CHECK(resolve(Spec::parse("rmsnorm.fwd_infer.bf16.n262144.int8_row"), 8, 90, 16).block->cluster > 1);
  // MXFP8: a 32-value block in one pass of a row's lanes, and whole blocks per cluster CTA.
  CHECK(Spec::parse("rmsnorm.fwd_infer.bf16.n4096.mxfp8_e4m3").epilogue == Epilogue::kMxfp8E4M3);
  CHECK(scales_per_block(Spec::parse("layernorm.fwd_train.f32.n64.bias.mxfp8_e5m2").epilogue));
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.bwd.bf16.n64.mxfp8_e4m3"), doctest::Contains("has no backward"), Error);
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.fwd_infer.bf16.n64.mxfp8_e4m3.cfg_t2_r128_v8_reg"),
                       doctest::Contains("threads_per_row=2 x vec=8 must be a multiple of 32"), Error);
  // A cluster's segments are rounded up to whole blocks (32776 packs of 2 over 4 CTAs: 8208 each).
  const Spec mx_cluster = Spec::parse("rmsnorm.fwd_infer.bf16.n65552.mxfp8_e4m3.cfg_t1024_r1_v2_c4_reg");
  CHECK(segment_packs(mx_cluster, *mx_cluster.block) == 8208);
  CHECK(segments_hold_whole_epilogue_units(mx_cluster, *mx_cluster.block));
  for (int64_t n : {1, 7, 33, 100, 4096, 262144})
    for (int vec : {1, 2, 8}) {
      CAPTURE(n);
      CAPTURE(vec);
      const Spec r = resolve(Spec::parse("rmsnorm.fwd_infer.bf16.n" + std::to_string(n) + ".mxfp8_e4m3"), vec);
      CHECK(r.block->threads_per_row * r.block->vec % 32 == 0);
    }
  // MXFP4 / NVFP4: e2m1 codes two a byte (even n), blocks of 32 / 16 values in one pass of the lanes.
  for (const char* text : {"rmsnorm.fwd_infer.bf16.w_bf16.n4096.mxfp4", "layernorm.fwd_train.f32.w_f32.n64.bias.nvfp4",
                           "rmsnorm.fwd_infer.f16.w_f32.n7168.zero_centered.residual.nvfp4.cfg_t448_r1_v2_reg"}) {
    CAPTURE(text);
    CHECK(Spec::parse(text).str() == text);
  }
  CHECK(Spec::parse("rmsnorm.fwd_infer.bf16.n4096.mxfp4").epilogue == Epilogue::kMxfp4);
  CHECK(Spec::parse("rmsnorm.fwd_infer.bf16.n4096.nvfp4").epilogue == Epilogue::kNvfp4);
  CHECK(scales_per_block(Epilogue::kMxfp4));
  CHECK(scales_per_block(Epilogue::kNvfp4));
  CHECK(quantizes(Epilogue::kNvfp4));
  CHECK(packs_fp4(Epilogue::kMxfp4));
  CHECK(!packs_fp4(Epilogue::kMxfp8E4M3));
  CHECK(reads_quant_scale(Epilogue::kNvfp4));
  CHECK(!reads_quant_scale(Epilogue::kMxfp4));
  CHECK(scale_block_size(Epilogue::kMxfp4) == 32);
  CHECK(scale_block_size(Epilogue::kNvfp4) == 16);
  CHECK(scale_block_size(Epilogue::kMxfp8E5M2) == 32);
  CHECK(scale_block_size(Epilogue::kFp8E4M3) == 0);
  // Appended: the older epilogues keep their numbers (the kernel cache key packs them).
  CHECK(static_cast<int>(Epilogue::kMxfp8E5M2) == 9);
  CHECK(static_cast<int>(Epilogue::kMxfp4) == 10);
  CHECK(static_cast<int>(Epilogue::kNvfp4) == 11);
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.fwd_infer.bf16.n4095.mxfp4"),
                       doctest::Contains("n=4095 must be even for mxfp4: two e2m1 codes share a byte"), Error);
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.fwd_infer.bf16.n7.nvfp4"), doctest::Contains("n=7 must be even for nvfp4"),
                       Error);
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.bwd.bf16.n64.nvfp4"), doctest::Contains("epilogue nvfp4 has no backward"),
                       Error);
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.fwd_infer.bf16.n64.nvfp4.cfg_t1_r256_v8_reg"),
                       doctest::Contains("threads_per_row=1 x vec=8 must be a multiple of 16 for nvfp4"), Error);
  CHECK_NOTHROW(Spec::parse("rmsnorm.fwd_infer.bf16.n64.nvfp4.cfg_t2_r128_v8_reg"));  // 16 values: two lanes
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.fwd_infer.bf16.n64.mxfp4.cfg_t2_r128_v8_reg"),
                       doctest::Contains("threads_per_row=2 x vec=8 must be a multiple of 32 for mxfp4"), Error);
  const Spec nv_cluster = Spec::parse("rmsnorm.fwd_infer.bf16.n65568.nvfp4.cfg_t1024_r1_v2_c4_reg");
  CHECK(segment_packs(nv_cluster, *nv_cluster.block) == 8200);  // 32784 packs: 3 x 8200 + 8184
  CHECK_NOTHROW(Spec::parse("rmsnorm.fwd_infer.bf16.n65600.nvfp4.cfg_t1024_r1_v2_c4_reg"));
  for (const char* ep : {"mxfp4", "nvfp4"})
    for (int64_t n : {2, 8, 34, 100, 4096, 262144})
      for (int vec : {1, 2, 8}) {
        CAPTURE(ep);
        CAPTURE(n);
        CAPTURE(vec);
        const Spec r = resolve(Spec::parse("rmsnorm.fwd_infer.bf16.n" + std::to_string(n) + "." + ep), vec);
        CHECK(r.block->threads_per_row * r.block->vec % scale_block_size(r.epilogue) == 0);
      }
  // The fusions: flags after bias, in a fixed order, before the epilogue.
  const Spec f = Spec::parse("rmsnorm.bwd.bf16.w_f32.n7168.bias.zero_centered.residual.relu_bitmask");
  CHECK(f.has_bias);
  CHECK(f.zero_centered);
  CHECK(f.residual);
  CHECK(f.epilogue == Epilogue::kReluBitmask);
  CHECK(f.str() == "rmsnorm.bwd.bf16.w_f32.n7168.bias.zero_centered.residual.relu_bitmask");
  CHECK(f != Spec::parse("rmsnorm.bwd.bf16.w_f32.n7168.bias.residual.relu_bitmask"));
  CHECK(f != Spec::parse("rmsnorm.bwd.bf16.w_f32.n7168.bias.zero_centered.relu_bitmask"));
  CHECK(Spec::parse("layernorm.fwd_infer.f16.n64.residual").str() == "layernorm.fwd_infer.f16.w_f16.n64.residual");
  // The memory-saving backward: after residual, before the block config.
  const Spec m = Spec::parse("adalayernorm.bwd.bf16.w_f32.n4096.bias.zero_centered.residual.memory_efficient");
  CHECK(m.memory_efficient);
  CHECK(m.residual);
  CHECK(m.str() == "adalayernorm.bwd.bf16.w_f32.n4096.bias.zero_centered.residual.memory_efficient");
  CHECK(m != Spec::parse("adalayernorm.bwd.bf16.w_f32.n4096.bias.zero_centered.residual"));
  const Spec pinned = Spec::parse("rmsnorm.bwd.bf16.w_f32.n4096.memory_efficient.cfg_t256_r1_v8_tma3");
  CHECK(pinned.memory_efficient);
  CHECK(Spec::parse(pinned.str()) == pinned);
  // It takes the plain backward's block config.
  Spec plain = m;
  plain.memory_efficient = false;
  CHECK(resolve(m).block == resolve(plain).block);
  // The fp32 residual stream and bias_in: residual_f32 in residual's place, bias_in after it.
  const Spec r = Spec::parse("layernorm.fwd_train.bf16.w_f32.n4096.bias.zero_centered.residual_f32.bias_in.gelu");
  CHECK(r.residual);
  CHECK(r.residual_f32);
  CHECK(r.bias_in);
  CHECK(row_dtype(r) == DType::kF32);
  CHECK(r.str() == "layernorm.fwd_train.bf16.w_f32.n4096.bias.zero_centered.residual_f32.bias_in.gelu");
  CHECK(r != Spec::parse("layernorm.fwd_train.bf16.w_f32.n4096.bias.zero_centered.residual.bias_in.gelu"));
  CHECK(r != Spec::parse("layernorm.fwd_train.bf16.w_f32.n4096.bias.zero_centered.residual_f32.gelu"));
  const Spec in = Spec::parse("rmsnorm.fwd_infer.f16.n64.residual.bias_in");
  CHECK(in.bias_in);
  CHECK(!in.residual_f32);
  CHECK(row_dtype(in) == DType::kF16);
  CHECK(Spec::parse(in.str()) == in);
  const Spec b = Spec::parse("rmsnorm.bwd.bf16.n8192.residual_f32.cfg_t256_r1_v4_pipe3");
  CHECK(Spec::parse(b.str()) == b);
}

TEST_CASE("an fp32 residual stream's rows are f32: the f32 picks or its own rows, never bulk copies") {
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(768), int64_t(2880), int64_t(4096), int64_t(7168), int64_t(12288),
                    int64_t(18432), int64_t(28672), int64_t(65536), int64_t(131072), int64_t(262144)})
    for (Phase phase : {Phase::kForwardTraining, Phase::kForwardInference, Phase::kBackward})
      for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm}) {
        Spec s = Spec::make(norm, phase, DType::kBF16, n, norm == Norm::kLayerNorm);
        s.residual = s.residual_f32 = true;
        Spec f32 = s;
        f32.x_dtype = DType::kF32;
        f32.residual_f32 = false;
        const Spec a = resolve(s), want = resolve(f32);
        const std::string name = a.str();
        CAPTURE(name);
        CHECK(a.block->vec == want.block->vec);
        CHECK(!a.block->bulk_copy);
        // sm90.txt's bwd+residual_f32 rows (4100..18432) and fwd+residual_f32 rows (16388..18432)
        // hold the row in shared memory (LN forward: a 2-CTA cluster's registers); the f32 rows elsewhere.
        const bool own_bwd = phase == Phase::kBackward && n >= 4100 && n <= 18432;
        const bool own_fwd = phase != Phase::kBackward && n >= 16388 && n <= 18432;
        if (own_bwd || (own_fwd && norm == Norm::kRMSNorm)) {
          CHECK(a.block->cache == RowCache::kShared);
        } else if (own_fwd) {
          CHECK(a.block->cluster == 2);
          CHECK(a.block->cache == RowCache::kRegisters);
        } else {
          CHECK(a.block->threads_per_row == want.block->threads_per_row);
          CHECK(a.block->cache == want.block->cache);
          CHECK(a.block->cluster == want.block->cluster);
        }
        CHECK_NOTHROW(validate(a));
        CHECK_NOTHROW(generate(a));
      }
}

TEST_CASE("residual forward rows are never pipelined: resolve() holds the row in shared memory instead") {
  // sm_90's picks pipeline some forward rows (pipe, tma: RMSNorm with a quantized output at
  // 33792-50176), which copy x alone into their buffers.
  int changed = 0;
  for (int64_t n = 1024; n <= kMaxHiddenSize; n += 1024)
    for (Norm norm : {Norm::kLayerNorm, Norm::kRMSNorm})
      for (Epilogue epilogue : {Epilogue::kNone, Epilogue::kFp8E4M3}) {
        Spec unresolved = Spec::make(norm, Phase::kForwardTraining, DType::kBF16, n, true);
        unresolved.epilogue = epilogue;
        const Spec plain = resolve(unresolved);
        Spec with = plain;
        with.block.reset();
        with.residual = true;
        const Spec fused = resolve(with);
        const std::string name = fused.str();
        CAPTURE(name);
        REQUIRE(fused.block);
        CHECK(fused.block->cache != RowCache::kSharedPipelined);
        if (plain.block->cache == RowCache::kSharedPipelined) {
          ++changed;
          CHECK(fused.block->cache == RowCache::kShared);
          CHECK(fused.block->threads_per_row == plain.block->threads_per_row);
          CHECK(fused.block->cluster == plain.block->cluster);
        } else {
          CHECK(*fused.block == *plain.block);
        }
        // The backward may pipeline (its x is h, already in memory); its picks come from the
        // bwd+residual rows where the table has them (test_picks.cpp), else the plain rows.
        Spec bwd = Spec::make(norm, Phase::kBackward, DType::kBF16, n, true);
        bwd.residual = true;
        CHECK_NOTHROW(validate(resolve(bwd)));
      }
  CHECK(changed > 0);
}

TEST_CASE("bad spec strings are rejected with a message naming the problem") {
  struct Bad {
    const char* text;
    const char* needle;
  };
  const Bad bad[] = {
      {"", "expected"},
      {"layernorm", "expected"},
      {"groupnorm.fwd_train.bf16.n4096", "unknown norm 'groupnorm'"},
      {"layernorm.forward.bf16.n4096", "unknown phase 'forward'"},
      {"layernorm.fwd_train.fp8.n4096", "unknown x dtype 'fp8'"},
      {"layernorm.fwd_train.bf16.w_fp64.n4096", "unknown weight dtype"},
      {"layernorm.fwd_train.bf16.w_bf16", "missing hidden size"},
      {"layernorm.fwd_train.bf16.w_bf16.nabc", "not n<integer>"},
      {"layernorm.fwd_train.bf16.w_bf16.n-4", "n=-4 is outside"},
      {"layernorm.fwd_train.bf16.w_bf16.n0", "n=0 is outside"},
      {"layernorm.fwd_train.bf16.w_bf16.n262145", "n=262145 is outside"},
      {"layernorm.fwd_train.bf16.w_bf16.n99999999999999999999", "not n<integer>"},
      {"layernorm.fwd_train.bf16.w_bf16.n64.swish", "unknown token 'swish'"},
      {"layernorm.fwd_train.bf16.w_bf16.n64.gelu.relu_bitmask", "trailing token 'relu_bitmask'"},
      {"layernorm.fwd_train.bf16.w_bf16.n64.none", "unknown token 'none'"},
      {"layernorm.fwd_train.bf16.w_bf16.n64.bias.bias", "unknown token 'bias'"},
      {"layernorm.fwd_train.bf16.w_bf16.n64.residual.bias", "unknown token 'bias'"},
      {"layernorm.fwd_train.bf16.w_bf16.n64.residual.zero_centered", "in this order: bias, zero_centered, residual"},
      {"layernorm.fwd_train.bf16.w_bf16.n64.relu_bitmask.residual", "trailing token 'residual'"},
      {"layernorm.fwd_train.bf16.w_bf16.n64.memory_efficient", "memory_efficient applies to the backward"},
      {"rmsnorm.fwd_infer.bf16.w_bf16.n64.memory_efficient", "phase fwd_infer has none"},
      {"layernorm.bwd.bf16.w_bf16.n64.bias.memory_efficient.relu_bitmask", "epilogue relu_bitmask does not leave invertible"},
      {"rmsnorm.bwd.bf16.w_bf16.n64.memory_efficient.gelu", "epilogue gelu does not leave invertible"},
      {"rmsnorm.bwd.bf16.w_bf16.n64.memory_efficient.residual", "in this order: bias, zero_centered, residual or residual_f32, bias_in, memory_efficient"},
      {"rmsnorm.fwd_train.bf16.w_bf16.n65536.residual.cfg_t256_r1_v8_c4_tma", "residual forward rows cannot be pipelined (tma)"},
      {"rmsnorm.fwd_infer.bf16.w_bf16.n16384.residual.cfg_t512_r1_v8_pipe", "residual forward rows cannot be pipelined (pipe)"},
      {"layernorm.fwd_train.bf16.w_bf16.n64.residual.residual_f32", "give .residual or .residual_f32, not both"},
      {"layernorm.fwd_train.bf16.w_bf16.n64.bias_in", "bias_in is added with the residual"},
      {"layernorm.fwd_train.bf16.w_bf16.n64.bias_in.residual", "in this order: bias, zero_centered, residual or residual_f32, bias_in"},
      {"layernorm.bwd.bf16.w_bf16.n64.residual.bias_in", "bias_in is forward only"},
      {"layernorm.fwd_train.f32.w_f32.n64.residual_f32", "the stream is x's dtype already; use .residual"},
      {"rmsnorm.bwd.bf16.w_bf16.n64.residual_f32.memory_efficient", "memory_efficient with residual_f32 is not supported"},
      {"rmsnorm.bwd.bf16.w_bf16.n4096.residual_f32.cfg_t256_r1_v4_tma", "residual_f32 rows hold fp32 h beside dy"},
      {"rmsnorm.fwd_train.bf16.w_bf16.n4096.residual_f32.cfg_t256_r1_v8_reg", "vec=8 must be a power of two <= 4"},
      {"layernorm.fwd_train.bf16.w_bf16.n64.cfg_t32_r4_v8", "row cache"},
      {"layernorm.fwd_train.bf16.w_bf16.n64.cfg_t32_r4_v3_reg", "vec=3"},
      {"layernorm.fwd_train.bf16.w_bf16.n64.cfg_t32_r4_v16_reg", "vec=16"},
      {"layernorm.fwd_train.f32.w_f32.n64.cfg_t32_r4_v8_reg", "vec=8"},
      {"layernorm.fwd_train.bf16.w_bf16.n64.cfg_t48_r1_v8_reg", "threads_per_row=48"},
      {"layernorm.fwd_train.bf16.w_bf16.n64.cfg_t64_r2_v8_reg", "rows_per_cta=2"},
      {"layernorm.fwd_train.bf16.w_bf16.n64.cfg_t2_r1_v8_reg", "rows_per_cta=1"},
      {"layernorm.fwd_train.bf16.w_bf16.n65536.cfg_t32_r1_v8_reg", "packs per thread"},
      {"layernorm.fwd_train.bf16.w_bf16.n64.cfg_t32_r1_v8_reg.extra", "trailing token 'extra'"},
      {"layernorm.fwd_train.bf16.w_bf16.n64.cfg_t32_r1_v8_reg_x", "row cache"},
      {"layernorm.fwd_train.bf16.w_bf16.n32768.cfg_t512_r1_v8_c17_reg", "cluster=17 must be 1-16 CTAs"},
      {"layernorm.fwd_train.bf16.w_bf16.n32768.cfg_t512_r1_v8_c32_reg", "cluster=32 must be 1-16 CTAs"},
      {"layernorm.fwd_train.bf16.w_bf16.n4096.cfg_t32_r4_v8_c2_reg", "cluster=2 needs CTA-wide rows"},
      {"layernorm.fwd_train.bf16.w_bf16.n32768.cfg_t1024_r1_v8_c2_gmem", "cluster=2 needs CTA-wide rows"},
      {"layernorm.fwd_train.bf16.w_bf16.n32768.cfg_t32_r1_v8_c2_reg", "cluster=2 needs CTA-wide rows"},
      {"layernorm.bwd.bf16.w_bf16.n4104.cfg_t256_r1_v8_c2_pipe", "cluster=2 must divide the row's packs (n / vec): uneven segments are for rows in registers or smem, and the backward's tma rows"},
      {"layernorm.fwd_train.bf16.w_bf16.n4104.cfg_t256_r1_v8_c2_tma", "cluster=2 must divide the row's packs (n / vec): uneven segments are for rows in registers or smem, and the backward's tma rows"},
      {"layernorm.fwd_train.bf16.w_bf16.n65608.cfg_t1024_r1_v8_c2_pipe", "cluster=2 must divide"},
      {"layernorm.fwd_train.bf16.w_bf16.n40.cfg_t64_r1_v8_c4_reg", "cluster=4 leaves the last CTA no packs"},
      {"layernorm.fwd_train.f32.w_f32.n4104.relu_bitmask.cfg_t256_r1_v4_c2_reg", "whole mask bytes"},
      {"layernorm.bwd.bf16.w_bf16.n65536.cfg_t1024_r1_v8_smem", "262144 bytes of shared memory per CTA"},
      {"layernorm.fwd_train.bf16.w_bf16.n262144.cfg_t1024_r1_v8_smem", "524288 bytes of shared memory"},
      {"layernorm.fwd_train.bf16.w_bf16.n256.cfg_t32_r8_v8_smem", "'smem' needs CTA-wide rows"},
      {"layernorm.fwd_train.bf16.w_bf16.n65536.cfg_t32_r1_v8_c2_smem", "cluster=2 needs CTA-wide rows"},
      {"layernorm.bwd.bf16.w_bf16.n262144.cfg_t1024_r1_v8_c4_smem", "262144 bytes of shared memory per CTA"},
      {"layernorm.fwd_train.bf16.w_bf16.n262144.cfg_t1024_r1_v8_c2_smem", "262144 bytes of shared memory per CTA"},
  };
  for (const Bad& b : bad) {
    const std::string text = b.text;
    CAPTURE(text);
    bool threw = false;
    try {
      Spec::parse(b.text);
    } catch (const Error& e) {
      threw = true;
      CHECK(e.status() == Status::kInvalidSpec);
      CHECK(std::string(e.what()).find(b.needle) != std::string::npos);
    }
    CHECK(threw);
  }
}

TEST_CASE("the heuristic resolves every hidden size from 1 to 262144, every phase and x dtype, sm_80 and sm_90") {
  // Fuzzing found odd N in (16384, 32768] resolving to a config validate() rejects.
  size_t resolved = 0;
  for (Phase phase : {Phase::kForwardTraining, Phase::kBackward})
    for (DType x : {DType::kF32, DType::kBF16})
      for (int sm : {80, 90})
        for (int64_t n = 1; n <= kMaxHiddenSize; ++n) {
          Spec s = Spec::make(Norm::kLayerNorm, phase, x, n, true);
          s.epilogue = n % 2 ? Epilogue::kReluBitmask : Epilogue::kNone;
          try {
            resolve(s, 16, sm);
            ++resolved;
          } catch (const Error& e) {
            FAIL_CHECK(std::string(e.what()));
            return;
          }
        }
  CHECK(resolved == 2 * 2 * 2 * size_t(kMaxHiddenSize));
}

TEST_CASE("heuristic picks vector width, threads and row cache by hidden size") {
  auto block = [](const char* text, int max_vec = 16, int sm = 90) {
    return *resolve(Spec::parse(text), max_vec, sm).block;
  };
  CHECK(block("layernorm.fwd_train.bf16.n4096") == BlockConfig{128, 1, 8, RowCache::kRegisters});
  CHECK(block("layernorm.fwd_train.f32.n4096") == BlockConfig{256, 1, 4, RowCache::kRegisters});
  CHECK(block("rmsnorm.fwd_train.bf16.n256") == BlockConfig{32, 8, 8, RowCache::kRegisters});
  CHECK(block("rmsnorm.fwd_train.bf16.n1") == BlockConfig{1, 256, 1, RowCache::kRegisters});
  CHECK(block("layernorm.fwd_train.bf16.n4097").vec == 1);
  CHECK(block("layernorm.fwd_train.bf16.n4096", 2).vec == 2);
  // Large forward rows: one CTA in registers, then streamed twice (65536; RMSNorm below it), else
  // one CTA's shared memory, then a cluster's (sm_90 only).
  // LayerNorm at exactly 32768 (2-byte x, sm_90): 8-byte packs; RMSNorm and sm_80 keep 16-byte ones.
  CHECK(block("layernorm.fwd_train.bf16.n32768") == BlockConfig{1024, 1, 4, RowCache::kRegisters});
  CHECK(block("rmsnorm.fwd_train.bf16.n32768") == BlockConfig{1024, 1, 8, RowCache::kRegisters});
  CHECK(block("layernorm.fwd_train.bf16.n32768", 16, 80) == BlockConfig{1024, 1, 8, RowCache::kRegisters});
  // Rows that would take 544-640 threads: two CTAs per SM instead of one (LayerNorm's 544-576-thread
  // register rows hold 46-52 registers, so two fit; 20480 takes 512 threads of 5 packs).
  CHECK(block("layernorm.fwd_train.bf16.n18432") == BlockConfig{576, 1, 8, RowCache::kRegisters});
  CHECK(block("layernorm.fwd_train.bf16.n17408") == BlockConfig{544, 1, 8, RowCache::kRegisters});
  CHECK(block("layernorm.fwd_train.bf16.n20480") == BlockConfig{512, 1, 8, RowCache::kRegisters});
  CHECK(block("rmsnorm.fwd_train.bf16.n20480") == BlockConfig{512, 1, 8, RowCache::kRegisters});
  CHECK(block("rmsnorm.fwd_train.bf16.n18432") == BlockConfig{576, 1, 8, RowCache::kRegisters});
  CHECK(block("layernorm.fwd_train.bf16.n19456") == BlockConfig{608, 1, 8, RowCache::kRegisters});
  CHECK(block("rmsnorm.fwd_train.bf16.n19456") == BlockConfig{608, 1, 8, RowCache::kRegisters});
  CHECK(block("layernorm.fwd_train.bf16.n18432", 16, 80) == BlockConfig{576, 1, 8, RowCache::kRegisters});
  CHECK(block("layernorm.fwd_train.bf16.n19456", 16, 80) == BlockConfig{608, 1, 8, RowCache::kRegisters});
  CHECK(block("layernorm.fwd_train.f32.n10240") == BlockConfig{640, 1, 4, RowCache::kRegisters});
  // LayerNorm at 65536 (2-byte x): 2 CTAs of 512 threads in shared memory; RMSNorm one CTA's.
  CHECK(block("layernorm.fwd_train.bf16.n65536") == BlockConfig{512, 1, 8, RowCache::kShared, 2});
  // Past 4 packs of 8 per thread (sm_90, 2-byte x): LayerNorm rows stay in registers in 16-byte
  // packs, 1024 threads up to 6 each (ragged too), then 8 each at 832-896 threads; RMSNorm rows
  // whose 4-element packs split evenly over 1024 threads up to 15 per thread.
  CHECK(block("layernorm.fwd_train.bf16.n49152") == BlockConfig{1024, 1, 8, RowCache::kRegisters});
  CHECK(block("layernorm.fwd_train.bf16.n45056") == BlockConfig{1024, 1, 8, RowCache::kRegisters});
  CHECK(block("rmsnorm.fwd_train.bf16.n40960") == BlockConfig{1024, 1, 4, RowCache::kRegisters});
  CHECK(block("layernorm.fwd_train.bf16.n36864") == BlockConfig{1024, 1, 8, RowCache::kRegisters});
  CHECK(block("layernorm.fwd_train.bf16.n40960") == BlockConfig{1024, 1, 8, RowCache::kRegisters});
  CHECK(block("layernorm.fwd_train.bf16.n51200") == BlockConfig{800, 1, 8, RowCache::kRegisters});
  CHECK(block("layernorm.fwd_train.bf16.n57344") == BlockConfig{896, 1, 8, RowCache::kRegisters});
  CHECK(block("layernorm.fwd_train.bf16.n61440") == BlockConfig{960, 1, 8, RowCache::kRegisters});
  CHECK(block("layernorm.fwd_train.bf16.n40960", 16, 80).cache == RowCache::kGlobal);
  // LayerNorm's 4-pack rows of 704-768 threads in shared memory; 896 stays in registers.
  CHECK(block("layernorm.fwd_train.bf16.n24576") == BlockConfig{768, 1, 8, RowCache::kShared});
  CHECK(block("layernorm.fwd_train.bf16.n22528") == BlockConfig{704, 1, 8, RowCache::kShared});
  CHECK(block("layernorm.fwd_train.bf16.n28672") == BlockConfig{896, 1, 8, RowCache::kRegisters});
  CHECK(block("rmsnorm.fwd_train.bf16.n24576") == BlockConfig{768, 1, 8, RowCache::kRegisters});
  CHECK(block("adalayernorm.fwd_infer.f16.n49152.bias") == BlockConfig{1024, 1, 8, RowCache::kRegisters});
  CHECK(block("layernorm.fwd_train.bf16.n53248") == BlockConfig{832, 1, 8, RowCache::kRegisters});
  // Registers of 8 packs a thread up to 61440; past it the 2-CTA shared row (faster on the H100).
  CHECK(block("layernorm.fwd_train.bf16.n59392") == BlockConfig{928, 1, 8, RowCache::kRegisters});
  CHECK(block("layernorm.fwd_train.bf16.n63488") == BlockConfig{512, 1, 8, RowCache::kShared, 2});
  // Past 65536, where no cluster splits the packs evenly: unequal segments (the last CTA's shorter).
  CHECK(block("rmsnorm.fwd_train.bf16.n65608") == BlockConfig{288, 1, 8, RowCache::kShared, 4});
  CHECK(block("layernorm.fwd_train.bf16.n98312") == BlockConfig{224, 1, 8, RowCache::kShared, 8});
  CHECK(block("layernorm.fwd_train.bf16.n98304") == BlockConfig{384, 1, 8, RowCache::kShared, 4});
  CHECK(block("layernorm.fwd_train.bf16.n131112") == BlockConfig{288, 1, 8, RowCache::kShared, 8});
  CHECK(block("rmsnorm.fwd_train.bf16.n61440") == BlockConfig{1024, 1, 4, RowCache::kRegisters});
  CHECK(block("rmsnorm.fwd_train.bf16.n65536") == BlockConfig{1024, 1, 8, RowCache::kShared});
  // fp32 x at 65536: 4 CTAs of 64 KB, as the rows on either side (streamed before the rows met).
  CHECK(block("rmsnorm.fwd_train.f32.n65536") == BlockConfig{512, 1, 4, RowCache::kShared, 4});
  CHECK(block("rmsnorm.fwd_train.f32.n40960").cache != RowCache::kRegisters);
  CHECK(block("rmsnorm.fwd_train.bf16.n40960", 16, 80).cache == RowCache::kGlobal);
  CHECK(block("rmsnorm.fwd_train.bf16.n40960", 2).vec == 2);  // the caller's alignment holds
  // Else pipelined rows in one CTA up to 200 KB (16-byte packs), then 4-8-CTA clusters of 64 KB
  // segments; odd N keeps one buffer (LayerNorm) or streams (RMSNorm).
  CHECK(block("layernorm.fwd_train.bf16.n33792") == BlockConfig{1024, 1, 8, RowCache::kRegisters});
  CHECK(block("rmsnorm.fwd_train.bf16.n33792") == BlockConfig{544, 1, 8, RowCache::kRegisters});  // 8 packs a thread
  // 8193 packs: no even 2-CTA split, and p8 registers would take 1056 threads: 4 CTAs of unequal
  // segments (2049 packs, the last 2046).
  CHECK(block("layernorm.fwd_train.bf16.n65544") == BlockConfig{288, 1, 8, RowCache::kShared, 4});
  CHECK(block("layernorm.fwd_train.bf16.n40968") == BlockConfig{1024, 1, 8, RowCache::kRegisters});
  CHECK(block("rmsnorm.fwd_train.bf16.n98304") == BlockConfig{384, 1, 8, RowCache::kShared, 4});
  CHECK(block("layernorm.fwd_train.bf16.n40961") == BlockConfig{1024, 1, 1, RowCache::kShared});
  CHECK(block("rmsnorm.fwd_train.bf16.n40961") == BlockConfig{1024, 1, 1, RowCache::kGlobal});
  CHECK(block("layernorm.fwd_train.bf16.n40960", 16, 80).cache == RowCache::kGlobal);
  // LayerNorm past 65536: segments of up to 48 KB first (8 CTAs here), else 64 KB.
  CHECK(block("layernorm.fwd_train.bf16.n131072") == BlockConfig{256, 1, 8, RowCache::kShared, 8});
  CHECK(block("layernorm.fwd_train.bf16.n98304") == BlockConfig{384, 1, 8, RowCache::kShared, 4});
  CHECK(block("rmsnorm.fwd_train.bf16.n131072") == BlockConfig{512, 1, 8, RowCache::kShared, 4});
  CHECK(block("layernorm.fwd_train.bf16.n262144") == BlockConfig{512, 1, 8, RowCache::kShared, 8});
  CHECK(block("layernorm.fwd_train.bf16.n262144", 16, 80).cache == RowCache::kGlobal);
  CHECK(block("layernorm.fwd_train.f32.n65536") == BlockConfig{512, 1, 4, RowCache::kShared, 4});
  // Backward: fewer elements per thread; past 512 threads the split route (sm_80).
  // Two packs per thread at the thread counts where pipelined rows measured faster (sm_80+), on
  // sm_90 filled by bulk copies with three buffers where that measured faster still.
  const BlockConfig tma3_256{256, 1, 8, RowCache::kSharedPipelined, 1, 3, true};
  CHECK(block("layernorm.bwd.bf16.w_f32.n4096.bias") == tma3_256);
  CHECK(block("layernorm.bwd.bf16.w_f32.n4096.bias", 16, 80) == BlockConfig{256, 1, 8, RowCache::kSharedPipelined});
  CHECK(block("layernorm.bwd.bf16.w_f32.n7168.bias") == BlockConfig{448, 1, 8, RowCache::kSharedPipelined, 1, 3, true});
  CHECK(block("layernorm.bwd.bf16.w_f32.n6144.bias") == BlockConfig{384, 1, 8, RowCache::kSharedPipelined, 1, 3, true});
  CHECK(block("layernorm.bwd.bf16.w_f32.n6144.bias", 16, 80) == BlockConfig{384, 1, 8, RowCache::kRegisters});
  CHECK(block("layernorm.bwd.bf16.w_f32.n3584.bias") == BlockConfig{224, 1, 8, RowCache::kSharedPipelined});
  CHECK(block("layernorm.bwd.bf16.w_f32.n5120.bias") == BlockConfig{320, 1, 8, RowCache::kRegisters});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n8192") == BlockConfig{512, 1, 8, RowCache::kSharedPipelined, 1, 3, true});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n8192", 16, 80) == BlockConfig{512, 1, 8, RowCache::kSharedPipelined});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n4096") == tma3_256);
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n4096", 16, 80) == BlockConfig{256, 1, 8, RowCache::kRegisters});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n7168") == BlockConfig{448, 1, 8, RowCache::kRegisters});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n4096", 4).cache == RowCache::kRegisters);  // 8-byte packs: no bulk copies
  CHECK(block("layernorm.bwd.f32.w_f32.n4096.bias") == BlockConfig{256, 1, 4, RowCache::kRegisters});
  CHECK(block("layernorm.bwd.bf16.w_f32.n512.bias") == BlockConfig{32, 8, 8, RowCache::kRegisters});
  CHECK(block("rmsnorm.bwd.f32.n8192") == BlockConfig{512, 1, 4, RowCache::kRegisters});
  CHECK(block("layernorm.bwd.bf16.w_f32.n16384.bias", 16, 80) == BlockConfig{1024, 1, 8, RowCache::kGlobal});
  // Backward on sm_90: 2-pack rows of 640-896 threads by bulk copies (three buffers; RMSNorm not at
  // 672-736), registers below, then x and dy in shared memory, then clusters, else split.
  const BlockConfig tma3_640{640, 1, 8, RowCache::kSharedPipelined, 1, 3, true};
  CHECK(block("layernorm.bwd.bf16.w_f32.n10240.bias") == tma3_640);
  CHECK(block("layernorm.bwd.bf16.w_f32.n10000.bias") == tma3_640);  // ragged
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n10240") == tma3_640);
  CHECK(block("layernorm.bwd.bf16.w_f32.n9216.bias") == BlockConfig{576, 1, 8, RowCache::kRegisters});
  CHECK(block("layernorm.bwd.bf16.w_f32.n11264.bias") == BlockConfig{704, 1, 8, RowCache::kSharedPipelined, 1, 3, true});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n11264") == BlockConfig{704, 1, 8, RowCache::kRegisters});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n12288") == BlockConfig{768, 1, 8, RowCache::kSharedPipelined, 1, 3, true});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n14336") == BlockConfig{896, 1, 8, RowCache::kSharedPipelined, 1, 3, true});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n12288", 4) == BlockConfig{768, 1, 4, RowCache::kRegisters});  // 8-byte packs
  // LayerNorm's one-CTA rows by bulk copies (three buffers; at 1024 threads the pipelined row's two).
  CHECK(block("layernorm.bwd.bf16.w_f32.n12288.bias") == BlockConfig{768, 1, 8, RowCache::kSharedPipelined, 1, 3, true});
  CHECK_FALSE(block("layernorm.bwd.bf16.w_f32.n12288.bias", 4).bulk_copy);  // 8-byte packs
  CHECK(block("layernorm.bwd.bf16.w_f32.n13312.bias") == BlockConfig{832, 1, 8, RowCache::kSharedPipelined, 1, 3, true});
  CHECK(block("layernorm.bwd.bf16.w_f32.n15360.bias") == BlockConfig{960, 1, 8, RowCache::kShared});
  // From 16384 with dbeta (16392 without), 2-CTA rows of up to 2 packs a thread by bulk copies: the
  // row sums pushed into each CTA made them cheaper than one CTA's 3-4 packs.
  CHECK(block("layernorm.bwd.bf16.w_f32.n16384.bias") == BlockConfig{512, 1, 8, RowCache::kSharedPipelined, 2, 2, true});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n16384") == BlockConfig{512, 1, 8, RowCache::kShared});
  CHECK(block("layernorm.bwd.bf16.w_f32.n15872.bias") == BlockConfig{992, 1, 8, RowCache::kShared});
  // At 16392-18432, 640 threads for 1025-1152 packs: 576 ran 13-14 points lower at 18432.
  CHECK(block("layernorm.bwd.bf16.w_f32.n18432.bias") == BlockConfig{640, 1, 8, RowCache::kSharedPipelined, 2, 2, true});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n18432") == BlockConfig{640, 1, 8, RowCache::kSharedPipelined, 2, 2, true});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n20480") == BlockConfig{640, 1, 8, RowCache::kSharedPipelined, 2, 2, true});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n22528") == BlockConfig{704, 1, 8, RowCache::kSharedPipelined, 2, 2, true});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n23552") == BlockConfig{736, 1, 8, RowCache::kSharedPipelined, 2, 2, true});
  CHECK(block("layernorm.bwd.bf16.w_f32.n19456.bias") == BlockConfig{608, 1, 8, RowCache::kSharedPipelined, 2, 2, true});
  // An odd number of packs: no 2-CTA split, one CTA of 3 packs.
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n18424") == BlockConfig{768, 1, 8, RowCache::kShared});
  // RMSNorm's CTA of 768-1024 threads x 4 packs: a 2-CTA bulk-copied row of 2 packs.
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n32768") == BlockConfig{1024, 1, 8, RowCache::kSharedPipelined, 2, 2, true});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n30720") == BlockConfig{480, 1, 8, RowCache::kSharedPipelined, 4, 2, true});  // 960 threads ran 83 %, 4 CTAs 92
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n24576") == BlockConfig{768, 1, 8, RowCache::kSharedPipelined, 2, 2, true});
  CHECK(block("rmsnorm.bwd.f32.n16384") == BlockConfig{1024, 1, 4, RowCache::kGlobal});
  // 1024-thread rows pipelined where two buffers take at most 160 KB per CTA.
  CHECK(block("layernorm.bwd.bf16.w_f32.n32768.bias") == BlockConfig{1024, 1, 8, RowCache::kSharedPipelined, 2, 2, true});
  // Where 2 CTAs would take more than 2 packs per thread: 4, 8 or 16 CTAs of 2 packs by bulk copies.
  CHECK(block("layernorm.bwd.bf16.w_f32.n65536.bias") == BlockConfig{512, 1, 8, RowCache::kSharedPipelined, 8, 2, true});
  CHECK(block("layernorm.bwd.bf16.w_f32.n61440.bias") == BlockConfig{512, 1, 8, RowCache::kSharedPipelined, 8, 2, true});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n61440") == BlockConfig{512, 1, 8, RowCache::kSharedPipelined, 8, 2, true});
  CHECK(block("layernorm.bwd.bf16.w_f32.n45056.bias") == BlockConfig{768, 1, 8, RowCache::kSharedPipelined, 4, 2, true});
  CHECK(block("layernorm.bwd.bf16.w_f32.n114688.bias") == BlockConfig{896, 1, 8, RowCache::kSharedPipelined, 8, 2, true});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n40960") == BlockConfig{640, 1, 8, RowCache::kSharedPipelined, 4, 2, true});
  // 2 packs a thread in whole four-warp groups (@warps4), but RMSNorm below 40960 (544 threads ran
  // 91.5 % at 34816, 640 threads 88.8).
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n34816") == BlockConfig{544, 1, 8, RowCache::kSharedPipelined, 4, 2, true});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n43008") == BlockConfig{768, 1, 8, RowCache::kSharedPipelined, 4, 2, true});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n53248") == BlockConfig{512, 1, 8, RowCache::kSharedPipelined, 8, 2, true});
  CHECK(block("layernorm.bwd.bf16.w_f32.n53248.bias") == BlockConfig{896, 1, 8, RowCache::kSharedPipelined, 4, 2, true});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n180224") == BlockConfig{768, 1, 8, RowCache::kSharedPipelined, 16, 2, true});
  // Packs that 4 CTAs do not split: 2 CTAs of one buffer (ragged threads).
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n34832") == BlockConfig{1024, 1, 8, RowCache::kShared, 2});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n57344") == BlockConfig{896, 1, 8, RowCache::kSharedPipelined, 4, 2, true});
  CHECK(block("layernorm.bwd.bf16.w_f32.n36864.bias") == BlockConfig{640, 1, 8, RowCache::kSharedPipelined, 4, 2, true});
  CHECK(block("layernorm.bwd.bf16.w_f32.n57344.bias") == BlockConfig{896, 1, 8, RowCache::kSharedPipelined, 4, 2, true});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n98304") == BlockConfig{768, 1, 8, RowCache::kSharedPipelined, 8, 2, true});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n65536") == BlockConfig{1024, 1, 8, RowCache::kSharedPipelined, 4, 2, true});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n262144") == BlockConfig{1024, 1, 8, RowCache::kSharedPipelined, 16, 2, true});
  CHECK(*resolve(Spec::parse("rmsnorm.bwd.bf16.w_f32.n262144"), 16, 90, kMaxPortableCluster).block ==
        BlockConfig{1024, 1, 8, RowCache::kShared, 8});
  // With dbeta, past 24 values per thread (16 above 768 threads) the dbeta sums join x and dy in
  // shared memory: one CTA up to N = 16376, then a 2-CTA cluster of 2 packs per thread filled by
  // bulk copies (pipelined rows need 16-byte packs), then clusters whose segments split evenly.
  CHECK(block("layernorm.bwd.bf16.w_f32.n18424.bias") == BlockConfig{768, 1, 8, RowCache::kShared});  // odd packs
  CHECK(block("layernorm.bwd.bf16.w_f32.n20480.bias") == BlockConfig{640, 1, 8, RowCache::kSharedPipelined, 2, 2, true});
  CHECK(block("layernorm.bwd.bf16.w_f32.n24576.bias") == BlockConfig{768, 1, 8, RowCache::kSharedPipelined, 2, 2, true});
  CHECK(block("layernorm.bwd.bf16.w_f32.n26624.bias") == BlockConfig{832, 1, 8, RowCache::kSharedPipelined, 2, 2, true});
  CHECK(block("layernorm.bwd.bf16.w_f32.n28672.bias") == BlockConfig{896, 1, 8, RowCache::kSharedPipelined, 2, 2, true});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n28672") == BlockConfig{896, 1, 8, RowCache::kSharedPipelined, 2, 2, true});
  CHECK(block("layernorm.bwd.bf16.w_f32.n49152.bias") == BlockConfig{768, 1, 8, RowCache::kSharedPipelined, 4, 2, true});
  CHECK(block("layernorm.bwd.bf16.w_f32.n98304.bias") == BlockConfig{768, 1, 8, RowCache::kSharedPipelined, 8, 2, true});
  CHECK(block("layernorm.bwd.bf16.w_f32.n40960.bias") == BlockConfig{640, 1, 8, RowCache::kSharedPipelined, 4, 2, true});
  CHECK(block("layernorm.bwd.bf16.w_f32.n131072.bias") == BlockConfig{1024, 1, 8, RowCache::kSharedPipelined, 8, 2, true});
  CHECK(block("layernorm.bwd.bf16.w_f32.n81920.bias") == BlockConfig{640, 1, 8, RowCache::kSharedPipelined, 8, 2, true});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n81920") == BlockConfig{640, 1, 8, RowCache::kSharedPipelined, 8, 2, true});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n73728") == BlockConfig{640, 1, 8, RowCache::kSharedPipelined, 8, 2, true});
  CHECK(block("layernorm.bwd.bf16.w_f32.n73728.bias") == BlockConfig{640, 1, 8, RowCache::kSharedPipelined, 8, 2, true});
  // Packs that 8 CTAs do not split (9220): the same bulk-copied rows with ragged segments, 1153
  // packs a CTA and 1149 in the last, two a thread in whole four-warp groups.
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n73760") == BlockConfig{640, 1, 8, RowCache::kSharedPipelined, 8, 2, true});
  CHECK(block("rmsnorm.bwd.bf16.w_f32.n114688") == BlockConfig{896, 1, 8, RowCache::kSharedPipelined, 8, 2, true});
  // Past 131072, 16 CTAs (non-portable); with dbeta, the split route on a GPU that cannot
  // co-schedule them (the runtime lowers max_cluster).
  CHECK(block("layernorm.bwd.bf16.w_f32.n262144.bias") == BlockConfig{1024, 1, 8, RowCache::kSharedPipelined, 16, 2, true});
  CHECK(*resolve(Spec::parse("layernorm.bwd.bf16.w_f32.n262144.bias"), 16, 90, kMaxPortableCluster).block ==
        BlockConfig{1024, 1, 8, RowCache::kGlobal});
  // Warp rows, 8 per CTA, up to 4 packs per lane.
  CHECK(block("layernorm.bwd.bf16.w_f32.n1024.bias") == BlockConfig{32, 8, 8, RowCache::kRegisters});
  CHECK(block("layernorm.bwd.bf16.w_f32.n1032.bias") == BlockConfig{96, 1, 8, RowCache::kRegisters});
  // A given block config is kept as is.
  CHECK(block("layernorm.fwd_train.bf16.n4096.cfg_t512_r1_v8_reg") == BlockConfig{512, 1, 8, RowCache::kRegisters});
}

TEST_CASE("a forward row's cluster may split its packs unevenly: each CTA takes the rounded-up share, the last the rest") {
  const Spec s = Spec::parse("layernorm.fwd_train.bf16.w_bf16.n65608.cfg_t288_r1_v8_c4_smem");
  CHECK(ragged_segments(s, *s.block));
  CHECK(segment_packs(s, *s.block) == 2051);  // 8201 packs: 3 x 2051 + 2048
  CHECK(last_segment_packs(s, *s.block) == 2048);
  CHECK(shared_row_bytes(s, *s.block) == 2051 * 8 * 2);
  CHECK(Spec::parse(s.str()) == s);
  const Spec even = Spec::parse("layernorm.fwd_train.bf16.w_bf16.n65536.cfg_t256_r1_v8_c4_smem");
  CHECK_FALSE(ragged_segments(even, *even.block));
  CHECK(segment_packs(even, *even.block) == 2048);
  CHECK(last_segment_packs(even, *even.block) == 2048);
  const Spec reg = Spec::parse("rmsnorm.fwd_infer.bf16.w_bf16.n4104.relu_bitmask.cfg_t256_r1_v8_c2_reg");
  CHECK(ragged_segments(reg, *reg.block));
  CHECK(segment_packs(reg, *reg.block) == 257);  // 513 packs: 257 + 256
  // Block-scaled outputs round the segments up to whole scale blocks (MXFP8: 4 packs of 8; NVFP4:
  // 2), bound in the source only where that changes them.
  const Spec mx = Spec::parse("rmsnorm.fwd_infer.bf16.w_bf16.n65608.mxfp8_e4m3.cfg_t288_r1_v8_c4_smem");
  CHECK(segment_packs(mx, *mx.block) == 2052);
  CHECK(last_segment_packs(mx, *mx.block) == 2045);
  CHECK(generate(mx).source.find("kSegmentPacks = 2052;") != std::string::npos);
  const Spec divides = Spec::parse("rmsnorm.fwd_infer.bf16.w_bf16.n65584.mxfp8_e5m2.cfg_t544_r1_v8_c2_smem");
  CHECK(ragged_segments(divides, *divides.block));  // 8198 packs over 2 CTAs: 4100 + 4098
  CHECK(segment_packs(divides, *divides.block) == 4100);
  const Spec nv = Spec::parse("rmsnorm.fwd_infer.bf16.w_bf16.n131112.nvfp4.cfg_t544_r1_v8_c8_smem");
  CHECK(segment_packs(nv, *nv.block) == 2050);
  CHECK(last_segment_packs(nv, *nv.block) == 2039);
  CHECK(generate(Spec::parse("rmsnorm.fwd_infer.bf16.w_bf16.n65536.mxfp8_e4m3.cfg_t256_r1_v8_c4_smem"))
            .source.find("kSegmentPacks") == std::string::npos);
  CHECK(generate(s).source.find("kSegmentPacks") == std::string::npos);
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.fwd_infer.bf16.w_bf16.n65584.mxfp8_e5m2.cfg_t544_r1_v8_c2_pipe"),
                       doctest::Contains("must leave each CTA whole scale blocks"), Error);
}

TEST_CASE("shared memory per CTA of a shared-memory row: x, dy in the backward, and dbeta sums past the registers") {
  auto bytes = [](const char* text) {
    const Spec s = Spec::parse(text);
    return std::make_pair(shared_row_bytes(s, *s.block), dbeta_sums_in_shared(s, *s.block));
  };
  CHECK(bytes("layernorm.fwd_train.bf16.w_bf16.n40960.cfg_t1024_r1_v8_smem") == std::make_pair(int64_t(81920), false));
  CHECK(bytes("layernorm.fwd_train.bf16.w_bf16.n131072.cfg_t512_r1_v8_c4_smem") ==
        std::make_pair(int64_t(65536), false));
  // Pipelined rows (pipe) keep two buffers: twice the row's x (forward), x and dy (backward).
  CHECK(bytes("layernorm.fwd_train.bf16.w_bf16.n40960.cfg_t1024_r1_v8_pipe") == std::make_pair(int64_t(163840), false));
  CHECK(bytes("layernorm.bwd.bf16.w_f32.n16384.bias.cfg_t1024_r1_v8_pipe") == std::make_pair(int64_t(131072), false));
  CHECK(bytes("layernorm.bwd.bf16.w_f32.n40960.bias.cfg_t1024_r1_v8_c4_pipe") == std::make_pair(int64_t(81920), false));
  // A ragged cluster's CTAs each take the rounded-up segment (65608: 8201 packs, 1026 a CTA).
  CHECK(bytes("rmsnorm.bwd.bf16.w_f32.n65608.cfg_t544_r1_v8_c8_smem") == std::make_pair(int64_t(1026 * 8 * 4), false));
  CHECK(bytes("layernorm.bwd.bf16.w_f32.n65608.bias.cfg_t704_r1_v8_c4_smem") ==
        std::make_pair(int64_t(2051 * 8 * 4), false));
  // The residual's bulk-copied rows bring dh_out too, three rows a buffer, where they fit:
  // 18432 in five CTAs of 461 packs, three buffers; 12288 in six of 256 packs, two buffers.
  CHECK(bytes("rmsnorm.bwd.bf16.w_f32.n18432.residual.cfg_t256_r1_v8_c5_tma3") ==
        std::make_pair(int64_t(461 * 8 * 3 * 3 * 2), false));
  CHECK(bytes("rmsnorm.bwd.bf16.w_f32.n12288.residual.cfg_t128_r1_v8_c6_tma") ==
        std::make_pair(int64_t(256 * 8 * 2 * 3 * 2), false));
  CHECK(bulk_copies_dh_out(Spec::parse("layernorm.bwd.bf16.w_f32.n18432.bias.residual.cfg_t640_r1_v8_c2_tma"),
                           *Spec::parse("layernorm.bwd.bf16.w_f32.n18432.bias.residual.cfg_t640_r1_v8_c2_tma").block));
  // Not where three rows and the dbeta sums outgrow the CTA (65536 in four: 262144 bytes), nor
  // without the residual, nor for rows the threads copy (pipe) or hold (smem), nor in rows of
  // 3072 values or fewer (where it lost), nor in CTAs of 1024 threads (where it spilled); 3080
  // takes it.
  CHECK(bulk_copies_dh_out(Spec::parse("layernorm.bwd.bf16.w_f32.n3080.bias.residual.cfg_t192_r1_v8_tma3"),
                           *Spec::parse("layernorm.bwd.bf16.w_f32.n3080.bias.residual.cfg_t192_r1_v8_tma3").block));
  for (const char* text : {"layernorm.bwd.bf16.w_f32.n65536.bias.residual.cfg_t1024_r1_v8_c4_tma",
                           "layernorm.bwd.bf16.w_f32.n3072.bias.residual.cfg_t192_r1_v8_tma3",
                           "rmsnorm.bwd.bf16.w_f32.n65536.residual.cfg_t1024_r1_v8_c4_tma",
                           "layernorm.bwd.bf16.w_f32.n18432.bias.cfg_t640_r1_v8_c2_tma",
                           "rmsnorm.bwd.bf16.w_f32.n4096.residual.cfg_t256_r1_v8_pipe",
                           "rmsnorm.bwd.bf16.w_f32.n4096.residual.cfg_t256_r1_v8_smem"}) {
    const Spec s = Spec::parse(text);
    CHECK_MESSAGE(!bulk_copies_dh_out(s, *s.block), text);
  }
  // The kernel learns it from one binding line that only those specs' sources carry.
  CHECK(generate(Spec::parse("layernorm.bwd.bf16.w_f32.n18432.bias.residual.cfg_t640_r1_v8_c2_tma"))
            .source.find("kBulkDhOut = true") != std::string::npos);
  CHECK(generate(Spec::parse("layernorm.bwd.bf16.w_f32.n65536.bias.residual.cfg_t1024_r1_v8_c4_tma"))
            .source.find("kBulkDhOut") == std::string::npos);
  CHECK(bytes("layernorm.bwd.bf16.w_f32.n65536.bias.residual.cfg_t1024_r1_v8_c4_tma") ==
        std::make_pair(int64_t(16384 * (2 * 2 * 2 + 4)), true));
  // Dbeta sums past 16 values per thread: one copy, after both buffers.
  CHECK(bytes("layernorm.bwd.bf16.w_f32.n12288.bias.cfg_t256_r1_v8_pipe") == std::make_pair(int64_t(12288 * 12), true));
  CHECK(Spec::parse("rmsnorm.bwd.bf16.w_f32.n8192.cfg_t512_r1_v8_pipe").str() ==
        "rmsnorm.bwd.bf16.w_f32.n8192.cfg_t512_r1_v8_pipe");
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.fwd_train.bf16.n1024.cfg_t32_r4_v8_pipe"),
                       doctest::Contains("row cache 'pipe' needs CTA-wide rows"), Error);
  CHECK_THROWS_WITH_AS(Spec::parse("layernorm.fwd_train.bf16.n65536.cfg_t1024_r1_v8_pipe"),
                       doctest::Contains("row cache 'pipe' would take 262144 bytes"), Error);
  // pipe3 / pipe4: one buffer per stage, the dbeta sums still once.
  CHECK(bytes("layernorm.fwd_train.bf16.w_bf16.n65536.bias.cfg_t256_r1_v8_c4_pipe4") ==
        std::make_pair(int64_t(4 * 16384 * 2), false));
  CHECK(bytes("rmsnorm.bwd.bf16.w_f32.n16384.cfg_t512_r1_v8_c2_pipe3") == std::make_pair(int64_t(3 * 8192 * 4), false));
  CHECK(bytes("layernorm.bwd.bf16.w_f32.n12288.bias.cfg_t128_r1_v8_c2_pipe3") ==
        std::make_pair(int64_t(6144 * (3 * 4 + 4)), true));
  for (const char* text : {"layernorm.fwd_train.bf16.w_bf16.n65536.cfg_t256_r1_v8_c4_pipe4",
                           "rmsnorm.bwd.bf16.w_f32.n16384.cfg_t512_r1_v8_c2_pipe3"}) {
    CAPTURE(text);
    CHECK(Spec::parse(text).str() == text);
  }
  CHECK(Spec::parse("rmsnorm.bwd.bf16.w_f32.n16384.cfg_t512_r1_v8_c2_pipe3").block->stages == 3);
  CHECK(Spec::parse("rmsnorm.bwd.bf16.w_f32.n16384.cfg_t512_r1_v8_c2_pipe3") !=
        Spec::parse("rmsnorm.bwd.bf16.w_f32.n16384.cfg_t512_r1_v8_c2_pipe"));
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.bwd.bf16.w_f32.n16384.cfg_t512_r1_v8_c2_pipe2"),
                       doctest::Contains("spelled 'pipe', not 'pipe2'"), Error);
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.bwd.bf16.w_f32.n16384.cfg_t512_r1_v8_c2_pipe5"),
                       doctest::Contains("stages=5 must be 2-4 row buffers"), Error);
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.bwd.bf16.w_f32.n16384.cfg_t512_r1_v8_c2_smem3"),
                       doctest::Contains("row cache must be one of"), Error);
  CHECK_THROWS_WITH_AS(Spec::parse("layernorm.fwd_train.bf16.n65536.cfg_t512_r1_v8_c2_pipe4"),
                       doctest::Contains("row cache 'pipe' would take 262144 bytes"), Error);
  // tma[3|4]: pipelined rows filled by bulk copies; 16-byte packs only.
  for (const char* text : {"layernorm.bwd.bf16.w_f32.n16384.bias.cfg_t1024_r1_v8_tma",
                           "rmsnorm.fwd_train.f32.w_f32.n4096.cfg_t256_r1_v4_c2_tma3",
                           "layernorm.fwd_train.bf16.w_bf16.n65536.bias.cfg_t256_r1_v8_c4_tma4"}) {
    CAPTURE(text);
    const Spec s = Spec::parse(text);
    CHECK(s.str() == text);
    CHECK(s.block->bulk_copy);
    CHECK(s.block->cache == RowCache::kSharedPipelined);
  }
  CHECK(Spec::parse("layernorm.bwd.bf16.w_f32.n16384.bias.cfg_t1024_r1_v8_tma").block->stages == 2);
  CHECK(Spec::parse("rmsnorm.fwd_train.f32.w_f32.n4096.cfg_t256_r1_v4_c2_tma3").block->stages == 3);
  CHECK(Spec::parse("layernorm.bwd.bf16.w_f32.n16384.bias.cfg_t1024_r1_v8_tma") !=
        Spec::parse("layernorm.bwd.bf16.w_f32.n16384.bias.cfg_t1024_r1_v8_pipe"));
  CHECK(bytes("layernorm.bwd.bf16.w_f32.n16384.bias.cfg_t1024_r1_v8_tma") == std::make_pair(int64_t(131072), false));
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.bwd.bf16.w_f32.n4096.cfg_t256_r1_v8_tma2"),
                       doctest::Contains("spelled 'tma', not 'tma2'"), Error);
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.bwd.bf16.w_f32.n4096.cfg_t256_r1_v4_tma"),
                       doctest::Contains("needs a pipelined row of 16-byte packs; vec=4 of bf16 is 8 bytes"), Error);
  CHECK_THROWS_WITH_AS(Spec::parse("layernorm.bwd.bf16.w_f32.n24576.bias.cfg_t1024_r1_v8_tma"),
                       doctest::Contains("row cache 'tma' would take"), Error);
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.bwd.bf16.w_f32.n4096.cfg_t256_r1_v8_tmax"),
                       doctest::Contains("row cache must be one of"), Error);
  // ws[3-8]: backward tma rows with a producer warp; one more warp per CTA.
  for (const char* text : {"layernorm.bwd.bf16.w_f32.n18432.bias.cfg_t576_r1_v8_ws",
                           "rmsnorm.bwd.bf16.w_f32.n1024.cfg_t128_r1_v8_ws8",
                           "rmsnorm.bwd.f32.w_f32.n4096.bias.gelu.cfg_t256_r1_v4_ws3"}) {
    CAPTURE(text);
    const Spec s = Spec::parse(text);
    CHECK(s.str() == text);
    CHECK(s.block->producer_warp);
    CHECK(s.block->bulk_copy);
    CHECK(s.block->cache == RowCache::kSharedPipelined);
    CHECK(generate(s).threads_per_cta == s.block->threads_per_row + 32);
    CHECK(generate(s).source.find("kProducerWarp = true") != std::string::npos);
  }
  CHECK(Spec::parse("rmsnorm.bwd.bf16.w_f32.n1024.cfg_t128_r1_v8_ws8").block->stages == 8);
  CHECK(Spec::parse("rmsnorm.bwd.bf16.w_f32.n4096.cfg_t256_r1_v8_ws") !=
        Spec::parse("rmsnorm.bwd.bf16.w_f32.n4096.cfg_t256_r1_v8_tma"));
  CHECK(generate(Spec::parse("rmsnorm.bwd.bf16.w_f32.n4096.cfg_t256_r1_v8_tma")).source.find("kProducerWarp") ==
        std::string::npos);
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.bwd.bf16.w_f32.n4096.cfg_t256_r1_v8_ws2"),
                       doctest::Contains("spelled 'ws', not 'ws2'"), Error);
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.bwd.bf16.w_f32.n1024.cfg_t128_r1_v8_ws9"),
                       doctest::Contains("stages=9 must be 2-8 row buffers"), Error);
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.bwd.bf16.w_f32.n4096.cfg_t256_r1_v8_tma8"),
                       doctest::Contains("stages=8 must be 2-4 row buffers"), Error);
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.fwd_train.bf16.w_f32.n4096.cfg_t256_r1_v8_ws"),
                       doctest::Contains("producer warp (ws) is a backward row source"), Error);
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.bwd.bf16.w_f32.n32768.cfg_t512_r1_v8_c2_ws"),
                       doctest::Contains("producer warp (ws) takes one CTA-wide row per CTA"), Error);
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.bwd.bf16.w_f32.n8192.cfg_t1024_r1_v8_ws"),
                       doctest::Contains("threads_per_row must leave room for it (<= 992)"), Error);
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.bwd.bf16.w_f32.n4096.memory_efficient.cfg_t256_r1_v8_ws"),
                       doctest::Contains("memory_efficient"), Error);
  CHECK_THROWS_WITH_AS(Spec::parse("rmsnorm.bwd.bf16.w_f32.n4096.cfg_t256_r1_v4_ws"),
                       doctest::Contains("needs a pipelined row of 16-byte packs"), Error);
  {
    Spec s = Spec::parse("rmsnorm.bwd.bf16.w_f32.n16384.cfg_t512_r1_v8_smem");
    s.block->bulk_copy = true;
    CHECK_THROWS_WITH_AS(validate(s), doctest::Contains("bulk_copy (tma) needs a pipelined row"), Error);
  }
  {
    Spec s = Spec::parse("rmsnorm.bwd.bf16.w_f32.n16384.cfg_t512_r1_v8_smem");
    s.block->stages = 3;  // only pipelined rows have buffers to count
    CHECK_THROWS_WITH_AS(validate(s), doctest::Contains("stages=3 applies to pipelined rows (pipe) only"), Error);
  }
  // 16 values per thread at 1024 threads, 24 at 768: both sums fit registers.
  CHECK(bytes("layernorm.bwd.bf16.w_f32.n16384.bias.cfg_t1024_r1_v8_smem") == std::make_pair(int64_t(65536), false));
  CHECK(bytes("layernorm.bwd.bf16.w_f32.n18432.bias.cfg_t768_r1_v8_smem") == std::make_pair(int64_t(73728), false));
  // 24 values at 864 threads, 32 at 768: 4 more bytes per column for the dbeta sums.
  CHECK(bytes("layernorm.bwd.bf16.w_f32.n20480.bias.cfg_t864_r1_v8_smem") == std::make_pair(int64_t(163840), true));
  CHECK(bytes("layernorm.bwd.bf16.w_f32.n24576.bias.cfg_t768_r1_v8_smem") == std::make_pair(int64_t(196608), true));
  CHECK(bytes("layernorm.bwd.bf16.w_f32.n98304.bias.cfg_t1024_r1_v8_c4_smem") ==
        std::make_pair(int64_t(196608), true));
  // Without dbeta there are no dbeta sums; registers and the split route keep none in shared memory.
  CHECK(bytes("rmsnorm.bwd.bf16.w_f32.n24576.cfg_t768_r1_v8_smem") == std::make_pair(int64_t(98304), false));
  CHECK_FALSE(dbeta_sums_in_shared(Spec::parse("layernorm.bwd.bf16.w_f32.n24576.bias.cfg_t1024_r1_v8_gmem"),
                                   *Spec::parse("layernorm.bwd.bf16.w_f32.n24576.bias.cfg_t1024_r1_v8_gmem").block));
  // Past 227 KB the spec is rejected, naming the bytes.
  CHECK_THROWS_WITH_AS(Spec::parse("layernorm.bwd.bf16.w_f32.n32768.bias.cfg_t1024_r1_v8_smem"),
                       doctest::Contains("262144 bytes of shared memory"), Error);
}

TEST_CASE("memory_efficient fused rows: 1/gamma' and beta in shared memory where the CTAs per SM keep room") {
  auto table = [](const char* text) {
    const Spec s = Spec::parse(text);
    const XhatTable t = xhat_table(s, *s.block);
    return std::make_tuple(t.reciprocal, t.beta, xhat_table_bytes(s, *s.block),
                           in_shared_memory(s.block->cache) ? shared_row_bytes(s, *s.block) : int64_t(0));
  };
  // Three CTAs of 256 threads: 72 KB each. bf16 beta fits beside the reciprocals, fp32 beta does not.
  CHECK(table("layernorm.bwd.bf16.w_bf16.n4096.bias.memory_efficient.cfg_t256_r1_v8_tma3") ==
        std::make_tuple(true, true, int64_t(4096 * 6), int64_t(49152 + 4096 * 6)));
  CHECK(table("layernorm.bwd.bf16.w_f32.n4096.bias.memory_efficient.cfg_t256_r1_v8_tma3") ==
        std::make_tuple(true, false, int64_t(4096 * 4), int64_t(49152 + 4096 * 4)));
  // RMSNorm's 64 registers leave room for four CTAs' row buffers only.
  CHECK(table("rmsnorm.bwd.bf16.w_f32.n4096.memory_efficient.cfg_t256_r1_v8_tma3") ==
        std::make_tuple(false, false, int64_t(0), int64_t(49152)));
  // One CTA per SM: after the row buffers (and shared dbeta sums), up to 227 KB less scratch.
  CHECK(table("layernorm.bwd.bf16.w_f32.n8192.bias.memory_efficient.cfg_t512_r1_v8_tma3") ==
        std::make_tuple(true, true, int64_t(8192 * 8), int64_t(98304 + 8192 * 8)));
  CHECK(table("layernorm.bwd.bf16.w_bf16.n18432.bias.memory_efficient.cfg_t768_r1_v8_smem") ==
        std::make_tuple(true, false, int64_t(18432 * 4), int64_t(18432 * 8 + 18432 * 4)));
  CHECK(table("layernorm.bwd.bf16.w_f32.n16384.bias.memory_efficient.cfg_t1024_r1_v8_tma") ==
        std::make_tuple(false, false, int64_t(0), int64_t(196608)));
  // Rows in registers: the table alone; a cluster's CTA: its segment.
  CHECK(table("layernorm.bwd.bf16.w_bf16.n1024.bias.memory_efficient.cfg_t32_r8_v8_reg") ==
        std::make_tuple(true, true, int64_t(1024 * 6), int64_t(0)));
  CHECK(table("layernorm.bwd.bf16.w_f32.n24576.bias.memory_efficient.cfg_t768_r1_v8_c2_tma") ==
        std::make_tuple(true, true, int64_t(12288 * 8), int64_t(98304 + 12288 * 8)));
  // None for the split route or a plain backward.
  CHECK(table("layernorm.bwd.bf16.w_f32.n4096.bias.memory_efficient.cfg_t512_r1_v8_gmem") ==
        std::make_tuple(false, false, int64_t(0), int64_t(0)));
  CHECK(table("layernorm.bwd.bf16.w_bf16.n4096.bias.cfg_t256_r1_v8_tma3") ==
        std::make_tuple(false, false, int64_t(0), int64_t(49152)));
}

TEST_CASE("a cluster may be any count of CTAs from 1 to 16, even or ragged") {
  // Not only powers of two: 57352 = 7169 packs takes 1434 x 4 + 1433 over 5 CTAs, 131112 = 16389
  // packs splits evenly over 9 (a non-portable cluster, allowed where the device takes it).
  for (const char* text : {"layernorm.bwd.bf16.w_f32.n57352.bias.cfg_t736_r1_v8_c5_tma",
                           "rmsnorm.bwd.bf16.w_f32.n131112.cfg_t928_r1_v8_c9_tma",
                           "rmsnorm.bwd.bf16.w_f32.n4104.cfg_t192_r1_v8_c3_reg",
                           "layernorm.fwd_train.bf16.w_bf16.n24576.bias.cfg_t512_r1_v8_c3_reg",
                           "adalayernorm.bwd.f16.w_f32.n100008.bias.gelu.cfg_t704_r1_v8_c12_smem"}) {
    CAPTURE(text);
    const Spec s = Spec::parse(text);
    CHECK(s.str() == text);
    CHECK_NOTHROW(validate(s));
  }
  CHECK(Spec::parse("layernorm.bwd.bf16.w_f32.n57352.bias.cfg_t736_r1_v8_c5_tma").block->cluster == 5);
  // A pipelined forward row still needs equal segments, whatever the count.
  CHECK_THROWS_WITH_AS(validate(Spec::parse("layernorm.fwd_train.bf16.w_bf16.n57352.bias.cfg_t736_r1_v8_c5_pipe")),
                       doctest::Contains("cluster=5 must divide the row's packs"), Error);
}
