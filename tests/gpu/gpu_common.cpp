#include <algorithm>

#include "normjit/quant_reference.hpp"
#include "templates/normjit/block_scale_layout.h"
#include "tests/gpu/gpu_common.hpp"

namespace gpu_test {

namespace {

Spec forward_of(const Spec& s) {
  Spec f = s;
  f.phase = Phase::kForwardTraining;
  f.memory_efficient = false;
  f.block.reset();
  return f;
}

struct Shapes {
  int64_t n, stride, elems, groups, mask_bytes;
  int xs, ws, rs;  // element bytes of x, the weights, and the residual stream (row_dtype)
};

Shapes shapes_of(const Case& c) {
  Shapes sh;
  sh.n = c.spec.n;
  sh.stride = c.row_stride ? c.row_stride : sh.n;
  sh.elems = (c.rows + 1) * sh.stride + c.x_offset;  // one row past the end stays untouched
  sh.groups = groups_of(c);
  sh.mask_bytes = (c.rows + 1) * mask_row_bytes(sh.n);
  sh.xs = dtype_size(c.spec.x_dtype);
  sh.ws = dtype_size(c.spec.w_dtype);
  sh.rs = dtype_size(row_dtype(c.spec));
  return sh;
}

// The spec launch() resolves for a case (fresh cuMemAlloc buffers, 256-byte aligned, offset as
// run_forward / run_backward offset them: the vector width follows the row stride and x_offset).
Spec launch_spec(const Spec& s, const Case& c) {
  if (s.block) return s;
  const Shapes sh = shapes_of(c);
  char* const base = reinterpret_cast<char*>(uintptr_t(1) << 20);
  const int64_t off = c.x_offset;
  LaunchArgs a;
  a.row_stride = sh.stride;
  a.x = base + off * (s.phase == Phase::kBackward && s.residual ? sh.rs : sh.xs);
  a.y = a.dx = base + off * sh.xs;
  a.dy = a.y;
  if (s.residual) {
    a.residual = a.dh_out = base + off * sh.rs;
    a.h = a.dresidual = base + off * sh.rs;
  }
  if (quantizes(s.epilogue)) a.y_quant = base + (packs_fp4(s.epilogue) ? off / 2 : off);
  return resolve(s, max_vec_for(s, a), listing_arch());
}

// Whether a run in listing mode lists its kernel: generic kernels and launches through a
// runtime's compile mode compile none ahead.
bool lists_kernels() { return !use_generic_kernels() && !launch_through(); }

// Launches through the kernel resolved for these pointers, with its workspace when backward.
void launch(const Spec& spec, LaunchArgs a) {
  if (Runtime* rt = launch_through()) {  // Runtime::launch, as its compile mode says
    std::unique_ptr<DeviceMem> workspace;
    if (spec.phase == Phase::kBackward) {
      a.workspace_bytes = rt->workspace_bytes(spec, a.rows, a.rows_per_batch, max_vec_for(spec, a));
      workspace = std::make_unique<DeviceMem>(a.workspace_bytes);
      NORMJIT_CU(cuMemsetD8(workspace->ptr, 0xff, workspace->bytes));
      a.workspace = workspace->get();
    }
    rt->launch(spec, a);
    NORMJIT_CU(cuCtxSynchronize());
    return;
  }
  if (use_generic_kernels()) {
    std::unique_ptr<DeviceMem> workspace;
    if (spec.phase == Phase::kBackward) {
      a.workspace_bytes = runtime().generic_workspace_bytes(spec, a.rows, a.rows_per_batch);
      workspace = std::make_unique<DeviceMem>(a.workspace_bytes);
      NORMJIT_CU(cuMemsetD8(workspace->ptr, 0xff, workspace->bytes));  // stale partials must not matter
      a.workspace = workspace->get();
    }
    runtime().launch_generic(spec, a);
    NORMJIT_CU(cuCtxSynchronize());
    return;
  }
  const Kernel& k = runtime().get(spec.block ? spec : resolve(spec, max_vec_for(spec, a), runtime().target().arch));
  std::unique_ptr<DeviceMem> workspace;
  if (spec.phase == Phase::kBackward) {
    a.workspace_bytes = k.workspace_bytes(a.rows, a.rows_per_batch);
    workspace = std::make_unique<DeviceMem>(a.workspace_bytes);
    NORMJIT_CU(cuMemsetD8(workspace->ptr, 0xff, workspace->bytes));  // stale partials must not matter
    a.workspace = workspace->get();
  }
  k.launch(a);
  NORMJIT_CU(cuCtxSynchronize());
}

}  // namespace

int listing_arch() {
  static const int arch = [] {
    const char* env = std::getenv("NORMJIT_GPU_TEST_ARCH");
    if (!env || !*env) return 90;
    char* end = nullptr;
    const long value = std::strtol(env, &end, 10);
    if (*end != '\0' || value < 50 || value > 999) {
      std::fprintf(stderr, "gpu tests: NORMJIT_GPU_TEST_ARCH='%s' is not an SM version such as 90\n", env);
      std::exit(2);
    }
    return static_cast<int>(value);
  }();
  return arch;
}

void list_specs(const std::vector<Spec>& resolved) {
  static std::mutex mutex;
  static FILE* const file = std::fopen(listing_file(), "a");  // flushed a call at a time, closed at exit
  if (!file) throw std::runtime_error(std::string("NORMJIT_GPU_TEST_LIST_SPECS: cannot append to ") + listing_file());
  std::lock_guard<std::mutex> lock(mutex);
  for (const Spec& s : resolved) std::fprintf(file, "%s\n", s.str().c_str());
  std::fflush(file);
}

ForwardRun run_forward(const Case& c) {
  const Spec s = c.spec.phase == Phase::kBackward ? forward_of(c.spec) : c.spec;
  if (listing_file()) {
    if (lists_kernels()) list_specs({launch_spec(s, c)});
    return {};
  }
  const Shapes sh = shapes_of(c);
  const bool training = s.phase == Phase::kForwardTraining;
  const bool has_mean = training && subtracts_mean(s.norm);
  const bool bitmask = s.epilogue == Epilogue::kReluBitmask;
  ForwardRun run;
  run.x = random_tensor(s.x_dtype, sh.elems, c.center, 1.0);
  run.gamma = random_tensor(s.w_dtype, sh.groups * sh.n, 1.0, 0.5);
  for (int64_t i = 0; c.min_abs_scale > 0 && i < sh.groups * sh.n; ++i)
    if (std::abs(reference::load(run.gamma.data(), s.w_dtype, i) + (s.zero_centered ? 1 : 0)) < c.min_abs_scale)
      reference::store(run.gamma.data(), s.w_dtype, i, s.zero_centered ? 0.f : 1.f);
  run.beta = random_tensor(s.w_dtype, sh.groups * sh.n, 0.0, 0.5);
  DeviceMem x(run.x.size()), y(run.x.size()), g(run.gamma.size()), b(run.beta.size()), mean(4 * (c.rows + 1)),
      rstd(4 * (c.rows + 1)), mask(sh.mask_bytes);
  x.upload(run.x.data(), run.x.size());
  g.upload(run.gamma.data(), run.gamma.size());
  b.upload(run.beta.data(), run.beta.size());
  y.poison();
  // residual specs: h = x (+ bias_in) + residual is written and normalized, in the stream's dtype.
  const DType stream = row_dtype(s);
  const std::vector<char> residual_host = s.residual ? random_tensor(stream, sh.elems, 0.0, 1.0) : std::vector<char>{};
  const std::vector<char> bias_in_host = s.bias_in ? random_tensor(s.w_dtype, sh.n, 0.0, 0.5) : std::vector<char>{};
  DeviceMem residual(residual_host.size()), h(residual_host.size()), bias_in(bias_in_host.size());
  if (s.residual) {
    residual.upload(residual_host.data(), residual_host.size());
    h.poison();
  }
  if (s.bias_in) bias_in.upload(bias_in_host.data(), bias_in_host.size());
  mean.poison();
  rstd.poison();
  mask.poison();
  // fp8_e4m3 / fp8_e5m2: a scale that saturates the largest few values, and an amax starting at 0.
  // *_row: each row's scale comes back in row_scales (one poisoned slot past the end).
  // Block scales: in c.scale_layout, with a row (row-major) or a tile (swizzled) past the end;
  // every byte that is not a real scale keeps its poison. mxfp4 / nvfp4: two codes a byte (n,
  // row stride and x_offset even), nvfp4's S_enc 448 * 6 / 8 (a block over 8 clamps its scale).
  const bool quant = quantizes(s.epilogue);
  const bool per_row = scales_per_row(s.epilogue), int8 = s.epilogue == Epilogue::kInt8Row;
  const bool per_block = scales_per_block(s.epilogue), per_tensor = scales_per_tensor(s.epilogue);
  const bool fp4 = packs_fp4(s.epilogue), nvfp4 = s.epilogue == Epilogue::kNvfp4;
  const int64_t blocks = block_scale_row_bytes(sh.n, s.epilogue), block = scale_block_size(s.epilogue);
  const int layout = static_cast<int>(c.scale_layout);
  const int64_t scale_bytes =
      per_block ? block_scale_bytes(c.rows, sh.n, s.epilogue, c.scale_layout) +
                      (c.scale_layout == BlockScaleLayout::kSwizzled ? 512 : blocks)
                : 0;
  const reference::MiniFloat format = fp4             ? reference::MiniFloat::kE2M1
                                      : quant && !int8 ? reference::fp8_element(s.epilogue)
                                                       : reference::MiniFloat::kE4M3;  // unused without FP codes
  run.quant_scale = per_tensor ? static_cast<float>(reference::max_finite(format) / 6.0) : nvfp4 ? 336.f : 0.f;
  const float zero = 0.f;
  DeviceMem y_quant(quant ? (fp4 ? (sh.elems + 1) / 2 : sh.elems) : 0), quant_scale(4), amax(4),
      row_scales(per_row ? 4 * (c.rows + 1) : 0), block_scales(scale_bytes);
  if (quant) {
    y_quant.poison();
    quant_scale.upload(&run.quant_scale, 4);
    amax.upload(&zero, 4);
    row_scales.poison();
    block_scales.poison();
  }

  LaunchArgs a;
  a.x = x.get() + c.x_offset * sh.xs;
  a.y = y.get() + c.x_offset * sh.xs;
  a.gamma = g.get();
  a.beta = s.has_bias ? b.get() : nullptr;
  a.mean = has_mean ? reinterpret_cast<float*>(mean.get()) : nullptr;
  a.rstd = training ? reinterpret_cast<float*>(rstd.get()) : nullptr;
  a.mask = bitmask ? reinterpret_cast<uint8_t*>(mask.get()) : nullptr;
  a.clip_lower = c.clip_lower;
  a.clip_upper = c.clip_upper;
  a.rows = c.rows;
  a.row_stride = sh.stride;
  a.rows_per_batch = c.rows_per_batch;
  a.eps = 1e-5f;
  if (s.residual) {
    a.residual = residual.get() + c.x_offset * sh.rs;
    a.h = h.get() + c.x_offset * sh.rs;
  }
  if (s.bias_in) a.bias_in = bias_in.get();
  if (quant) a.y_quant = y_quant.get() + (fp4 ? c.x_offset / 2 : c.x_offset);
  if (reads_quant_scale(s.epilogue)) a.quant_scale = reinterpret_cast<const float*>(quant_scale.get());
  if (per_tensor) a.amax = reinterpret_cast<float*>(amax.get());
  if (per_row) a.row_scales = reinterpret_cast<float*>(row_scales.get());
  if (per_block) {
    a.block_scales = reinterpret_cast<uint8_t*>(block_scales.get());
    a.block_scale_layout = c.scale_layout;
  }
  launch(s, a);
  run.y.resize(run.x.size());
  y.download(run.y.data(), run.y.size());
  run.mean.resize(c.rows + 1);
  run.rstd.resize(c.rows + 1);
  mean.download(run.mean.data(), 4 * (c.rows + 1));
  rstd.download(run.rstd.data(), 4 * (c.rows + 1));
  run.mask.resize(sh.mask_bytes);
  mask.download(run.mask.data(), run.mask.size());

  // The sum the kernel must have stored, computed as it does: in fp32 ((x + bias_in) + residual),
  // rounded once to the stream's dtype.
  std::vector<char> h_want = run.x;
  if (s.residual) {
    h_want.assign(residual_host.size(), 0);
    run.h.resize(residual_host.size());
    h.download(run.h.data(), run.h.size());
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t i = 0; i < sh.n; ++i) {
        const int64_t e = c.x_offset + r * sh.stride + i;
        float sum = reference::load(run.x.data(), s.x_dtype, e);
        if (s.bias_in) sum += reference::load(bias_in_host.data(), s.w_dtype, i);
        reference::store(h_want.data(), stream, e, sum + reference::load(residual_host.data(), stream, e));
        if (std::memcmp(h_want.data() + e * sh.rs, run.h.data() + e * sh.rs, sh.rs) != 0) ++run.h_mismatches;
      }
  }
  const auto ref = reference::forward(s, h_want.data() + c.x_offset * (s.residual ? sh.rs : sh.xs), run.gamma.data(),
                                      s.has_bias ? run.beta.data() : nullptr, c.rows, sh.stride, 1e-5,
                                      c.rows_per_batch, c.clip_lower, c.clip_upper);
  reference::Tolerance tol = reference::tolerance(s.x_dtype);
  if (c.atol >= 0) tol = {c.atol, c.rtol};
  Worst worst;
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t i = 0; i < sh.n; ++i) {
      const double got = reference::load(run.y.data(), s.x_dtype, c.x_offset + r * sh.stride + i);
      const double want = ref.y[r * sh.n + i];
      worst.add(got, want, tol.atol, tol.rtol);
      if (bitmask) {
        const bool bit = (run.mask[r * mask_row_bytes(sh.n) + i / 8] >> (i % 8)) & 1;
        // Exact against the y the GPU stored; against the reference, except within the
        // tolerance of a clip boundary, where rounding decides.
        if (bit != (c.clip_lower < got && got < c.clip_upper)) ++run.mask_mismatches;
        const double margin = tol.atol + tol.rtol * std::abs(want);
        const bool near_edge = std::abs(want - c.clip_lower) <= margin || std::abs(want - c.clip_upper) <= margin;
        if (!near_edge && bit != (c.clip_lower < want && want < c.clip_upper)) ++run.mask_ref_mismatches;
      }
    }
    if (bitmask)  // bits past n in the last byte are 0
      for (int64_t i = sh.n; i < mask_row_bytes(sh.n) * 8; ++i)
        if ((run.mask[r * mask_row_bytes(sh.n) + i / 8] >> (i % 8)) & 1) ++run.mask_mismatches;
    if (training) worst.add(run.rstd[r], ref.rstd[r], 1e-6, 1e-4);
    if (has_mean) worst.add(run.mean[r], ref.mean[r], 1e-5, 1e-4);
  }
  if (quant) {
    std::vector<uint8_t> codes(y_quant.bytes);
    y_quant.download(codes.data(), codes.size());
    // The code of element e (x's element index): a byte, or a nibble (the first element low).
    const uint8_t poison_code = fp4 ? 0xF : 0xff;
    auto code_at = [&](int64_t e) -> uint8_t {
      return fp4 ? static_cast<uint8_t>((codes[e / 2] >> (e % 2 ? 4 : 0)) & 0xF) : codes[e];
    };
    float amax_got = 0;
    amax.download(&amax_got, 4);
    std::vector<float> scales_got(per_row ? c.rows + 1 : 0);
    if (per_row) row_scales.download(scales_got.data(), 4 * scales_got.size());
    std::vector<uint8_t> block_codes(scale_bytes);
    if (per_block) {
      block_scales.download(block_codes.data(), block_codes.size());
      std::vector<bool> real(block_codes.size(), false);
      for (int64_t r = 0; r < c.rows; ++r)
        for (int64_t b = 0; b < blocks; ++b) real[block_scale_offset(r, b, blocks, layout)] = true;
      for (size_t k = 0; k < real.size(); ++k)  // padding and the row or tile past the end keep their poison
        if (!real[k] && block_codes[k] != 0xff) ++run.quant_mismatches;
    }
    // The row's past-the-end slot keeps its poison.
    const std::vector<char> poison(4, static_cast<char>(0xff));
    if (per_row && std::memcmp(&scales_got[c.rows], poison.data(), 4) != 0) ++run.quant_mismatches;
    const double qmax = int8 ? 127.0 : reference::max_finite(format);
    auto encode = [&](double v) -> uint8_t {
      if (!int8) return reference::encode_satfinite(format, v);
      return static_cast<uint8_t>(static_cast<int8_t>(std::clamp(std::nearbyint(v), -128.0, 127.0)));
    };
    auto value_of = [&](uint8_t code) -> double {
      return int8 ? static_cast<double>(static_cast<int8_t>(code)) : reference::decode(format, code);
    };
    const reference::Tolerance f32_tol = reference::tolerance(DType::kF32);
    double amax_want = 0;
    struct AmbiguousRow {
      int64_t row = 0, count = 0;
      double amax = 0, multiplier = 0;
      std::string first;
    };
    std::vector<AmbiguousRow> ambiguous_rows;
    auto row_amax_of = [&](int64_t r) {
      double row_amax = 0;
      for (int64_t i = 0; i < sh.n; ++i) row_amax = std::max(row_amax, std::abs(ref.y[r * sh.n + i]));
      return row_amax;
    };
    for (int64_t r = 0; r <= c.rows; ++r) {
      const int64_t ambiguous_before = run.quant_ambiguous;
      std::string first_ambiguous;
      // Per-row: the scale against the reference row's amax / qmax; the codes against the scale
      // the kernel stored, so a scale one ulp off does not move every code.
      double multiplier = run.quant_scale;
      if (per_row && r < c.rows) {
        const double row_amax = row_amax_of(r);
        const double scale_want = row_amax > 0 ? row_amax / qmax : 1.0;
        run.row_scale_rel_err = std::max(run.row_scale_rel_err, std::abs(scales_got[r] - scale_want) / scale_want);
        multiplier = static_cast<double>(1.0f / scales_got[r]);  // the kernel's fp32 reciprocal
      }
      for (int64_t i = 0; i < sh.stride; ++i) {
        const uint8_t code = code_at(c.x_offset + r * sh.stride + i);
        if (r == c.rows || i >= sh.n) {  // padding and the row past the end keep their poison
          if (code != poison_code) ++run.quant_mismatches;
          continue;
        }
        if (per_block && i % block == 0) {
          // The block's scale against the reference's code (MX: E8M0 of the fp64 block amax;
          // NVFP4: e4m3 of amax / 6 * S_enc); where that amax sits within the fp32 y's tolerance
          // of a rounding boundary (and two fp32 roundings for NVFP4), either neighbouring code.
          double block_amax = 0;
          for (int64_t k = i; k < std::min<int64_t>(i + block, sh.n); ++k)
            block_amax = std::max(block_amax, std::abs(ref.y[r * sh.n + k]));
          const double slack = f32_tol.atol + f32_tol.rtol * block_amax;
          const uint8_t got = block_codes[block_scale_offset(r, i / block, blocks, layout)];
          uint8_t lo, hi;
          if (nvfp4) {
            const double s_enc = run.quant_scale;
            lo = reference::encode_satfinite(reference::MiniFloat::kE4M3,
                                             std::max(block_amax - slack, 0.0) / 6 * s_enc * (1 - 2.5e-7));
            hi = reference::encode_satfinite(reference::MiniFloat::kE4M3, (block_amax + slack) / 6 * s_enc * (1 + 2.5e-7));
            // The kernel's own multiplier: S_enc / s rounded to fp32 (0 where s is 0).
            const float scale = static_cast<float>(reference::decode(reference::MiniFloat::kE4M3, got));
            multiplier = scale > 0.f ? static_cast<double>(run.quant_scale / scale) : 0.0;
          } else {
            lo = reference::mx_scale_code(std::max(block_amax - slack, 0.0), format);
            hi = reference::mx_scale_code(block_amax + slack, format);
            multiplier = 1.0 / reference::decode_e8m0(got);  // the kernel's own X: exact
          }
          if (lo != hi) ++run.quant_ambiguous;
          if (got < lo || got > hi) ++run.quant_mismatches;
        }
        const double want = ref.y[r * sh.n + i];
        amax_want = std::max(amax_want, std::abs(want));
        // The kernel quantizes its fp32 y, which sits within f32's tolerance of the fp64 one
        // (and rounds the product once more): within that window of a rounding boundary either
        // neighbouring code is right.
        const double v = want * multiplier;
        const double margin = (f32_tol.atol + f32_tol.rtol * std::abs(want)) * multiplier + std::abs(v) * 1.2e-7;
        const uint8_t lo = encode(v - margin);
        const uint8_t hi = encode(v + margin);
        ++run.quant_checked;
        if (lo == hi) {  // bit-exact
          if (code != lo && run.quant_mismatches++ == 0)
            run.quant_first_mismatch = "row " + std::to_string(r) + " col " + std::to_string(i) + ": y " +
                                       std::to_string(want) + " x " + std::to_string(multiplier) + " gave code " +
                                       std::to_string(code) + ", want " + std::to_string(lo);
          continue;
        }
        // Near zero the window may span several of a fine format's subnormal codes (e5m2's step
        // is 2^-16): any code whose value lies between the window's two ends is right.
        ++run.quant_ambiguous;
        if (std::count(first_ambiguous.begin(), first_ambiguous.end(), ';') < 3)
          first_ambiguous += " " + std::to_string(want) + " -> " + std::to_string(v) + " +- " +
                             std::to_string(margin) + ";";
        const double got_value = value_of(code);
        if (!(value_of(lo) <= got_value && got_value <= value_of(hi)) && run.quant_mismatches++ == 0)
          run.quant_first_mismatch = "row " + std::to_string(r) + " col " + std::to_string(i) + ": y " +
                                     std::to_string(want) + " x " + std::to_string(multiplier) + " gave code " +
                                     std::to_string(code) + ", want " + std::to_string(lo) + ".." + std::to_string(hi);
      }
      if (run.quant_ambiguous > ambiguous_before)
        ambiguous_rows.push_back(
            {r, run.quant_ambiguous - ambiguous_before, row_amax_of(r), multiplier, first_ambiguous});
    }
    std::sort(ambiguous_rows.begin(), ambiguous_rows.end(),
              [](const AmbiguousRow& a, const AmbiguousRow& b) { return a.count > b.count; });
    for (size_t k = 0; k < std::min<size_t>(ambiguous_rows.size(), 4); ++k) {
      const AmbiguousRow& a = ambiguous_rows[k];
      run.quant_ambiguous_where += "row " + std::to_string(a.row) + ": " + std::to_string(a.count) + " (amax " +
                                   std::to_string(a.amax) + ", x " + std::to_string(a.multiplier) + ";" + a.first +
                                   ") ";
    }
    if (per_tensor) run.amax_rel_err = std::abs(amax_got - amax_want) / std::max(amax_want, 1e-30);
  }
  // Padding between rows and the row past the end keep their poison.
  const std::vector<char> poison(16, static_cast<char>(0xff));
  for (int64_t r = 0; r <= c.rows; ++r)
    for (int64_t i = (r == c.rows ? 0 : sh.n); i < sh.stride; ++i)
      if (std::memcmp(run.y.data() + (c.x_offset + r * sh.stride + i) * sh.xs, poison.data(), sh.xs) != 0 ||
          (s.residual &&
           std::memcmp(run.h.data() + (c.x_offset + r * sh.stride + i) * sh.rs, poison.data(), sh.rs) != 0))
        worst.value = INFINITY;
  if (s.residual && run.h_mismatches > 0) worst.value = INFINITY;
  if (training && std::memcmp(&run.rstd[c.rows], poison.data(), 4) != 0) worst.value = INFINITY;
  if (bitmask && run.mask[c.rows * mask_row_bytes(sh.n)] != 0xff) worst.value = INFINITY;
  run.worst = worst.value;
  return run;
}

BackwardRun run_backward(const Case& c, int reps, std::vector<std::vector<char>>* all_dgamma,
                         std::vector<std::vector<char>>* all_dx) {
  const Spec& s = c.spec;
  const Shapes sh = shapes_of(c);
  const ForwardRun fwd = run_forward(c);  // mean, rstd and mask from the GPU forward
  if (listing_file()) {
    if (lists_kernels()) list_specs({launch_spec(s, c)});
    BackwardRun empty;  // outputs of the right sizes, zero, for the cases that read them
    empty.dx_bytes.resize(sh.elems * sh.xs);
    empty.dgamma_bytes.resize(sh.groups * sh.n * sh.ws);
    empty.dbeta_bytes.resize(empty.dgamma_bytes.size());
    return empty;
  }
  // A residual spec's backward reads h, the forward's normalized input, and adds dh_out to dx.
  const std::vector<char>& x_host = s.residual ? fwd.h : fwd.x;
  const std::vector<char> dy_host = random_tensor(s.x_dtype, sh.elems, 0.0, 1.0);
  const DType stream = row_dtype(s);
  const std::vector<char> dh_host = s.residual ? random_tensor(stream, sh.elems, 0.0, 1.0) : std::vector<char>{};
  DeviceMem dh(dh_host.size()), dresidual(s.residual_f32 ? dh_host.size() : 0);
  if (s.residual) dh.upload(dh_host.data(), dh_host.size());
  // A memory_efficient backward reads the y the GPU forward stored, in x's place.
  const bool from_y = s.memory_efficient;
  DeviceMem x(from_y ? fwd.y.size() : x_host.size()), dy(dy_host.size()), dx(fwd.x.size()), g(fwd.gamma.size()), b(fwd.beta.size()),
      mean(4 * (c.rows + 1)), rstd(4 * (c.rows + 1)), mask(sh.mask_bytes), dg(sh.groups * sh.n * sh.ws),
      db(sh.groups * sh.n * sh.ws);
  if (from_y) x.upload(fwd.y.data(), fwd.y.size());
  else x.upload(x_host.data(), x_host.size());
  dy.upload(dy_host.data(), dy_host.size());
  g.upload(fwd.gamma.data(), fwd.gamma.size());
  b.upload(fwd.beta.data(), fwd.beta.size());
  mean.upload(fwd.mean.data(), 4 * (c.rows + 1));
  rstd.upload(fwd.rstd.data(), 4 * (c.rows + 1));
  mask.upload(fwd.mask.data(), fwd.mask.size());
  const bool bitmask = s.epilogue == Epilogue::kReluBitmask;

  LaunchArgs a;
  a.x = x.get() + c.x_offset * (s.residual ? sh.rs : sh.xs);  // h, in the stream's dtype
  a.dy = dy.get() + c.x_offset * sh.xs;
  a.dx = dx.get() + c.x_offset * sh.xs;
  a.gamma = g.get();
  a.beta = s.has_bias && (s.epilogue == Epilogue::kGelu || from_y) ? b.get() : nullptr;
  a.mean = subtracts_mean(s.norm) && !from_y ? reinterpret_cast<float*>(mean.get()) : nullptr;
  if (from_y) {
    a.y = x.get() + c.x_offset * sh.xs;
    a.x = nullptr;
  }
  a.rstd = reinterpret_cast<float*>(rstd.get());
  a.mask = bitmask ? reinterpret_cast<uint8_t*>(mask.get()) : nullptr;
  a.dgamma = dg.get();
  a.dbeta = s.has_bias ? db.get() : nullptr;
  a.rows = c.rows;
  a.row_stride = sh.stride;
  a.rows_per_batch = c.rows_per_batch;
  if (s.residual) a.dh_out = dh.get() + c.x_offset * sh.rs;
  if (s.residual_f32) a.dresidual = dresidual.get() + c.x_offset * sh.rs;
  BackwardRun run;
  std::vector<char> dresidual_bytes(dresidual.bytes);
  for (int rep = 0; rep < reps; ++rep) {
    dx.poison();
    dresidual.poison();
    dg.poison();
    db.poison();
    launch(s, a);
    run.dx_bytes.resize(fwd.x.size());
    dx.download(run.dx_bytes.data(), run.dx_bytes.size());
    run.dgamma_bytes.resize(sh.groups * sh.n * sh.ws);
    dg.download(run.dgamma_bytes.data(), run.dgamma_bytes.size());
    run.dbeta_bytes.resize(run.dgamma_bytes.size());
    db.download(run.dbeta_bytes.data(), run.dbeta_bytes.size());
    if (s.residual_f32) dresidual.download(dresidual_bytes.data(), dresidual_bytes.size());
    if (all_dgamma) all_dgamma->push_back(run.dgamma_bytes);
    if (all_dx) all_dx->push_back(run.dx_bytes);
  }

  const auto ref_from_x =
      reference::backward(s, dy_host.data() + c.x_offset * sh.xs,
                          x_host.data() + c.x_offset * (s.residual ? sh.rs : sh.xs),
                          fwd.gamma.data(), s.has_bias ? fwd.beta.data() : nullptr, fwd.mean.data(), fwd.rstd.data(),
                          fwd.mask.data(), c.rows, sh.stride, c.rows_per_batch);
  // memory_efficient: held to the same tolerance against the same math from the y it read; its
  // distance from the backward of x (what y's rounding costs) is reported beside.
  auto ref = from_y ? reference::backward_from_y(s, dy_host.data() + c.x_offset * sh.xs,
                                                 fwd.y.data() + c.x_offset * sh.xs, fwd.gamma.data(),
                                                 s.has_bias ? fwd.beta.data() : nullptr, fwd.rstd.data(), c.rows,
                                                 sh.stride, c.rows_per_batch)
                    : ref_from_x;
  reference::Tolerance tx = reference::backward_tolerance(s.x_dtype), tw = reference::backward_tolerance(s.w_dtype);
  if (c.atol >= 0) tx = tw = {c.atol, c.rtol};
  if (s.residual)
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t i = 0; i < sh.n; ++i)
        ref.dx[r * sh.n + i] += reference::load(dh_host.data(), stream, c.x_offset + r * sh.stride + i);
  Worst wdx, wdg, wdb, wdx_from_x;
  for (int64_t r = 0; r < c.rows; ++r) {
    // Against the backward of x, x̂'s error from y's rounding reaches dx times rstd * |gamma' dy|
    // (dx cancels to near 0 where a row's x̂ is near +-1, e.g. N = 1): the row's atol scales so.
    double atol_from_x = tx.atol;
    if (from_y) {
      const int64_t g_row = (is_adaptive(s.norm) ? r / c.rows_per_batch : 0) * sh.n;
      double scale_dy = 0;
      for (int64_t i = 0; i < sh.n; ++i)
        scale_dy = std::max(scale_dy, std::abs((double(reference::load(fwd.gamma.data(), s.w_dtype, g_row + i)) +
                                                 (s.zero_centered ? 1 : 0)) *
                                                reference::load(dy_host.data(), s.x_dtype, c.x_offset + r * sh.stride + i)));
      atol_from_x *= std::max(1.0, double(fwd.rstd[r]) * scale_dy);
    }
    for (int64_t i = 0; i < sh.n; ++i) {
      const double got = reference::load(run.dx_bytes.data(), s.x_dtype, c.x_offset + r * sh.stride + i);
      wdx.add(got, ref.dx[r * sh.n + i], tx.atol, tx.rtol);
      if (from_y) {
        const double dh = s.residual ? reference::load(dh_host.data(), stream, c.x_offset + r * sh.stride + i) : 0;
        wdx_from_x.add(got, ref_from_x.dx[r * sh.n + i] + dh, atol_from_x, tx.rtol);
      }
    }
  }
  run.dx_from_x = wdx_from_x.value;
  if (s.residual_f32) {
    // dresidual: dh in fp32, at f32's tolerance; dx must be exactly its rounding to x's dtype.
    const reference::Tolerance tf = reference::backward_tolerance(DType::kF32);
    Worst wdr;
    std::vector<char> rounded(sh.xs);
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t i = 0; i < sh.n; ++i) {
        const int64_t e = c.x_offset + r * sh.stride + i;
        const float got = reference::load(dresidual_bytes.data(), DType::kF32, e);
        wdr.add(got, ref.dx[r * sh.n + i], tf.atol, tf.rtol);
        reference::store(rounded.data(), s.x_dtype, 0, got);
        if (std::memcmp(rounded.data(), run.dx_bytes.data() + e * sh.xs, sh.xs) != 0) ++run.dresidual_dx_mismatches;
      }
    const std::vector<char> poison(4, static_cast<char>(0xff));
    for (int64_t r = 0; r <= c.rows; ++r)
      for (int64_t i = (r == c.rows ? 0 : sh.n); i < sh.stride; ++i)
        if (std::memcmp(dresidual_bytes.data() + (c.x_offset + r * sh.stride + i) * 4, poison.data(), 4) != 0)
          wdr.value = INFINITY;
    run.dresidual = wdr.value;
  }
  // dgamma/dbeta are sums over rows: atol relative to the largest magnitude in the tensor.
  double gmax = 1, bmax = 1;
  for (double v : ref.dgamma) gmax = std::max(gmax, std::abs(v));
  for (double v : ref.dbeta) bmax = std::max(bmax, std::abs(v));
  for (int64_t i = 0; i < sh.groups * sh.n; ++i) {
    wdg.add(reference::load(run.dgamma_bytes.data(), s.w_dtype, i), ref.dgamma[i], tw.atol * gmax, tw.rtol);
    if (s.has_bias)
      wdb.add(reference::load(run.dbeta_bytes.data(), s.w_dtype, i), ref.dbeta[i], tw.atol * bmax, tw.rtol);
  }
  // Padding between rows keeps its poison.
  const std::vector<char> poison(16, static_cast<char>(0xff));
  for (int64_t r = 0; r <= c.rows; ++r)
    for (int64_t i = (r == c.rows ? 0 : sh.n); i < sh.stride; ++i)
      if (std::memcmp(run.dx_bytes.data() + (c.x_offset + r * sh.stride + i) * sh.xs, poison.data(), sh.xs) != 0)
        wdx.value = INFINITY;
  run.dx = wdx.value;
  run.dgamma = wdg.value;
  run.dbeta = wdb.value;
  // The forward inside must itself be right.
  run.forward = fwd.worst;
  if (!(fwd.worst <= 1.0)) run.dx = INFINITY;
  return run;
}

// A case's spec and layout, for a failure's context.
std::string describe(const Case& c) {
  return c.spec.str() + " rows=" + std::to_string(c.rows) + " row_stride=" + std::to_string(c.row_stride) +
         " x_offset=" + std::to_string(c.x_offset);
}

// One forward case against the reference (y, mean and rstd within tolerance, h bit for bit, the
// mask exact), described in any failure's context.
void check_forward_case(const Case& c) {
  const std::string where = describe(c);
  CAPTURE(where);
  const ForwardRun r = run_forward(c);
  CHECK(r.worst <= 1.0);
  CHECK(r.h_mismatches == 0);
  CHECK(r.mask_mismatches == 0);
}

// One backward case against the reference, described in any failure's context; a
// memory_efficient case also against the backward of x itself (only y's rounding apart).
BackwardRun check_backward_case(const Case& c) {
  const std::string where = describe(c);
  CAPTURE(where);
  const BackwardRun r = run_backward(c);
  CHECK(r.forward <= 1.0);
  CHECK(r.dx <= 1.0);
  CHECK(r.dgamma <= 1.0);
  CHECK(r.dbeta <= 1.0);
  if (c.spec.memory_efficient) CHECK(r.dx_from_x <= 8.0);
  return r;
}

}  // namespace gpu_test
