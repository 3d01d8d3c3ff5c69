// Launch arguments are validated against the spec; each error names the field and its value.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "normjit/normjit.hpp"

using namespace normjit;

namespace {

LaunchArgs good_args(const Spec& s) {
  LaunchArgs a;
  a.x = reinterpret_cast<const void*>(0x100000);
  a.y = reinterpret_cast<void*>(0x200000);
  a.gamma = reinterpret_cast<const void*>(0x300000);
  a.beta = s.has_bias ? reinterpret_cast<const void*>(0x400000) : nullptr;
  const bool training = s.phase == Phase::kForwardTraining;
  const bool backward = s.phase == Phase::kBackward;
  a.mean = (training || backward) && subtracts_mean(s.norm) ? reinterpret_cast<float*>(0x500000) : nullptr;
  a.rstd = training || backward ? reinterpret_cast<float*>(0x600000) : nullptr;
  if (backward) {
    a.y = nullptr;
    a.beta = nullptr;
    a.dy = reinterpret_cast<const void*>(0x700000);
    a.dx = reinterpret_cast<void*>(0x800000);
    a.dgamma = reinterpret_cast<void*>(0x900000);
    a.dbeta = s.has_bias ? reinterpret_cast<void*>(0xa00000) : nullptr;
    a.workspace = reinterpret_cast<void*>(0xb00000);
  }
  if (s.epilogue == Epilogue::kReluBitmask) a.mask = reinterpret_cast<uint8_t*>(0xc00000);
  if (is_adaptive(s.norm)) a.rows_per_batch = 5;
  a.rows = 10;
  a.row_stride = s.n;
  a.eps = 1e-5f;
  return a;
}

void expect_error(const Spec& s, const LaunchArgs& a, const std::string& needle) {
  CAPTURE(needle);
  try {
    validate_launch(s, a);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.status() == Status::kInvalidArgument);
    const std::string what = e.what();
    CHECK(what.find(needle) != std::string::npos);
    CHECK(what.find(s.str()) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("valid arguments pass") {
  for (const char* text : {"layernorm.fwd_train.bf16.n4096.bias", "rmsnorm.fwd_infer.f32.w_bf16.n7",
                           "rmsnorm.fwd_train.f16.n128", "layernorm.bwd.bf16.w_f32.n4096.bias",
                           "adalayernorm.bwd.f16.n768.bias.relu_bitmask", "rmsnorm.bwd.f32.n100",
                           "adalayernorm.fwd_train.f16.n768.bias", "adarmsnorm.bwd.bf16.w_f32.n3072.zero_centered"}) {
    const Spec s = resolve(Spec::parse(text));
    CHECK_NOTHROW(validate_launch(s, good_args(s)));
    LaunchArgs zero = good_args(s);
    zero.rows = 0;
    CHECK_NOTHROW(validate_launch(s, zero));
  }
}

TEST_CASE("each bad argument is named with its value") {
  const Spec ln = resolve(Spec::parse("layernorm.fwd_train.bf16.n4096.bias"));
  LaunchArgs a;
  a = good_args(ln); a.x = nullptr; expect_error(ln, a, "x is null");
  a = good_args(ln); a.y = nullptr; expect_error(ln, a, "y is null");
  a = good_args(ln); a.gamma = nullptr; expect_error(ln, a, "gamma is null");
  a = good_args(ln); a.beta = nullptr; expect_error(ln, a, "beta is null");
  a = good_args(ln); a.mean = nullptr; expect_error(ln, a, "mean is null");
  a = good_args(ln); a.rstd = nullptr; expect_error(ln, a, "rstd is null");
  a = good_args(ln); a.rows = -3; expect_error(ln, a, "rows=-3 is negative");
  a = good_args(ln); a.row_stride = 4095; expect_error(ln, a, "row_stride=4095 is less than n=4096");
  a = good_args(ln); a.row_stride = 4100; expect_error(ln, a, "row_stride=4100 is not a multiple of vec=8");
  a = good_args(ln); a.eps = 0.f; expect_error(ln, a, "eps=0");
  a = good_args(ln); a.eps = -1.f; expect_error(ln, a, "eps=-1");
  a = good_args(ln); a.eps = std::numeric_limits<float>::quiet_NaN(); expect_error(ln, a, "eps=nan");
  a = good_args(ln); a.eps = std::numeric_limits<float>::infinity(); expect_error(ln, a, "eps=inf");
  a = good_args(ln); a.x = reinterpret_cast<const void*>(0x100008); expect_error(ln, a, "x=0x100008 is not aligned to 16 bytes");
  a = good_args(ln); a.y = reinterpret_cast<void*>(0x200002); expect_error(ln, a, "y=0x200002 is not aligned");
  a = good_args(ln); a.gamma = reinterpret_cast<const void*>(0x300001); expect_error(ln, a, "gamma=0x300001");
  a = good_args(ln); a.mean = reinterpret_cast<float*>(0x500002); expect_error(ln, a, "mean=0x500002");

  const Spec rms_infer = resolve(Spec::parse("rmsnorm.fwd_infer.f16.n4096"));
  a = good_args(rms_infer); a.beta = reinterpret_cast<const void*>(0x400000);
  expect_error(rms_infer, a, "beta=0x400000 is given but fwd_infer rmsnorm does not use it");
  a = good_args(rms_infer); a.rstd = reinterpret_cast<float*>(0x600000);
  expect_error(rms_infer, a, "rstd=0x600000 is given but fwd_infer rmsnorm does not use it");
  const Spec rms_train = resolve(Spec::parse("rmsnorm.fwd_train.f16.n4096"));
  a = good_args(rms_train); a.mean = reinterpret_cast<float*>(0x500000);
  expect_error(rms_train, a, "mean=0x500000 is given but fwd_train rmsnorm does not use it");
  a = good_args(rms_train); a.dx = reinterpret_cast<void*>(0x800000);
  expect_error(rms_train, a, "dx=0x800000 is given but fwd_train");

  const Spec bwd = resolve(Spec::parse("layernorm.bwd.bf16.w_f32.n4096.bias"));
  a = good_args(bwd); a.dy = nullptr; expect_error(bwd, a, "dy is null; bwd needs it");
  a = good_args(bwd); a.dgamma = nullptr; expect_error(bwd, a, "dgamma is null");
  a = good_args(bwd); a.dbeta = nullptr; expect_error(bwd, a, "dbeta is null");
  a = good_args(bwd); a.workspace = nullptr; expect_error(bwd, a, "workspace is null");
  a = good_args(bwd); a.y = reinterpret_cast<void*>(0x200000); expect_error(bwd, a, "y=0x200000 is given but bwd");
  a = good_args(bwd); a.beta = reinterpret_cast<const void*>(0x400000); expect_error(bwd, a, "beta=0x400000 is given");
  a = good_args(bwd); a.dgamma = reinterpret_cast<void*>(0x900002); expect_error(bwd, a, "dgamma=0x900002 is not aligned to 4");
  a = good_args(bwd); a.workspace = reinterpret_cast<void*>(0xb00008); expect_error(bwd, a, "workspace=0xb00008 is not aligned");

  const Spec gelu = resolve(Spec::parse("rmsnorm.bwd.bf16.n4096.bias.gelu"));
  a = good_args(gelu); expect_error(gelu, a, "beta is null; bwd needs it");

  const Spec ada = resolve(Spec::parse("adalayernorm.fwd_train.f16.n768.bias"));
  a = good_args(ada); a.rows_per_batch = 0; expect_error(ada, a, "rows_per_batch=0 must be >= 1");
  a = good_args(ada); a.rows_per_batch = 3; expect_error(ada, a, "rows=10 is not a multiple of rows_per_batch=3");
  a = good_args(ln); a.rows_per_batch = 5; expect_error(ln, a, "rows_per_batch=5 is given but only adalayernorm and adarmsnorm");
  const Spec ada_rms = resolve(Spec::parse("adarmsnorm.fwd_train.bf16.n768"));
  a = good_args(ada_rms); a.rows_per_batch = 0; expect_error(ada_rms, a, "rows_per_batch=0 must be >= 1 for adarmsnorm");
  a = good_args(ada_rms); a.mean = reinterpret_cast<float*>(0x500000); expect_error(ada_rms, a, "mean=0x500000 is given");

  const Spec relu = resolve(Spec::parse("layernorm.fwd_train.f32.n768.bias.relu_bitmask"));
  a = good_args(relu); a.mask = nullptr; expect_error(relu, a, "mask is null");
  a = good_args(relu); a.clip_lower = 6.f; a.clip_upper = 0.f; expect_error(relu, a, "clip_lower=6.000000 must be below");
  a = good_args(ln); a.mask = reinterpret_cast<uint8_t*>(0xc00000); expect_error(ln, a, "mask=0xc00000 is given");
}

TEST_CASE("memory_efficient backward: y in place of x, no mean, beta with a bias") {
  const Spec s = resolve(Spec::parse("layernorm.bwd.bf16.w_f32.n4096.bias.memory_efficient"));
  LaunchArgs a = good_args(s);
  a.y = const_cast<void*>(a.x);
  a.x = nullptr;
  a.mean = nullptr;
  a.beta = reinterpret_cast<const void*>(0x400000);
  CHECK_NOTHROW(validate_launch(s, a));
  LaunchArgs with_x = a;
  with_x.x = reinterpret_cast<const void*>(0x100000);
  expect_error(s, with_x, "x=0x100000 is given but bwd layernorm does not use it (a memory_efficient backward reads y instead)");
  LaunchArgs no_y = a;
  no_y.y = nullptr;
  expect_error(s, no_y, "y is null; bwd needs it (the forward's output, from which a memory_efficient backward recovers");
  LaunchArgs with_mean = a;
  with_mean.mean = reinterpret_cast<float*>(0x500000);
  expect_error(s, with_mean, "mean=0x500000 is given but bwd layernorm does not use it (a memory_efficient backward needs no mean)");
  LaunchArgs no_beta = a;
  no_beta.beta = nullptr;
  expect_error(s, no_beta, "beta is null; bwd needs it");
  // Without a bias there is no beta to undo.
  const Spec rms = resolve(Spec::parse("rmsnorm.bwd.bf16.w_f32.n4096.memory_efficient"));
  LaunchArgs r = good_args(rms);
  r.y = const_cast<void*>(r.x);
  r.x = nullptr;
  CHECK_NOTHROW(validate_launch(rms, r));
  r.beta = reinterpret_cast<const void*>(0x400000);
  expect_error(rms, r, "beta=0x400000 is given");
}

TEST_CASE("fp32 residual stream and bias_in: dresidual beside dx, bias_in forward only, fp32 alignment") {
  const Spec fwd = resolve(Spec::parse("rmsnorm.fwd_train.bf16.w_bf16.n4096.residual_f32.bias_in"));
  CHECK(fwd.block->vec == 4);  // rows held as f32: 16-byte packs of h, 8-byte packs of x
  LaunchArgs a = good_args(fwd);
  a.residual = reinterpret_cast<const void*>(0xd00000);
  a.h = reinterpret_cast<void*>(0xe00000);
  a.bias_in = reinterpret_cast<const void*>(0xf00000);
  CHECK_NOTHROW(validate_launch(fwd, a));
  LaunchArgs no_bias_in = a;
  no_bias_in.bias_in = nullptr;
  expect_error(fwd, no_bias_in, "bias_in is null; fwd_train needs it (the bias added with the residual (spec .bias_in))");
  LaunchArgs misaligned_h = a;
  misaligned_h.h = reinterpret_cast<void*>(0xe00008);  // 8-byte aligned: a bf16 pack, not an f32 one
  expect_error(fwd, misaligned_h, "h=0xe00008 is not aligned to 16 bytes (vec=4)");
  LaunchArgs stray_dresidual = a;
  stray_dresidual.dresidual = reinterpret_cast<void*>(0x1000000);
  expect_error(fwd, stray_dresidual, "dresidual=0x1000000 is given but fwd_train rmsnorm does not use it");
  // x (bf16) needs only 8 bytes at vec 4; h (f32) 16: max_vec_for narrows on h, not x.
  LaunchArgs x8 = a;
  x8.x = reinterpret_cast<const void*>(0x100008);
  CHECK(max_vec_for(fwd, x8) == 4);
  x8.h = reinterpret_cast<void*>(0xe00008);
  CHECK(max_vec_for(fwd, x8) == 2);

  const Spec bwd = resolve(Spec::parse("layernorm.bwd.bf16.w_f32.n4096.bias.residual_f32"));
  LaunchArgs b = good_args(bwd);
  b.dh_out = reinterpret_cast<const void*>(0xd00000);
  b.dresidual = reinterpret_cast<void*>(0xe00000);
  CHECK_NOTHROW(validate_launch(bwd, b));
  LaunchArgs no_dresidual = b;
  no_dresidual.dresidual = nullptr;
  expect_error(bwd, no_dresidual, "dresidual is null; bwd needs it (the fp32 gradient of the residual stream");
  LaunchArgs x_misaligned = b;  // the backward's x is h, fp32
  x_misaligned.x = reinterpret_cast<const void*>(0x100008);
  expect_error(bwd, x_misaligned, "x=0x100008 is not aligned to 16 bytes (vec=4)");
  // The plain residual backward takes no dresidual (dx is the gradient of both).
  const Spec plain = resolve(Spec::parse("layernorm.bwd.bf16.w_f32.n4096.bias.residual"));
  LaunchArgs p = good_args(plain);
  p.dh_out = reinterpret_cast<const void*>(0xd00000);
  CHECK_NOTHROW(validate_launch(plain, p));
  p.dresidual = reinterpret_cast<void*>(0xe00000);
  expect_error(plain, p, "dresidual=0xe00000 is given but bwd layernorm does not use it");
}

TEST_CASE("max_vec_for narrows the vector to what pointers and stride allow") {
  const Spec s = Spec::parse("layernorm.fwd_train.bf16.n4096");
  LaunchArgs a = good_args(resolve(s));
  CHECK(max_vec_for(s, a) == 8);
  a.x = reinterpret_cast<const void*>(0x100004);
  CHECK(max_vec_for(s, a) == 2);
  a = good_args(resolve(s));
  a.row_stride = 4100;
  CHECK(max_vec_for(s, a) == 4);
  const Spec odd = resolve(Spec::parse("layernorm.fwd_train.bf16.n4097"), max_vec_for(s, a));
  CHECK(odd.block->vec == 1);
  // A spec resolved with the narrowed vector accepts the arguments.
  const Spec narrowed = resolve(s, max_vec_for(s, a));
  CHECK_NOTHROW(validate_launch(narrowed, a));
}

TEST_CASE("quantizing epilogues: y_quant and quant_scale required, y and amax optional, amax only with them") {
  const Spec s = resolve(Spec::parse("layernorm.fwd_train.bf16.n4096.bias.fp8_e4m3"));
  LaunchArgs a = good_args(s);
  a.y_quant = reinterpret_cast<void*>(0xd00000);
  a.quant_scale = reinterpret_cast<const float*>(0xe00000);
  CHECK_NOTHROW(validate_launch(s, a));  // with y
  a.amax = reinterpret_cast<float*>(0xf00000);
  a.y = nullptr;
  CHECK_NOTHROW(validate_launch(s, a));  // codes and amax only
  LaunchArgs b = a;
  b.y_quant = nullptr;
  expect_error(s, b, "y_quant is null");
  b = a;
  b.quant_scale = nullptr;
  expect_error(s, b, "quant_scale is null");
  b = a;
  b.y_quant = reinterpret_cast<void*>(0xd00004);  // vec 8 needs 8-byte codes
  expect_error(s, b, "y_quant=0xd00004 is not aligned to 8 bytes");
  CHECK(max_vec_for(s, b) == 4);
  const Spec plain = resolve(Spec::parse("layernorm.fwd_train.bf16.n4096.bias"));
  b = good_args(plain);
  b.amax = reinterpret_cast<float*>(0xf00000);
  expect_error(plain, b, "amax=0xf00000 is given but only the per-tensor FP8 epilogues");
  b = good_args(plain);
  b.y_quant = reinterpret_cast<void*>(0xd00000);
  expect_error(plain, b, "y_quant=0xd00000 is given");
}

TEST_CASE("MXFP8 epilogues: y_quant and block_scales required, no other scale") {
  const Spec s = resolve(Spec::parse("rmsnorm.fwd_infer.bf16.n4096.mxfp8_e4m3"));
  LaunchArgs a = good_args(s);
  a.y_quant = reinterpret_cast<void*>(0xd00000);
  a.block_scales = reinterpret_cast<uint8_t*>(0xe00001);  // bytes: any alignment
  CHECK_NOTHROW(validate_launch(s, a));
  LaunchArgs b = a;
  b.block_scales = nullptr;
  expect_error(s, b, "block_scales is null");
  b = a;
  b.row_scales = reinterpret_cast<float*>(0xe00010);
  expect_error(s, b, "row_scales=0xe00010 is given");
  b = a;
  b.amax = reinterpret_cast<float*>(0xf00000);
  expect_error(s, b, "amax=0xf00000 is given");
}

TEST_CASE("MXFP4 / NVFP4: packed codes at half x's row stride, NVFP4's tensor scale, the scale layout") {
  const Spec mx = resolve(Spec::parse("rmsnorm.fwd_infer.bf16.n4096.mxfp4"));
  const Spec nv = resolve(Spec::parse("rmsnorm.fwd_infer.bf16.n4096.nvfp4"));
  REQUIRE(mx.block->vec == 8);
  LaunchArgs a = good_args(mx);
  a.y_quant = reinterpret_cast<void*>(0xd00004);  // 8 codes are 4 bytes: 4-byte aligned suffices
  a.block_scales = reinterpret_cast<uint8_t*>(0xe00001);
  CHECK_NOTHROW(validate_launch(mx, a));
  CHECK(max_vec_for(mx, a) == 8);
  LaunchArgs b = a;
  b.y_quant = reinterpret_cast<void*>(0xd00002);
  expect_error(mx, b, "y_quant=0xd00002 is not aligned to 4 bytes");
  CHECK(max_vec_for(mx, b) == 4);
  b = a;
  b.quant_scale = reinterpret_cast<const float*>(0xe00010);
  expect_error(mx, b, "quant_scale=0xe00010 is given");
  b = a;
  b.row_stride = 4098;  // even: rows 2049 bytes apart
  CHECK(max_vec_for(mx, b) == 2);
  const Spec narrow = resolve(Spec::parse("rmsnorm.fwd_infer.bf16.n4096.mxfp4"), 2);
  CHECK_NOTHROW(validate_launch(narrow, b));
  const Spec vec1 = resolve(Spec::parse("rmsnorm.fwd_infer.bf16.n4096.mxfp4"), 1);
  b.row_stride = 4097;
  expect_error(vec1, b, "row_stride=4097 must be even for mxfp4: y_quant's rows lie row_stride / 2 bytes apart");

  LaunchArgs n = good_args(nv);
  n.y_quant = reinterpret_cast<void*>(0xd00000);
  n.block_scales = reinterpret_cast<uint8_t*>(0xe00000);
  expect_error(nv, n, "quant_scale is null");
  n.quant_scale = reinterpret_cast<const float*>(0xe00100);
  CHECK_NOTHROW(validate_launch(nv, n));
  n.amax = reinterpret_cast<float*>(0xf00000);
  expect_error(nv, n, "amax=0xf00000 is given but only the per-tensor FP8 epilogues");
  n.amax = nullptr;
  n.block_scales = nullptr;
  expect_error(nv, n, "block_scales is null");

  // The layout: any block-scaled epilogue, MXFP8 included; never another.
  a.block_scale_layout = BlockScaleLayout::kSwizzled;
  CHECK_NOTHROW(validate_launch(mx, a));
  const Spec mx8 = resolve(Spec::parse("rmsnorm.fwd_infer.bf16.n4096.mxfp8_e4m3"));
  b = good_args(mx8);
  b.y_quant = reinterpret_cast<void*>(0xd00000);
  b.block_scales = reinterpret_cast<uint8_t*>(0xe00000);
  b.block_scale_layout = BlockScaleLayout::kSwizzled;
  CHECK_NOTHROW(validate_launch(mx8, b));
  b.block_scale_layout = static_cast<BlockScaleLayout>(7);
  expect_error(mx8, b, "block_scale_layout=7 is not row_major (0) or swizzled (1)");
  const Spec row = resolve(Spec::parse("rmsnorm.fwd_infer.bf16.n4096.int8_row"));
  b = good_args(row);
  b.y_quant = reinterpret_cast<void*>(0xd00000);
  b.row_scales = reinterpret_cast<float*>(0xe00000);
  b.block_scale_layout = BlockScaleLayout::kSwizzled;
  expect_error(row, b, "block_scale_layout=swizzled is given but only the block-scaled epilogues");
}

TEST_CASE("block_scale_bytes: row-major rows x ceil(n / block), swizzled padded to 128 x 4 tiles") {
  CHECK(block_scale_row_bytes(4096, Epilogue::kMxfp8E4M3) == 128);
  CHECK(block_scale_row_bytes(4096, Epilogue::kMxfp4) == 128);
  CHECK(block_scale_row_bytes(4096, Epilogue::kNvfp4) == 256);
  CHECK(block_scale_row_bytes(100, Epilogue::kNvfp4) == 7);
  CHECK(block_scale_row_bytes(100, Epilogue::kMxfp8E5M2) == 4);
  CHECK(block_scale_row_bytes(100, Epilogue::kFp8E4M3) == 0);
  CHECK(block_scale_bytes(37, 100, Epilogue::kNvfp4, BlockScaleLayout::kRowMajor) == 37 * 7);
  CHECK(block_scale_bytes(37, 100, Epilogue::kNvfp4, BlockScaleLayout::kSwizzled) == 128 * 8);
  CHECK(block_scale_bytes(256, 4096, Epilogue::kMxfp4, BlockScaleLayout::kSwizzled) == 256 * 128);
  CHECK(block_scale_bytes(257, 4096, Epilogue::kMxfp4, BlockScaleLayout::kSwizzled) == 384 * 128);
  CHECK(block_scale_bytes(0, 4096, Epilogue::kMxfp4, BlockScaleLayout::kSwizzled) == 0);
  CHECK(std::string(to_string(BlockScaleLayout::kSwizzled)) == "swizzled");
}

TEST_CASE("per-row quantizing epilogues: y_quant and row_scales required, no quant_scale or amax") {
  const Spec s = resolve(Spec::parse("rmsnorm.fwd_infer.bf16.n4096.int8_row"));
  LaunchArgs a = good_args(s);
  a.y_quant = reinterpret_cast<void*>(0xd00000);
  a.row_scales = reinterpret_cast<float*>(0xe00000);
  CHECK_NOTHROW(validate_launch(s, a));
  a.y = nullptr;
  CHECK_NOTHROW(validate_launch(s, a));  // codes and scales only
  LaunchArgs b = a;
  b.row_scales = nullptr;
  expect_error(s, b, "row_scales is null");
  b = a;
  b.quant_scale = reinterpret_cast<const float*>(0xe00010);
  expect_error(s, b, "quant_scale=0xe00010 is given");
  b = a;
  b.amax = reinterpret_cast<float*>(0xf00000);
  expect_error(s, b, "amax=0xf00000 is given but only the per-tensor FP8 epilogues");
  b = a;
  b.row_scales = reinterpret_cast<float*>(0xe00002);
  expect_error(s, b, "row_scales=0xe00002 is not aligned to 4 bytes");
  const Spec tensor = resolve(Spec::parse("rmsnorm.fwd_infer.bf16.n4096.fp8_e4m3"));
  b = good_args(tensor);
  b.y_quant = reinterpret_cast<void*>(0xd00000);
  b.quant_scale = reinterpret_cast<const float*>(0xe00000);
  b.row_scales = reinterpret_cast<float*>(0xe00010);
  expect_error(tensor, b, "row_scales=0xe00010 is given");
}
