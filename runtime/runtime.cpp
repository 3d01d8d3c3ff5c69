#include "normjit/runtime.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "../templates/normjit/block_scale_layout.h"
#include "../templates/normjit/generic_flags.h"
#include "../templates/normjit/params.h"
#include "runtime/log.hpp"

namespace normjit {
namespace {

std::string hex_ptr(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%" PRIxPTR, reinterpret_cast<uintptr_t>(p));
  return buf;
}

bool aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

int access_bytes(int vec, DType d) { return std::min(16, vec * dtype_size(d)); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Every field of a spec in one word (n - 1 < 2^18; the row shape in 14 bits: sub-warp rows
// (threads_per_row <= 32, a power of two) by log2(threads_per_row) and rows_per_cta - 1 < 2^10,
// CTA-wide rows (rows_per_cta 1) by threads_per_row / 32 - 1 < 2^5; vec (at most 16 bytes of
// 2-byte or 4-byte elements: 8) by its log2; cluster - 1 (1-16 CTAs, any count); stages 2-8). A
// spec without a block config packs threads_per_row = 0, which no resolved spec has.
uint64_t packed_key(const Spec& s) {
  const BlockConfig b = s.block.value_or(BlockConfig{});
  const bool sub_warp = b.threads_per_row <= 32;
  const uint64_t row_shape =
      sub_warp ? uint64_t(1) << 13 | uint64_t(b.threads_per_row > 0 ? __builtin_ctz(unsigned(b.threads_per_row)) : 7) << 10 |
                     (static_cast<uint64_t>(b.rows_per_cta - 1) & 1023)
               : static_cast<uint64_t>(b.threads_per_row / 32 - 1) & 31;
  uint64_t k = static_cast<uint64_t>(s.n - 1);  // 18 bits
  k = k << 2 | static_cast<uint64_t>(s.norm);
  // Phase takes values 0-2; 3 is the memory_efficient backward.
  k = k << 2 | static_cast<uint64_t>(s.memory_efficient ? 3 : static_cast<int>(s.phase));
  k = k << 2 | static_cast<uint64_t>(s.x_dtype);
  k = k << 2 | static_cast<uint64_t>(s.w_dtype);
  k = k << 1 | static_cast<uint64_t>(s.has_bias);
  k = k << 1 | static_cast<uint64_t>(s.zero_centered);
  k = k << 1 | static_cast<uint64_t>(s.residual);
  k = k << 1 | static_cast<uint64_t>(s.residual_f32);
  k = k << 1 | static_cast<uint64_t>(s.bias_in);
  static_assert(static_cast<int>(Epilogue::kNvfp4) < 16, "the epilogue's 4 bits of the key are full");
  k = k << 4 | static_cast<uint64_t>(s.epilogue);
  k = k << 14 | row_shape;
  k = k << 2 | static_cast<uint64_t>(b.vec > 0 ? __builtin_ctz(static_cast<unsigned>(b.vec)) : 0);  // 1-8
  k = k << 2 | static_cast<uint64_t>(b.cache);
  k = k << 4 | static_cast<uint64_t>(std::max(1, b.cluster) - 1);  // 1-16
  k = k << 3 | static_cast<uint64_t>(b.stages - 2);                          // 2-8
  k = k << 1 | static_cast<uint64_t>(b.bulk_copy);
  k = k << 1 | static_cast<uint64_t>(b.producer_warp);
  return k;  // 18 + 2+2+2+2+1+1+1+1+1+4 + 14+2+2+4+3+1+1 = 62 bits
}

bool needs_pre_activation(Epilogue e) { return e == Epilogue::kGelu; }

// y_quant's alignment for vec-element packs: a byte an element, half a byte for e2m1 codes.
int y_quant_align(int vec, Epilogue e) { return packs_fp4(e) ? std::max(1, vec / 2) : vec; }

static_assert(static_cast<int>(BlockScaleLayout::kRowMajor) == kBlockScaleRowMajor &&
                  static_cast<int>(BlockScaleLayout::kSwizzled) == kBlockScaleSwizzled,
              "the host's and the kernels' layout numbers agree");

// Makes the runtime's primary context current on a thread with none; another current context is
// the caller's error (`who`: the launch, for the message).
void use_context(CUcontext context, const std::string& who) {
  CUcontext current = nullptr;
  NORMJIT_CU(cuCtxGetCurrent(&current));
  if (current == nullptr) {
    NORMJIT_CU(cuCtxSetCurrent(context));
  } else if (current != context) {
    throw Error(Status::kInvalidArgument, "launch of " + who +
                                              ": the calling thread's current CUDA context is not the primary "
                                              "context of the device this kernel was loaded on");
  }
}

// The generic backward's workspace per partial slot: dgamma's and dbeta's fp32 sums of one slot
// of every group ([2][groups][slots][n]).
size_t generic_slot_bytes(const Spec& spec, int64_t rows, int64_t rows_per_batch) {
  const int64_t groups = is_adaptive(spec.norm) && rows_per_batch > 0 ? rows / rows_per_batch : 1;
  return size_t(8) * std::max<int64_t>(groups, 1) * spec.n;
}

}  // namespace

// The kernel parameters of a launch (the backward's slots and chunks aside).
NormParams params_of(const Spec& spec, const LaunchArgs& a);

const char* to_string(BlockScaleLayout v) {
  switch (v) {
    case BlockScaleLayout::kRowMajor: return "row_major";
    case BlockScaleLayout::kSwizzled: return "swizzled";
  }
  return "?";
}

int max_vec_for(const Spec& spec, const LaunchArgs& a) {
  int vec = 16 / dtype_size(row_dtype(spec));
  auto ok = [&](int v) {
    const int xb = access_bytes(v, spec.x_dtype), wb = access_bytes(v, spec.w_dtype);
    const int rb = access_bytes(v, row_dtype(spec));  // the residual stream's packs
    // An fp32 stream's backward reads h (f32) as its x.
    const int x_in = spec.phase == Phase::kBackward ? rb : xb;
    return spec.n % v == 0 && a.row_stride % v == 0 && aligned(a.x, x_in) && aligned(a.y, xb) && aligned(a.dy, xb) &&
           aligned(a.dx, xb) && aligned(a.residual, rb) && aligned(a.h, rb) && aligned(a.dh_out, rb) &&
           aligned(a.dresidual, rb) && aligned(a.bias_in, wb) && aligned(a.gamma, wb) && aligned(a.beta, wb) &&
           aligned(a.y_quant, y_quant_align(v, spec.epilogue));
  };
  while (vec > 1 && !ok(vec)) vec /= 2;
  return vec;
}

void validate_launch(const Spec& s, const LaunchArgs& a) {
  if (!s.block) throw Error(Status::kInvalidArgument, "validate_launch(" + s.str() + "): spec has no block config; resolve() it");
  // Strings are built only on failure: this runs on every launch.
  auto fail = [&](const std::string& what) {
    throw Error(Status::kInvalidArgument, "launch of " + s.str() + ": " + what);
  };
  const bool backward = s.phase == Phase::kBackward;
  const bool training = s.phase == Phase::kForwardTraining;
  const bool has_mean = subtracts_mean(s.norm);
  const bool ada = is_adaptive(s.norm);
  const bool bitmask = s.epilogue == Epilogue::kReluBitmask;
  const bool quant = quantizes(s.epilogue);
  const bool per_tensor = scales_per_tensor(s.epilogue), per_row = scales_per_row(s.epilogue),
             per_block = scales_per_block(s.epilogue);
  const char* phase = to_string(s.phase);
  // (field, pointer, whether this spec uses it, why)
  struct Field {
    const char* name;
    const void* ptr;
    bool used;
    const char* role;
    bool optional = false;  // may be given or not (y beside a quantized output)
  };
  const bool from_y = s.memory_efficient;  // a backward reading y in place of x (and no mean)
  const Field fields[] = {
      {"x", a.x, !from_y, from_y ? "a memory_efficient backward reads y instead" : "the input"},
      {"gamma", a.gamma, true, "the scale"},
      {"beta", a.beta, backward ? s.has_bias && (needs_pre_activation(s.epilogue) || from_y) : s.has_bias,
       backward ? "read by the backward only with a bias and a gelu epilogue or memory_efficient"
                : "the bias (spec .bias)"},
      {"y", a.y, (!backward && !quant) || from_y,
       from_y ? "the forward's output, from which a memory_efficient backward recovers x̂" : "the forward output",
       quant},
      {"mean", a.mean, has_mean && (training || (backward && !from_y)),
       from_y ? "a memory_efficient backward needs no mean" : "LayerNorm training output / backward input"},
      {"rstd", a.rstd, training || backward, "training output / backward input"},
      {"dy", a.dy, backward, "the backward input"},
      {"dx", a.dx, backward, "the backward output"},
      {"dgamma", a.dgamma, backward, "the backward output"},
      {"dbeta", a.dbeta, backward && s.has_bias, "the backward bias gradient (spec .bias)"},
      {"workspace", a.workspace, backward, "backward scratch (Kernel::workspace_bytes)"},
      {"mask", a.mask, bitmask, "the relu_bitmask mask"},
      {"residual", a.residual, s.residual && !backward, "the forward's residual input (spec .residual)"},
      {"h", a.h, s.residual && !backward, "the forward's x + residual output (spec .residual)"},
      {"dh_out", a.dh_out, s.residual && backward, "the gradient arriving on h (spec .residual)"},
      {"dresidual", a.dresidual, s.residual_f32 && backward,
       "the fp32 gradient of the residual stream beside dx (spec .residual_f32)"},
      {"bias_in", a.bias_in, s.bias_in, "the bias added with the residual (spec .bias_in)"},
      {"y_quant", a.y_quant, quant, "the quantized output (spec .fp8_*, .int8_row, .mxfp8_*, .mxfp4, .nvfp4)"},
      {"quant_scale", a.quant_scale, reads_quant_scale(s.epilogue),
       "the per-tensor scale of the quantized output (spec .fp8_e4m3, .fp8_e5m2; .nvfp4's S_enc)"},
      {"row_scales", a.row_scales, per_row, "the per-row scales written beside the codes (spec .*_row)"},
      {"block_scales", a.block_scales, per_block,
       "the block scales written beside the codes (spec .mxfp8_*, .mxfp4: E8M0; .nvfp4: e4m3)"},
  };
  for (const Field& f : fields) {
    if (f.used && !f.ptr) fail(std::string(f.name) + " is null; " + phase + " needs it (" + f.role + ")");
    if (!f.used && f.ptr && !f.optional)
      fail(std::string(f.name) + "=" + hex_ptr(f.ptr) + " is given but " + phase + " " + to_string(s.norm) +
           (s.epilogue == Epilogue::kNone ? "" : std::string(" with ") + to_string(s.epilogue)) +
           " does not use it (" + f.role + ")");
  }
  if (!per_tensor && a.amax)
    fail("amax=" + hex_ptr(a.amax) + " is given but only the per-tensor FP8 epilogues (spec .fp8_e4m3, .fp8_e5m2) "
         "write it");
  if (a.block_scale_layout != BlockScaleLayout::kRowMajor) {
    if (a.block_scale_layout != BlockScaleLayout::kSwizzled)
      fail("block_scale_layout=" + std::to_string(static_cast<int>(a.block_scale_layout)) +
           " is not row_major (0) or swizzled (1)");
    if (!per_block)
      fail(std::string("block_scale_layout=") + to_string(a.block_scale_layout) +
           " is given but only the block-scaled epilogues (spec .mxfp8_*, .mxfp4, .nvfp4) write block scales");
  }
  if (packs_fp4(s.epilogue) && a.row_stride % 2 != 0)
    fail("row_stride=" + std::to_string(a.row_stride) + " must be even for " + to_string(s.epilogue) +
         ": y_quant's rows lie row_stride / 2 bytes apart");
  if (a.rows < 0) fail("rows=" + std::to_string(a.rows) + " is negative");
  const int64_t max_rows = int64_t(0x7fffffff) * s.block->rows_per_cta;
  if (a.rows > max_rows) fail("rows=" + std::to_string(a.rows) + " exceeds " + std::to_string(max_rows));
  if (a.row_stride < s.n) fail("row_stride=" + std::to_string(a.row_stride) + " is less than n=" + std::to_string(s.n));
  if (!backward && (!std::isfinite(a.eps) || a.eps <= 0.f))
    fail("eps=" + std::to_string(a.eps) + " must be finite and > 0");
  if (ada) {
    if (a.rows_per_batch < 1) fail("rows_per_batch=" + std::to_string(a.rows_per_batch) + " must be >= 1 for " + to_string(s.norm));
    if (a.rows % a.rows_per_batch != 0)
      fail("rows=" + std::to_string(a.rows) + " is not a multiple of rows_per_batch=" + std::to_string(a.rows_per_batch));
    if (a.rows > 0xffffffffLL)  // the kernels find a row's batch with a 32-bit division
      fail("rows=" + std::to_string(a.rows) + " exceeds 4294967295, the most " + to_string(s.norm) + " takes in one launch");
    if (a.rows / a.rows_per_batch > 65535)
      fail("rows / rows_per_batch = " + std::to_string(a.rows / a.rows_per_batch) + " batches exceeds 65535");
  } else if (a.rows_per_batch != 0) {
    fail("rows_per_batch=" + std::to_string(a.rows_per_batch) + " is given but only adalayernorm and adarmsnorm use it");
  }
  if (bitmask && !(a.clip_lower < a.clip_upper))
    fail("clip_lower=" + std::to_string(a.clip_lower) + " must be below clip_upper=" + std::to_string(a.clip_upper));
  const int vec = s.block->vec;
  if (a.row_stride % vec != 0)
    fail("row_stride=" + std::to_string(a.row_stride) + " is not a multiple of vec=" + std::to_string(vec) +
         " (use Runtime::launch to pick a narrower vector, or a spec with a smaller vec)");
  const int xb = access_bytes(vec, s.x_dtype), wb = access_bytes(vec, s.w_dtype);
  const int rb = access_bytes(vec, row_dtype(s));  // the residual stream: x's dtype, or f32
  auto check_align = [&](const char* field, const void* p, int bytes, const char* why) {
    if (p && !aligned(p, bytes))
      fail(std::string(field) + "=" + hex_ptr(p) + " is not aligned to " + std::to_string(bytes) + " bytes (" + why + ")");
  };
  const std::string vec_why = "vec=" + std::to_string(vec);
  check_align("x", a.x, backward ? rb : xb, vec_why.c_str());  // backward: h, in the stream's dtype
  check_align("y", a.y, xb, vec_why.c_str());
  check_align("dy", a.dy, xb, vec_why.c_str());
  check_align("dx", a.dx, xb, vec_why.c_str());
  check_align("residual", a.residual, rb, vec_why.c_str());
  check_align("h", a.h, rb, vec_why.c_str());
  check_align("dh_out", a.dh_out, rb, vec_why.c_str());
  check_align("dresidual", a.dresidual, rb, vec_why.c_str());
  check_align("bias_in", a.bias_in, wb, vec_why.c_str());
  check_align("gamma", a.gamma, wb, vec_why.c_str());
  check_align("beta", a.beta, wb, vec_why.c_str());
  check_align("dgamma", a.dgamma, dtype_size(s.w_dtype), "its dtype");
  check_align("dbeta", a.dbeta, dtype_size(s.w_dtype), "its dtype");
  check_align("mean", a.mean, 4, "f32");
  check_align("rstd", a.rstd, 4, "f32");
  check_align("workspace", a.workspace, 16, "vector stores");
  check_align("y_quant", a.y_quant, y_quant_align(vec, s.epilogue), vec_why.c_str());
  check_align("quant_scale", a.quant_scale, 4, "f32");
  check_align("amax", a.amax, 4, "f32");
  check_align("row_scales", a.row_scales, 4, "f32");
}

void Kernel::check_workspace(const LaunchArgs& a, const BackwardPlan& plan) const {
  if (a.workspace_bytes < plan.workspace_bytes)
    throw Error(Status::kInvalidArgument, "launch of " + spec_string_ + ": workspace_bytes=" +
                                              std::to_string(a.workspace_bytes) + " is less than the " +
                                              std::to_string(plan.workspace_bytes) + " bytes workspace_bytes(rows=" +
                                              std::to_string(a.rows) + ") needs");
}

void Kernel::validate(const LaunchArgs& a) const {
  validate_launch(spec_, a);
  if (spec_.phase == Phase::kBackward) check_workspace(a, plan(a.rows, a.rows_per_batch));
}

Kernel::BackwardPlan Kernel::plan(int64_t rows, int64_t rows_per_batch) const {
  BackwardPlan p;
  if (spec_.phase != Phase::kBackward) return p;
  const bool ada = is_adaptive(spec_.norm);
  p.groups = ada && rows_per_batch > 0 ? rows / rows_per_batch : 1;
  p.rows_per_group = ada && rows_per_batch > 0 ? rows_per_batch : rows;
  if (p.groups == 0 || p.rows_per_group == 0) return p;
  const BlockConfig& b = *spec_.block;
  if (b.cache != RowCache::kGlobal) {
    // A persistent grid: as many CTAs (clusters) as fit on the GPU at once, shared among the
    // groups; one partial slot each.
    const int64_t row_blocks = ceil_div(p.rows_per_group, b.rows_per_cta);
    int64_t slots = resident_ctas_ / p.groups;
    const int64_t sums = spec_.has_bias ? 2 : 1;
    if (b.rows_per_cta > 1) {
      // Small CTAs of several rows each: with few rows per CTA the partial rows (N fp32 sums each,
      // written and read back) weigh on short launches; keep them within 1/16 of the rows' own
      // bytes (x, dy, dx), on at least one CTA per SM.
      const int64_t cap = p.rows_per_group * 3 * dtype_size(spec_.x_dtype) / (64 * sums);
      slots = std::min(slots, std::max<int64_t>(sm_count_, cap));
    } else {
      // A row a CTA: with few rows, a slot for each resident CTA writes partial rows of up to 0.7
      // of the rows' own bytes (LN 1024 x 2560: 528 slots); keep them within a third, on at least
      // two CTAs per SM (H200 graph replay: LN 1024 x 2560 14.7 -> 12.7 us, RMS 1024 x 2048 11.5
      // -> 9.6; two a SM at 4096 rows ran 13-30 % slower, so the cap follows the rows).
      const int64_t cap = p.rows_per_group * dtype_size(spec_.x_dtype) / (4 * sums);
      slots = std::min(slots, std::max<int64_t>(2 * int64_t(sm_count_), cap));
    }
    p.slots = std::clamp<int64_t>(slots, 1, row_blocks);
  } else {
    // Column tiles of 256 packs; enough row chunks to put ~8 CTAs of 256 threads on each SM.
    p.col_tiles = ceil_div(spec_.n / b.vec, 256);
    const int64_t chunks = std::clamp<int64_t>(ceil_div(int64_t(sm_count_) * 8, p.col_tiles * p.groups), 1,
                                               std::min<int64_t>(p.rows_per_group, 65535));
    p.row_chunk = ceil_div(p.rows_per_group, chunks);
    p.slots = ceil_div(p.rows_per_group, p.row_chunk);
  }
  const size_t partial_floats = size_t(2) * p.groups * p.slots * spec_.n;
  const size_t row_sum_floats = b.cache == RowCache::kGlobal ? size_t(2) * rows : 0;
  p.workspace_bytes = 4 * (partial_floats + row_sum_floats);
  return p;
}

size_t Kernel::workspace_bytes(int64_t rows, int64_t rows_per_batch) const {
  return plan(rows, rows_per_batch).workspace_bytes;
}

NormParams Kernel::params_for(const LaunchArgs& a) const { return params_of(spec_, a); }

NormParams params_of(const Spec& spec_, const LaunchArgs& a) {
  NormParams p{};
  // A memory_efficient backward's kernels read y where the others read x.
  p.x = spec_.memory_efficient ? a.y : a.x;
  p.gamma = a.gamma;
  p.beta = a.beta;
  p.y = spec_.memory_efficient ? nullptr : a.y;
  p.mean = a.mean;
  p.rstd = a.rstd;
  p.dy = a.dy;
  p.dx = a.dx;
  p.mask = a.mask;
  p.workspace = static_cast<float*>(a.workspace);
  p.dgamma = a.dgamma;
  p.dbeta = a.dbeta;
  p.rows = a.rows;
  p.row_stride = a.row_stride;
  p.rows_per_group = is_adaptive(spec_.norm) ? a.rows_per_batch : a.rows;
  p.mask_stride = mask_row_bytes(spec_.n);
  p.eps = a.eps;
  p.clip_lower = a.clip_lower;
  p.clip_upper = a.clip_upper;
  p.residual = a.residual;
  p.h = a.h;
  p.dh_out = a.dh_out;
  p.dresidual = a.dresidual;
  p.bias_in = a.bias_in;
  p.y_quant = static_cast<unsigned char*>(a.y_quant);
  p.quant_scale = a.quant_scale;
  p.amax = a.amax;
  p.row_scales = a.row_scales;
  p.block_scales = a.block_scales;
  p.block_scale_stride = block_scale_row_bytes(spec_.n, spec_.epilogue);
  p.block_scale_layout = static_cast<int>(a.block_scale_layout);
  return p;
}

unsigned Kernel::forward_grid(int64_t rows) const {
  int64_t row_blocks = ceil_div(rows, rows_per_cta_);
  // Pipelined rows: a persistent grid, each CTA (cluster) walking its rows.
  if (spec_.block->cache == RowCache::kSharedPipelined) row_blocks = std::min<int64_t>(row_blocks, resident_ctas_);
  return static_cast<unsigned>(row_blocks * spec_.block->cluster);
}

Kernel::RawLaunch Kernel::raw_forward_launch(const LaunchArgs& a) const {
  if (spec_.phase == Phase::kBackward)
    throw Error(Status::kInvalidArgument, "raw_forward_launch(" + spec_string_ + "): a backward launches several kernels");
  validate_launch(spec_, a);
  const NormParams p = params_for(a);
  RawLaunch r;
  r.function = function_;
  r.grid_x = forward_grid(a.rows);
  r.threads = static_cast<unsigned>(threads_per_cta_);
  r.dynamic_smem_bytes = dynamic_smem_bytes_;
  r.params.resize(sizeof(p));
  std::memcpy(r.params.data(), &p, sizeof(p));
  return r;
}

void Kernel::launch(const LaunchArgs& a, CUstream stream) const {
  validate_launch(spec_, a);
  const bool backward = spec_.phase == Phase::kBackward;
  // Planned once: the workspace check and the grid both use it.
  const BackwardPlan bwd_plan = backward ? plan(a.rows, a.rows_per_batch) : BackwardPlan{};
  if (backward) check_workspace(a, bwd_plan);
  use_context(context_, spec_string_);
  if (a.rows == 0 && !backward) return;
  NormParams p = params_for(a);
  void* params[] = {&p};
  auto run = [&](CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned threads, const char* what) {
    if (gx == 0 || gy == 0 || gz == 0) return;
    const unsigned smem = f == function_ ? dynamic_smem_bytes_ : 0;
    if (f == function_ ? !first_dependent_ : !dependent_launch_) {
      NORMJIT_CU_CTX(cuLaunchKernel(f, gx, gy, gz, threads, 1, 1, smem, stream, params, nullptr),
                     std::string("launching ") + what + " of " + spec_string_);
      return;
    }
    // The backward's second and third kernels, and the first (forward or backward) where
    // first_dependent_: they may start
    // once every CTA of the kernel before has begun (griddepcontrol.launch_dependents; a kernel
    // that never says so, at its end) and wait for its results themselves (griddepcontrol.wait),
    // so the launch latency hides behind that kernel's tail.
    CUlaunchAttribute dependent{};
    dependent.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    dependent.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig config{};
    config.gridDimX = gx;
    config.gridDimY = gy;
    config.gridDimZ = gz;
    config.blockDimX = static_cast<unsigned>(threads);
    config.blockDimY = config.blockDimZ = 1;
    config.sharedMemBytes = smem;
    config.hStream = stream;
    config.attrs = &dependent;
    config.numAttrs = 1;
    NORMJIT_CU_CTX(cuLaunchKernelEx(&config, f, params, nullptr),
                   std::string("launching ") + what + " of " + spec_string_ + " (programmatic dependent launch)");
  };
  if (!backward) {
    run(function_, forward_grid(a.rows), 1, 1, threads_per_cta_, "the kernel");
    return;
  }
  p.partial_slots = static_cast<int>(bwd_plan.slots);
  p.row_chunk = static_cast<int>(bwd_plan.row_chunk);
  const unsigned groups = static_cast<unsigned>(bwd_plan.groups);
  if (a.rows > 0) {
    if (spec_.block->cache != RowCache::kGlobal) {
      run(function_, static_cast<unsigned>(bwd_plan.slots * spec_.block->cluster), groups, 1, threads_per_cta_,
          "the fused backward");
    } else {
      run(function_, static_cast<unsigned>(a.rows), 1, 1, threads_per_cta_, "the row sums");
      run(tiles_, static_cast<unsigned>(bwd_plan.col_tiles), static_cast<unsigned>(bwd_plan.slots), groups, 256,
          "the column tiles");
    }
  }
  // With no rows the reduction still runs over zero slots, so dgamma and dbeta come out zero.
  run(reduce_, static_cast<unsigned>(ceil_div(spec_.n, 32)), groups, 1, 1024, "the dgamma/dbeta reduction");
}

Runtime::Runtime(int device, std::filesystem::path cache_dir) : disk_cache_(std::move(cache_dir)) {
  driver();
  int count = 0;
  NORMJIT_CU(cuDeviceGetCount(&count));
  if (device < 0 || device >= count)
    throw Error(Status::kInvalidArgument,
                "device=" + std::to_string(device) + " is out of range: " + std::to_string(count) + " GPU(s) visible");
  NORMJIT_CU(cuDeviceGet(&cu_device_, device));
  char name[256] = {};
  NORMJIT_CU(cuDeviceGetName(name, sizeof(name), cu_device_));
  device_.ordinal = device;
  device_.name = name;
  NORMJIT_CU(cuDeviceGetAttribute(&device_.sm_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, cu_device_));
  NORMJIT_CU(cuDeviceGetAttribute(&device_.sm_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, cu_device_));
  NORMJIT_CU(cuDeviceGetAttribute(&device_.sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, cu_device_));
  NORMJIT_CU(cuDeviceGetAttribute(&device_.l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, cu_device_));
  NORMJIT_CU(cuDriverGetVersion(&device_.driver_version));
  int memory_khz = 0, bus_bits = 0;
  NORMJIT_CU(cuDeviceGetAttribute(&memory_khz, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, cu_device_));
  NORMJIT_CU(cuDeviceGetAttribute(&bus_bits, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, cu_device_));
  device_.dram_gb_per_s = 2.0 * memory_khz * 1e3 * (bus_bits / 8) / 1e9;  // two transfers per clock
  if (device_.sm_major < 8)
    throw Error(Status::kNotSupported, "device " + std::to_string(device) + " (" + device_.name + ") is sm_" +
                                           std::to_string(device_.sm_major * 10 + device_.sm_minor) +
                                           "; normjit needs sm_80 or newer");
  target_ = Target{device_.sm_major * 10 + device_.sm_minor};
  // The tuning database: NORMJIT_TUNING_DB, else tuning.json in the cache directory.
  // A cache directory that is not trusted holds no tuning database either: it is neither read nor
  // written (tuning_db_path_ stays empty).
  const char* db_env = std::getenv("NORMJIT_TUNING_DB");
  if (db_env && *db_env) tuning_db_path_ = db_env;
  else if (disk_cache_.usable()) tuning_db_path_ = disk_cache_.dir() / "tuning.json";
  std::error_code ec;
  const bool db_exists = !tuning_db_path_.empty() && std::filesystem::exists(tuning_db_path_, ec);
  tuning_mode_ = tuning_mode_from_env(db_exists);
  compile_mode_ = compile_mode_from_env();
  if (tuning_mode_ != TuningMode::kHeuristic && db_exists) {
    tuning_db_ = TuningDb::load(tuning_db_path_.string());
    detail::log().info("tuning database {}: {} entries", tuning_db_path_.string(), tuning_db_.size());
  }
  NORMJIT_CU(cuDevicePrimaryCtxRetain(&context_, cu_device_));
  NORMJIT_CU(cuCtxSetCurrent(context_));
  detail::log().info("runtime on device {} ({}, {}, {} SMs, {:.0f} GB/s peak DRAM), cache {}", device, device_.name,
                     target_.str(), device_.sm_count, device_.dram_gb_per_s, disk_cache_.dir().string());
  if (compile_mode_ != CompileMode::kSync) preload_generic_kernels();
}

void Runtime::set_compile_mode(CompileMode mode) {
  compile_mode_ = mode;
  if (mode != CompileMode::kSync) preload_generic_kernels();
}

void Runtime::preload_generic_kernels() {
  // Loading a module of generic kernels (1.8-2.7 MB of cubin) took most of async mode's first
  // launch (1.0-1.7 ms, H200): done here, that launch only launches. A failure is left to the
  // launch that needs the module, which reports it.
  std::lock_guard<std::mutex> lock(mutex_);
  for (GenericProgram program : generic_programs()) {
    if (target_.arch < generic_program_min_arch(program)) continue;
    for (DType x : generic_program_dtypes()) {
      try {
        (void)generic_module(x, program);
      } catch (const Error& e) {
        detail::log().debug("generic kernels of x {} ({} program) not preloaded: {}", to_string(x), to_string(program),
                            e.what());
      }
    }
  }
}

Runtime& shared_runtime(int device) {
  static std::mutex mutex;
  static std::map<int, Runtime*> runtimes;
  std::lock_guard<std::mutex> lock(mutex);
  Runtime*& rt = runtimes[device];
  // Never destroyed: unloading modules at exit would race the driver's own teardown.
  if (!rt) rt = new Runtime(device);
  return *rt;
}

Runtime::~Runtime() {
  // Never throw from a destructor; the driver may already be shutting down at exit.
  background_.reset();  // waits for the compiles in flight; they use disk_cache_
  const DriverApi& cu = driver();
  for (CUmodule module : modules_) cu.cuModuleUnload(module);
  for (const auto& [program, module] : generic_modules_) cu.cuModuleUnload(module);
  if (context_) cu.cuDevicePrimaryCtxRelease(cu_device_);
}

TuningKey Runtime::tuning_key(const Spec& spec) const {
  Spec bare = spec;
  bare.block.reset();
  return TuningKey{device_.name, target_.arch, device_.sm_count, device_.driver_version, nvrtc_version(), version(),
                   bare.str()};
}

Spec Runtime::choose(const Spec& spec, int max_vec) const {
  if (spec.block) return spec;
  if (tuning_mode_ != TuningMode::kHeuristic) {
    std::lock_guard<std::mutex> lock(tuning_mutex_);
    // A winner measured with wider vectors than these pointers allow falls back to the heuristic.
    if (auto e = tuning_db_.lookup(tuning_key(spec)); e && e->config.vec <= max_vec) {
      Spec tuned = spec;
      tuned.block = e->config;
      validate(tuned);
      return tuned;
    }
  }
  return resolve(spec, max_vec, target_.arch, max_cluster_);
}

Spec Runtime::tuned_choice(const Spec& spec) {
  // Remembered per spec: the database lookup builds strings, too slow for every in-process hit.
  if (spec.n < 1) validate(spec);  // packed_key needs n >= 1
  const uint64_t unresolved = packed_key(spec);
  {
    std::lock_guard<std::mutex> lock(tuning_mutex_);
    if (auto it = chosen_.find(unresolved); it != chosen_.end()) return it->second;
  }
  bool known = true;
  if (tuning_mode_ == TuningMode::kTuneOnMiss) {
    std::lock_guard<std::mutex> lock(tuning_mutex_);
    known = tuning_db_.lookup(tuning_key(spec)).has_value();
  }
  const Spec chosen = known ? choose(spec, 16) : tune_on_miss(spec);
  std::lock_guard<std::mutex> lock(tuning_mutex_);
  chosen_[unresolved] = chosen;
  return chosen;
}

const Kernel& Runtime::get(const Spec& spec) {
  const Spec resolved = spec.block || tuning_mode_ == TuningMode::kHeuristic ? choose(spec, 16) : tuned_choice(spec);
  return get_or_fall_back(spec, resolved, 16);
}

const Kernel& Runtime::get_or_fall_back(const Spec& spec, const Spec& resolved, int max_vec) {
  try {
    return get_resolved(resolved);
  } catch (const Error& e) {
    // A heuristic pick of a non-portable cluster that this GPU cannot co-schedule: from now on the
    // heuristic keeps to portable clusters (where it took 16 CTAs, the split route).
    if (spec.block || resolved.block->cluster <= kMaxPortableCluster || e.status() != Status::kNotSupported) throw;
    max_cluster_ = kMaxPortableCluster;
    {
      std::lock_guard<std::mutex> lock(tuning_mutex_);
      chosen_.clear();  // may hold the heuristic's 16-CTA picks
    }
    detail::log().warn("{}; the heuristic keeps to clusters of at most {} CTAs on this device", e.what(),
                       kMaxPortableCluster);
    return get_resolved(choose(spec, max_vec));
  }
}

const Kernel& Runtime::get_resolved(const Spec& resolved, const DiskCache::Lookup* found) {
  // Clusters and bulk copies are sm_90 features.
  if (target_.arch < 90 && (resolved.block->cluster > 1 || resolved.block->bulk_copy))
    throw Error(Status::kNotSupported,
                "spec '" + resolved.str() + "' uses " +
                    (resolved.block->cluster > 1
                         ? "a cluster of " + std::to_string(resolved.block->cluster) + " CTAs"
                         : std::string("bulk copies (tma)")) +
                    "; " + target_.str() + " has neither thread-block clusters nor cp.async.bulk (sm_90 or newer)");
  const uint64_t key = packed_key(resolved);
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = kernels_.find(key); it != kernels_.end()) {
    ++counters_.memory_hits;
    return *it->second;
  }
  const std::string name = resolved.str();
  if (found) {  // looked up (compiled, or read) by the caller, e.g. in a batch: counted as get() would
    ++(found->source == DiskCache::Lookup::Source::kCompiled ? counters_.compiles : counters_.disk_hits);
    return load_resolved(resolved, found->binary, name);
  }
  const CacheCounters before = disk_cache_.counters();
  const auto t0 = std::chrono::steady_clock::now();
  const Binary binary = disk_cache_.get_or_compile(resolved, target_);
  const CacheCounters after = disk_cache_.counters();
  if (after.compiles > before.compiles)
    ++counters_.compiles;
  else
    ++counters_.disk_hits;
  counters_.image_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return load_resolved(resolved, binary, name);
}

const Kernel& Runtime::load_resolved(const Spec& resolved, const Binary& binary, const std::string& name) {
  const uint64_t key = packed_key(resolved);
  const auto t1 = std::chrono::steady_clock::now();
  NORMJIT_CU(cuCtxSetCurrent(context_));
  CUmodule module = nullptr;
  NORMJIT_CU_CTX(cuModuleLoadData(&module, binary.image.data()), "loading " + name + " (" + binary.arch + ")");
  modules_.push_back(module);
  auto kernel = std::make_unique<Kernel>();
  auto function = [&](const std::string& suffix) {
    CUfunction f = nullptr;
    NORMJIT_CU_CTX(cuModuleGetFunction(&f, module, (binary.kernel_name + suffix).c_str()), "loading " + name);
    return f;
  };
  if (resolved.phase == Phase::kBackward) {
    const bool fused = resolved.block->cache != RowCache::kGlobal;
    kernel->function_ = function(fused ? "_fused" : "_rowsums");
    if (!fused) kernel->tiles_ = function("_tiles");
    kernel->reduce_ = function("_reduce");
  } else {
    kernel->function_ = function("");
  }
  counters_.module_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  // From the cubin: asking the driver would load a lazily loaded module's functions now.
  const auto frames = binary.is_ptx ? std::nullopt : cubin_frame_bytes(binary.image);
  if (frames) {
    // This spec's kernels only: a batched compile's image holds other specs' kernels too.
    for (const auto& [function_name, bytes] : *frames)
      if (function_name.rfind(binary.kernel_name, 0) == 0)
        kernel->local_memory_bytes_ = std::max(kernel->local_memory_bytes_, bytes);
  } else {
    for (CUfunction f : {kernel->function_, kernel->tiles_, kernel->reduce_}) {
      if (!f) continue;
      int local = 0;
      NORMJIT_CU_CTX(cuFuncGetAttribute(&local, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f),
                     "reading the local memory of " + name);
      kernel->local_memory_bytes_ = std::max(kernel->local_memory_bytes_, local);
    }
  }
  kernel->context_ = context_;
  kernel->spec_ = resolved;
  kernel->spec_string_ = name;
  kernel->threads_per_cta_ = binary.threads_per_cta;
  kernel->rows_per_cta_ = binary.rows_per_cta;
  kernel->sm_count_ = device_.sm_count;
  // Clusters keep the plain launch for the first kernel: the unclustered first kernels (forward
  // and backward) wait (griddepcontrol.wait) before any global access.
  kernel->dependent_launch_ = target_.arch >= 90;
  kernel->first_dependent_ = kernel->dependent_launch_ && resolved.block->cluster == 1;
  // Shared-memory rows, and memory_efficient rows in registers with an xhat table.
  if (const int64_t bytes = in_shared_memory(resolved.block->cache) ? shared_row_bytes(resolved, *resolved.block)
                                                                      : xhat_table_bytes(resolved, *resolved.block);
      bytes > 0) {
    int optin = 0;
    NORMJIT_CU(cuDeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, cu_device_));
    // The kernel's static shared memory (reduction scratch) shares the same limit.
    int static_bytes = 0;
    NORMJIT_CU(cuFuncGetAttribute(&static_bytes, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, kernel->function_));
    if (bytes + static_bytes > optin)
      throw Error(Status::kNotSupported, "spec '" + name + "' keeps its row in " + std::to_string(bytes) +
                                             " bytes of shared memory (+" + std::to_string(static_bytes) +
                                             " static); device " + device_.name + " allows " +
                                             std::to_string(optin) + " per CTA: use gmem");
    NORMJIT_CU_CTX(cuFuncSetAttribute(kernel->function_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                      static_cast<int>(bytes)),
                   "allowing " + std::to_string(bytes) + " bytes of dynamic shared memory for " + name);
    kernel->dynamic_smem_bytes_ = static_cast<unsigned>(bytes);
  }
  if (const int cluster = resolved.block->cluster; cluster > 1) {
    if (cluster > kMaxPortableCluster)
      NORMJIT_CU_CTX(cuFuncSetAttribute(kernel->function_, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
                     "allowing a non-portable cluster of " + std::to_string(cluster) + " CTAs for " + name);
    // Clusters must fit inside one GPC, so SMs / cluster overestimates; ask the driver.
    CUlaunchConfig config{};
    config.gridDimX = static_cast<unsigned>(cluster);
    config.gridDimY = config.gridDimZ = 1;
    config.blockDimX = static_cast<unsigned>(binary.threads_per_cta);
    config.blockDimY = config.blockDimZ = 1;
    config.sharedMemBytes = kernel->dynamic_smem_bytes_;  // shared-memory rows limit clusters per GPC
    int clusters = 0;
    NORMJIT_CU_CTX(cuOccupancyMaxActiveClusters(&clusters, kernel->function_, &config), "sizing the grid of " + name);
    if (clusters < 1)
      throw Error(Status::kNotSupported, "spec '" + name + "': device " + device_.name +
                                             " cannot co-schedule a cluster of " + std::to_string(cluster) +
                                             " CTAs of " + std::to_string(binary.threads_per_cta) + " threads and " +
                                             std::to_string(kernel->dynamic_smem_bytes_) +
                                             " bytes of dynamic shared memory; use a smaller cluster");
    kernel->resident_ctas_ = clusters;
  } else {
    int per_sm = 0;
    NORMJIT_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel->function_, binary.threads_per_cta,
                                                           kernel->dynamic_smem_bytes_));
    kernel->resident_ctas_ = std::max(1, per_sm) * device_.sm_count;
  }
  return *(kernels_[key] = std::move(kernel));
}

void Runtime::launch(const Spec& spec, const LaunchArgs& args, CUstream stream) {
  const CompileMode mode = compile_mode_.load();
  if (mode == CompileMode::kGeneric) return launch_generic(spec, args, stream);
  const int max_vec = max_vec_for(spec, args);
  if (mode == CompileMode::kSync || !generic_refusal(spec).empty()) {
    if (tuning_mode_ == TuningMode::kTuneOnMiss && !spec.block) (void)tuned_choice(spec);  // tunes on a miss
    get_or_fall_back(spec, spec.block ? spec : choose(spec, max_vec), max_vec).launch(args, stream);
    return;
  }
  const Kernel* kernel = async_kernel(spec, max_vec);
  if (kernel && kernel->spec().phase == Phase::kBackward &&
      args.workspace_bytes < kernel->workspace_bytes(args.rows, args.rows_per_batch)) {
    detail::log().debug("{}: workspace_bytes={} is less than the specialized kernel needs; the generic kernel runs",
                        kernel->name(), args.workspace_bytes);
    kernel = nullptr;
  }
  if (kernel) return kernel->launch(args, stream);
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  if (driver().cuStreamIsCapturing(stream, &capture) == CUDA_SUCCESS && capture == CU_STREAM_CAPTURE_STATUS_ACTIVE)
    detail::log().debug("{}: captured into a CUDA graph as its generic kernel (the specialized one is not ready)",
                        spec.str());
  launch_generic(spec, args, stream);
}

const Kernel* Runtime::async_kernel(const Spec& spec, int max_vec) {
  // Never tunes or compiles here: the tuning database's winner or the heuristic's pick.
  const Spec resolved = spec.block ? spec : choose(spec, max_vec);
  const uint64_t key = packed_key(resolved);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = kernels_.find(key); it != kernels_.end()) {
      ++counters_.memory_hits;
      return it->second.get();
    }
  }
  BackgroundCompiler& bg = background();
  switch (bg.state(key)) {
    case BackgroundCompiler::State::kReady: {
      std::optional<Binary> binary = bg.take(key);
      if (!binary) return &get_resolved(resolved);  // taken by another thread: loaded, or on disk
      std::lock_guard<std::mutex> lock(mutex_);
      if (auto it = kernels_.find(key); it != kernels_.end()) return it->second.get();
      const Kernel& kernel = load_resolved(resolved, *binary, resolved.str());
      ++counters_.background_compiles;
      detail::log().debug("{}: the specialized kernel takes over from the generic one", resolved.str());
      return &kernel;
    }
    case BackgroundCompiler::State::kUnknown:
      // A disk or bundle hit loads in well under a millisecond.
      if (disk_cache_.has_entry(resolved, target_)) return &get_or_fall_back(spec, resolved, max_vec);
      bg.request(key, resolved);
      detail::log().debug("{}: compiling in the background; the generic kernel runs meanwhile", resolved.str());
      return nullptr;
    default:  // queued, compiling, or failed (logged): the generic kernel
      return nullptr;
  }
}

BackgroundCompiler& Runtime::background() {
  std::lock_guard<std::mutex> lock(background_mutex_);
  if (!background_)
    background_ = std::make_unique<BackgroundCompiler>(
        [this](const Spec& resolved) { return disk_cache_.get_or_compile(resolved, target_); },
        BackgroundCompiler::default_threads());
  return *background_;
}

void Runtime::wait_for_background_compiles() {
  std::lock_guard<std::mutex> lock(background_mutex_);
  if (background_) background_->wait_idle();
}

BackgroundCompiler::State Runtime::background_state(const Spec& spec, int max_vec) {
  const Spec resolved = spec.block ? spec : choose(spec, max_vec);
  std::lock_guard<std::mutex> lock(background_mutex_);
  return background_ ? background_->state(packed_key(resolved)) : BackgroundCompiler::State::kUnknown;
}

size_t Runtime::workspace_bytes(const Spec& spec, int64_t rows, int64_t rows_per_batch, int max_vec) {
  if (spec.phase != Phase::kBackward) return 0;
  const CompileMode mode = compile_mode_.load();
  if (mode == CompileMode::kSync || (mode == CompileMode::kAsync && !generic_refusal(spec).empty())) {
    if (tuning_mode_ == TuningMode::kTuneOnMiss && !spec.block) (void)tuned_choice(spec);  // as launch() would
    return get_or_fall_back(spec, spec.block ? spec : choose(spec, max_vec), max_vec)
        .workspace_bytes(rows, rows_per_batch);
  }
  if (mode == CompileMode::kAsync)
    if (const Kernel* kernel = async_kernel(spec, max_vec)) return kernel->workspace_bytes(rows, rows_per_batch);
  return generic_workspace_bytes(spec, rows, rows_per_batch);
}

// A generic backward slot becomes a cluster where its row's dgamma/dbeta sums would leave fewer
// CTAs a SM than this.
constexpr int kGenericClusterWhenUnder = 3;
// The forward's clustered CTAs: x's segment a CTA in shared memory, at most 32 KB where eight CTAs
// hold the row, else up to 48 KB in eight (H200, bf16, M = 4096: 196608 in eight of 48 KB, LN / RMS
// 64.7 / 65.6 -> 68.2 / 72.5 % of copy; 262144 in eight of 64 KB, 65.2 / 66.0 -> 61.0 / 65.0, so
// such rows stay one CTA).
constexpr int64_t kGenericClusterSegmentBytes = 32 * 1024;
constexpr int64_t kGenericClusterMaxSegmentBytes = 48 * 1024;

// The generic kernels' launch: functions, grid and workspace.
struct Runtime::GenericLaunch {
  CUfunction function = nullptr, reduce = nullptr;
  unsigned threads = 0, grid_x = 0, grid_y = 1, smem = 0;
  unsigned cluster = 1;   // CTAs of a backward slot or a forward row (the _cluster kernel where > 1)
  int segment_packs = 0;  // in a cluster: packs of the row each CTA takes
  int flags = 0;
  int stage_packs = 0;  // kGenericStaged: packs of the row in shared memory
  int ctas_per_sm = 0;  // backward: resident CTAs a SM at this shape and shared memory
  int resident_clusters = 0;  // in clusters: how many the device holds at once (0: no cluster)
  int carveout = -1;  // the shared-memory share of the SM in percent, a launch attribute (-1: none)
  int64_t slots = 0;  // backward: partial slots a group
  size_t workspace_bytes = 0;
};

bool Runtime::is_loaded(const Spec& resolved) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kernels_.count(packed_key(resolved)) > 0;
}

std::string Runtime::generic_refusal(const Spec& spec) const {
  if (std::string why = generic_unsupported_why(spec); !why.empty()) return why;
  const GenericProgram program = generic_program_of(spec);
  if (target_.arch < generic_program_min_arch(program))
    return "spec '" + spec.str() + "': no generic kernel for epilogue=" + to_string(spec.epilogue) + " on " +
           target_.str() + " (the quantizing epilogues' generic kernels need sm_" +
           std::to_string(generic_program_min_arch(program)) + " or newer)";
  return {};
}

CUmodule Runtime::generic_module(DType x, GenericProgram program) {
  const auto key = std::make_pair(x, program);
  if (auto it = generic_modules_.find(key); it != generic_modules_.end()) return it->second;
  const GenericImage* image = generic_image_for(x, program, target_.arch);
  if (!image)
    throw Error(Status::kNotSupported, std::string("this build of normjit has no generic kernels of x ") +
                                           to_string(x) + " (" + to_string(program) + " program) for " +
                                           target_.str() + " (" + std::to_string(generic_images().size()) +
                                           " images built in)");
  NORMJIT_CU(cuCtxSetCurrent(context_));
  CUmodule module = nullptr;
  NORMJIT_CU_CTX(cuModuleLoadData(&module, image->image.data()),
                 std::string("loading the generic kernels of x ") + to_string(x) + " (" + to_string(program) + ", " +
                     image->arch + ")");
  detail::log().debug("generic kernels of x {} ({} program) loaded ({}, {} bytes)", to_string(x), to_string(program),
                      image->arch, image->image.size());
  return generic_modules_[key] = module;
}

CUfunction Runtime::generic_function(DType x, GenericProgram program, const std::string& name) {
  if (auto it = generic_functions_.find(name); it != generic_functions_.end()) return it->second;
  const CUmodule module = generic_module(x, program);
  CUfunction f = nullptr;
  NORMJIT_CU_CTX(cuModuleGetFunction(&f, module, name.c_str()), "loading generic kernel " + name);
  return generic_functions_[name] = f;
}

Runtime::GenericLaunch Runtime::generic_launch(const Spec& spec, int vec, int64_t rows, int64_t rows_per_batch,
                                               size_t workspace_limit) {
  // The plan (functions, CTA shape, shared memory, CTAs a SM) once per spec and vector width: its
  // driver queries and attribute settings are not repeated on every launch and workspace query.
  Spec unshaped = spec;
  unshaped.block.reset();
  const std::pair<uint64_t, int> key{packed_key(unshaped), vec};
  GenericLaunch g;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = generic_plans_.find(key); it != generic_plans_.end()) {
      g = *it->second;
    } else {
      g = generic_plan(spec, vec, kGenericMaxCluster);
      generic_plans_.emplace(key, std::make_unique<GenericLaunch>(g));
    }
  }
  if (spec.phase != Phase::kBackward) {  // a CTA a row, or a cluster a row
    g.grid_x = static_cast<unsigned>(std::min<int64_t>(rows, 0x7fffffff / g.cluster) * g.cluster);
    return g;
  }
  const bool ada = is_adaptive(spec.norm);
  const int64_t groups = ada && rows_per_batch > 0 ? rows / rows_per_batch : 1;
  const int64_t rows_per_group = ada && rows_per_batch > 0 ? rows_per_batch : rows;
  const size_t slot_bytes = generic_slot_bytes(spec, rows, rows_per_batch);
  int64_t slots = std::clamp<int64_t>(int64_t(std::max(1, g.ctas_per_sm)) * device_.sm_count / g.cluster /
                                          std::max<int64_t>(groups, 1),
                                      1, std::max<int64_t>(rows_per_group, 1));
  if (g.resident_clusters > 0)
    slots = std::clamp<int64_t>(int64_t(g.resident_clusters) / std::max<int64_t>(groups, 1), 1, slots);
  if (workspace_limit > 0) slots = std::clamp<int64_t>(int64_t(workspace_limit / slot_bytes), 1, slots);
  g.slots = slots;
  g.grid_x = static_cast<unsigned>(slots * g.cluster);
  g.grid_y = static_cast<unsigned>(std::max<int64_t>(groups, 1));
  g.workspace_bytes = slot_bytes * slots;
  return g;
}

namespace {
// The smallest shared-memory share of the SM in percent (the rest is L1) that still holds
// `per_sm` CTAs of `smem` dynamic bytes (and the kernel's static ones; with none dynamic, x and dy
// are read twice and want the L1 most): the rows' weights, read in both passes of every row, then
// stay in L1 instead of coming from L2 (32 KB of fp32 gamma at N = 8192 against the 28 KB of L1
// the all-shared split leaves). H200, bf16, fp32 weights, M = 32768, % of copy all-shared -> this:
// LN / RMS 5120 48.5 / 63.6 -> 52.3 / 66.0, 8192 50.4 / 64.1 -> 56.7 / 70.2, 16384 44.2 / 55.4 ->
// 46.8 / 60.7; 1024-2880 and the clusters past 24576 level. The query sets the function's
// attribute; launches pass the share as a launch attribute, which takes precedence, since specs
// of one kernel may want different shares.
int smallest_generic_carveout(CUfunction function, unsigned threads, unsigned smem, int per_sm) {
  auto ctas_at = [&](int percent) {
    NORMJIT_CU_CTX(cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, percent),
                   "setting the generic backward's L1 / shared-memory split to " + std::to_string(percent) + " %");
    int ctas = 0;
    NORMJIT_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, function, static_cast<int>(threads),
                                                           static_cast<size_t>(smem)));
    return ctas;
  };
  if (per_sm > 0)
    for (int percent = 10; percent < 100; percent += 5)
      if (ctas_at(percent) >= per_sm) return percent;
  ctas_at(CU_SHAREDMEM_CARVEOUT_MAX_SHARED);
  return CU_SHAREDMEM_CARVEOUT_MAX_SHARED;
}
}  // namespace

// A generic launch's configuration: its shared-memory share (backward; a launch attribute from
// driver 12.4 on, else the caller sets the function's) and cluster as launch attributes, which
// `attrs` holds.
CUlaunchConfig Runtime::generic_config(const GenericLaunch& g, unsigned grid_x, CUstream stream,
                                       CUlaunchAttribute (&attrs)[2]) const {
  CUlaunchConfig config{};
  config.gridDimX = grid_x;
  config.gridDimY = g.grid_y;
  config.gridDimZ = 1;
  config.blockDimX = g.threads;
  config.blockDimY = config.blockDimZ = 1;
  config.sharedMemBytes = g.smem;
  config.hStream = stream;
  config.attrs = attrs;
  if (g.carveout >= 0 && carveout_launch_attribute()) {
    attrs[config.numAttrs] = CUlaunchAttribute{};
    attrs[config.numAttrs].id = CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT;
    attrs[config.numAttrs++].value.sharedMemCarveout = static_cast<unsigned>(g.carveout);
  }
  if (g.cluster > 1) {
    attrs[config.numAttrs] = CUlaunchAttribute{};
    attrs[config.numAttrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[config.numAttrs].value.clusterDim.x = g.cluster;
    attrs[config.numAttrs].value.clusterDim.y = attrs[config.numAttrs].value.clusterDim.z = 1;
    ++config.numAttrs;
  }
  return config;
}

int Runtime::generic_resident_clusters(const GenericLaunch& g, const std::string& what) const {
  CUlaunchAttribute attrs[2];
  const CUlaunchConfig config = generic_config(g, g.cluster, nullptr, attrs);
  int clusters = 0;
  NORMJIT_CU_CTX(cuOccupancyMaxActiveClusters(&clusters, g.function, &config), what);
  return clusters;
}

// The forward of a row that crowds the L2 in a cluster (norm_generic.cuh, generic_fwd_cluster): the
// fewest CTAs, up to the portable 8, whose segments of x take at most kGenericClusterSegmentBytes of
// shared memory each (past 8 x 32 KB, eight larger ones, up to kGenericClusterMaxSegmentBytes).
// Clusters of 9-16 CTAs of 32 KB ran 0.96-1.03x one CTA a row at 131112-262144, eight CTAs
// 1.06-1.11x at 131112-196608 (H200, bf16, M = 4096). False (g unchanged) where the row needs
// none or no such cluster is resident. mutex_ held.
bool Runtime::plan_generic_forward_cluster(GenericLaunch& g, const Spec& spec, int vec) {
  const int64_t pack_bytes = int64_t(vec) * dtype_size(spec.x_dtype);
  const GenericForwardCluster shape =
      generic_forward_cluster_shape(spec.n / vec, pack_bytes, kGenericClusterSegmentBytes, kMaxPortableCluster);
  if (shape.cluster < 2 || shape.segment_packs * pack_bytes > kGenericClusterMaxSegmentBytes) return false;
  GenericLaunch c = g;
  c.cluster = shape.cluster;
  c.segment_packs = static_cast<int>(shape.segment_packs);
  c.threads = shape.threads;
  c.smem = static_cast<unsigned>(shape.segment_packs * pack_bytes);
  c.function = generic_function(spec.x_dtype, GenericProgram::kNorm, generic_kernel_name(spec, vec, true));
  const std::string what = "the generic forward of " + spec.str() + " in clusters of " + std::to_string(c.cluster) +
                           " CTAs of " + std::to_string(c.smem) + " bytes of shared memory";
  NORMJIT_CU_CTX(cuFuncSetAttribute(c.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    static_cast<int>(c.smem)),
                 what);
  NORMJIT_CU_CTX(cuFuncSetAttribute(c.function, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                                    CU_SHAREDMEM_CARVEOUT_MAX_SHARED),
                 what);
  int per_sm = 0;
  NORMJIT_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, c.function, static_cast<int>(c.threads), c.smem));
  if (per_sm < 1) return false;
  c.carveout = smallest_generic_carveout(c.function, c.threads, c.smem, per_sm);
  c.resident_clusters = generic_resident_clusters(c, what);
  if (c.resident_clusters < 1) {
    detail::log().debug("{}: none resident", what);
    return false;
  }
  g = c;
  return true;
}

// mutex_ held (generic_function).
Runtime::GenericLaunch Runtime::generic_plan(const Spec& spec, int vec, int max_cluster) {
  if (const std::string why = generic_refusal(spec); !why.empty()) throw Error(Status::kNotSupported, why);
  GenericLaunch g;
  const bool backward = spec.phase == Phase::kBackward;
  if (subtracts_mean(spec.norm)) g.flags |= kGenericSubtractsMean;
  if (spec.has_bias) g.flags |= kGenericHasBias;
  if (is_adaptive(spec.norm)) g.flags |= kGenericPerGroup;
  if (spec.zero_centered) g.flags |= kGenericZeroCentered;
  if (spec.phase == Phase::kForwardTraining) g.flags |= kGenericTraining;
  if (spec.bias_in) g.flags |= kGenericBiasIn;
  const int64_t packs = spec.n / vec;
  g.function = generic_function(spec.x_dtype, generic_program_of(spec), generic_kernel_name(spec, vec));
  // The queries below need a current context: workspace_bytes() may come from a thread with none
  // (torch's autograd threads).
  use_context(context_, spec.str() + " (generic kernel)");
  // The forward: about kGenericUnroll packs a thread, every load of a pass in flight at once.
  if (!backward) {
    const GenericForwardShape shape = generic_forward_shape(
        packs, spec.n * dtype_size(row_dtype(spec)), device_.sm_count, device_.l2_bytes, [&](unsigned threads) {
          int ctas = 0;
          NORMJIT_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, g.function, static_cast<int>(threads), 0));
          return ctas;
        });
    g.threads = shape.threads;
    // Where even 512-thread CTAs leave more rows in flight than the L2 holds, a cluster a row.
    const bool crowds_l2 = shape.threads > unsigned(kGenericMaxThreads);
    if (shape.rows_past_l2 && !(crowds_l2 && target_.arch >= 90 && generic_has_clustered(spec, vec) &&
                                plan_generic_forward_cluster(g, spec, vec)))
      g.flags |= kGenericRowsPastL2;
    return g;
  }
  // The backward takes a pack a round; its width is chosen below by occupancy, and this one (as
  // wide as the row allows, in even rounds of at most kGenericMaxThreads packs) sizes its clusters.
  auto threads_for = [&](int64_t segment_packs) {
    const int64_t packs_per_thread = ceil_div(std::max<int64_t>(segment_packs, 1), int64_t(kGenericMaxThreads));
    return static_cast<unsigned>(
        std::clamp<int64_t>((ceil_div(segment_packs, packs_per_thread) + 31) / 32 * 32, 32, kGenericMaxThreads));
  };
  g.threads = threads_for(packs);
  g.reduce = generic_function(spec.x_dtype, GenericProgram::kNorm, generic_reduce_name(spec.w_dtype));
  // Rows of at most kGenericMaxHeldPacks packs a thread stay in registers, with the weights and the
  // dgamma / dbeta sums, and the next row loads while this one reduces (generic_bwd_held); two
  // packs a thread from kGenericHeldTwoFrom packs (more bytes in flight a thread). H200, bf16, fp32
  // weights, M = 32768, % of copy LN / RMS, staged rows -> held: 1024 50.2 / 60.2 -> 57.5 / 76.8,
  // 2048 57.9 / 67.3 -> 67.9 / 80.8, 2560 55.6 / 65.3 -> 69.9 / 83.0, 4096 59.9 / 67.8 -> 72.5 / 83.4,
  // 7168 53.2 / 66.9 -> 68.6 / 73.3, 8192 57.3 / 71.4 -> 72.3 / 77.1; RMS 5120 67.5 -> 65.8 the one
  // loss (bench/data/2026-11-29-h200/generic_experiments/).
  if (const GenericBackwardHeld held = generic_backward_held_shape(packs);
      held.packs_per_thread > 0 && generic_has_held(spec, vec)) {
    g.function =
        generic_function(spec.x_dtype, GenericProgram::kNorm, generic_kernel_name(spec, vec, false, held.packs_per_thread));
    g.threads = held.threads;
    NORMJIT_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&g.ctas_per_sm, g.function, static_cast<int>(g.threads), 0));
    return g;
  }
  // Rows past one CTA's held packs: the held row split over a cluster (sm_90), its two sums added
  // over distributed shared memory. H200, bf16, fp32 weights, M = 32768, % of copy LN / RMS, staged
  // -> held clusters of 512-pack segments, sums pushed: 12288 49.5 / 62.6 -> 77.7 / 78.6, 16384
  // 44.9 / 60.7 -> 79.8 / 80.9, 32768 41.8 / 53.0 -> 77.1 / 77.5; 65536 in eight 1024-pack
  // segments 40.3 / 49.4 -> 71.9 / 72.1. Clusters of 12-16 (non-portable) lost at 98304 / RMS
  // 131072 with a cluster barrier a row, so none past 8
  // (bench/data/2026-11-29-h200/generic_experiments/bwd_held_cluster_*.md).
  if (const GenericBackwardHeldCluster held = generic_backward_held_cluster_shape(packs, kMaxPortableCluster);
      held.cluster > 0 && target_.arch >= 90 && generic_has_held(spec, vec) && generic_has_clustered(spec, vec)) {
    GenericLaunch c = g;
    c.cluster = held.cluster;
    c.segment_packs = static_cast<int>(held.segment_packs);
    c.threads = held.threads;
    c.function = generic_function(spec.x_dtype, GenericProgram::kNorm,
                                  generic_kernel_name(spec, vec, true, kGenericMaxHeldPacks));
    NORMJIT_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&c.ctas_per_sm, c.function, static_cast<int>(c.threads), 0));
    const std::string what = "the generic backward of " + spec.str() + " held in clusters of " +
                             std::to_string(c.cluster) + " CTAs";
    c.resident_clusters = generic_resident_clusters(c, what);
    if (c.ctas_per_sm >= 1 && c.resident_clusters >= 1) return c;
    detail::log().debug("{}: none resident", what);
  }
  if (generic_shared_optin_ < 0)
    NORMJIT_CU(cuDeviceGetAttribute(&generic_shared_optin_, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                    cu_device_));
  int static_bytes = 0;  // the kernel's own scratch shares the limit
  NORMJIT_CU(cuFuncGetAttribute(&static_bytes, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, g.function));
  int64_t free_bytes = generic_shared_optin_ - static_bytes;
  // The kernel may take all of it, and the SM's L1 leans to shared memory: the occupancy query
  // counts CTAs against that split, and the grid below is as many CTAs as it counts (a default
  // split that fit fewer would leave CTAs waiting, each with its whole share of rows).
  auto allow_all_shared = [&] {
    const std::string allowing =
        "allowing the generic backward " + std::to_string(free_bytes) + " bytes of shared memory";
    NORMJIT_CU_CTX(cuFuncSetAttribute(g.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                      static_cast<int>(free_bytes)),
                   allowing);
    NORMJIT_CU_CTX(cuFuncSetAttribute(g.function, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                                      CU_SHAREDMEM_CARVEOUT_MAX_SHARED),
                   allowing);
  };
  allow_all_shared();
  // dgamma (and dbeta) sums, fp32, over whole rounds of packs (norm_generic.cuh, GenericSums).
  auto sums_bytes_for = [&](int64_t segment_packs, unsigned threads) {
    return int64_t(spec.has_bias ? 8 : 4) * ceil_div(segment_packs, int64_t(threads)) * threads * vec;
  };
  // Where the row's sums leave fewer than kGenericClusterWhenUnder CTAs a SM, a slot is a cluster
  // (sm_90, 16-byte packs) of the fewest CTAs up to `max_cluster` whose segments' sums leave that many
  // (past eight, see below). Each CTA takes a segment of whole warps' packs. H200, bf16, M = 32768, %
  // of copy without / with: LayerNorm 16384 30.2 / 43.8 (2 CTAs), 65536 15.4 / 23.4 (8); RMSNorm 32768
  // 34.5 / 50.3 (2), 65536 33.2 / 35.5 (4); LayerNorm 24576 31.5 / 20.7 and 32768 28.8 / 24.1 in
  // clusters of four, which then ran only where one CTA could not hold the sums at all. Those clusters
  // ran in two waves until the grid took only the resident clusters (below): since then LayerNorm
  // 32768 24.5 -> 41.4 (4), 65536 23.2 -> 38.7 (8), RMSNorm 65536 36.2 -> 49.1 (4), fp32 weights
  // (perf-notes); and where one CTA holds the sums, one CTA / a cluster: LayerNorm 20480 31.3 / 36.2,
  // 24576 31.5 / 39.5, 28672 31.2 / 37.5; RMSNorm 40960 34.1 / 44.8, 49152 31.3 / 46.2.
  auto leaves_enough_ctas = [&](int64_t segment_packs) {
    return kGenericClusterWhenUnder * sums_bytes_for(segment_packs, threads_for(segment_packs)) <= free_bytes;
  };
  if (target_.arch >= 90 && generic_has_clustered(spec, vec) && !leaves_enough_ctas(packs)) {
    int64_t segment = packs;
    for (int64_t wanted = 2; wanted <= max_cluster; wanted *= 2) {
      segment = ceil_div(ceil_div(packs, wanted), int64_t(32)) * 32;
      if (leaves_enough_ctas(segment)) break;
      // Past eight (non-portable) only where eight leave fewer than two CTAs a SM: H200, bf16, fp32
      // weights, M = 4096, % of copy eight / sixteen: LayerNorm 98304 42.4 / 33.6 and RMSNorm 196608
      // 44.0 / 41.3 (two CTAs of eight), LayerNorm 131072 26.0 / 34.2, 262144 11.2 / 24.2 and
      // RMSNorm 262144 30.3 / 46.0 (one CTA of eight, or the sums in the workspace).
      if (wanted == kMaxPortableCluster && 2 * sums_bytes_for(segment, threads_for(segment)) <= free_bytes) break;
    }
    if (segment < packs) {
      g.cluster = static_cast<unsigned>(ceil_div(packs, segment));
      g.segment_packs = static_cast<int>(segment);
      g.threads = threads_for(segment);
      g.function = generic_function(spec.x_dtype, GenericProgram::kNorm, generic_kernel_name(spec, vec, true));
      if (g.cluster > unsigned(kMaxPortableCluster))
        NORMJIT_CU_CTX(cuFuncSetAttribute(g.function, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
                       "allowing the generic backward of " + spec.str() + " a cluster of " +
                           std::to_string(g.cluster) + " CTAs");
      // Its own scratch (the cluster's sum slots) shares the limit too.
      NORMJIT_CU(cuFuncGetAttribute(&static_bytes, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, g.function));
      free_bytes = generic_shared_optin_ - static_bytes;
      allow_all_shared();
    }
  }
  const int64_t segment = g.cluster > 1 ? g.segment_packs : packs;
  // The CTA's width (generic_backward_threads): the widest with about the most CTAs a SM, its
  // packs spread evenly. H200, bf16, fp32 weights, M = 32768, % of copy LN / RMS, as wide as the
  // row -> this rule: 768 45.0 / 50.5 -> 45.8 / 55.9, 1024 46.8 / 51.6 -> 49.4 / 59.0, 1536
  // 45.2 / 49.0 -> 54.3 / 64.1, 2048 46.5 / 50.2 -> 56.9 / 65.2, RMS 2880 59.4 -> 66.5 (96
  // threads, six CTAs a SM, against 192 and four); 5120 and wider level. LN 768 at 64 threads
  // (uneven rounds): 41.8.
  struct Shape {
    unsigned threads = 0, smem = 0;
    int flags = 0, stage_packs = 0, per_sm = 0;
  };
  auto shape_for = [&](unsigned threads) {
    Shape s{threads};
    auto ctas_per_sm = [&](int64_t smem) {
      int ctas = 0;
      NORMJIT_CU(cuOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, g.function, static_cast<int>(threads),
                                                             static_cast<size_t>(smem)));
      return ctas;
    };
    if (const int64_t sums_bytes = sums_bytes_for(segment, threads); sums_bytes <= free_bytes) {
      s.flags |= kGenericSharedSums;
      s.smem = static_cast<unsigned>(sums_bytes);
    }
    const int unstaged = ctas_per_sm(s.smem);
    s.per_sm = unstaged;
    // x and dy staged after the sums: two stages, else one, else the row's first packs; where that
    // leaves at least two CTAs a SM, or as many as without. H100, bf16, M = 32768, % of copy staged /
    // not: RMSNorm N = 4096 74.9 / 57.4 (four CTAs / three), 7168 74.7 / 72.6 (two / three), 16384
    // 44.3 (one) / 60.5 (three); LayerNorm 16384 41.2 / 40.7 (one / one).
    // A pack of x (the rows' type: an fp32 stream's h) and of dy.
    const int row_bytes = dtype_size(row_dtype(spec)), x_bytes = dtype_size(spec.x_dtype);
    const int64_t pack_pair_bytes = int64_t(vec) * (row_bytes + x_bytes);
    if (const int64_t stage_packs = std::min<int64_t>(segment, (free_bytes - s.smem - 15) / pack_pair_bytes);
        stage_packs > 0)
      for (int stages = stage_packs == segment ? 2 : 1; stages >= 1; --stages) {
        const int64_t smem =
            s.smem + int64_t(stages) * generic_stage_bytes(static_cast<int>(stage_packs), vec, row_bytes, x_bytes);
        if (smem > free_bytes) continue;
        if (const int ctas = ctas_per_sm(smem); ctas >= std::min(2, unstaged)) {
          s.flags |= kGenericStaged | (stages == 2 ? kGenericTwoStages : 0);
          s.stage_packs = static_cast<int>(stage_packs);
          s.smem = static_cast<unsigned>(smem);
          s.per_sm = ctas;
          break;
        }
      }
    return s;
  };
  std::map<unsigned, Shape> shapes;
  const unsigned width = generic_backward_threads(segment, threads_for(segment), [&](unsigned threads) {
    return shapes.emplace(threads, shape_for(threads)).first->second.per_sm;
  });
  const Shape& picked = shapes.at(width);
  g.threads = picked.threads;
  g.flags |= picked.flags;
  g.smem = picked.smem;
  g.stage_packs = picked.stage_packs;
  g.carveout = smallest_generic_carveout(g.function, g.threads, g.smem, picked.per_sm);
  g.ctas_per_sm = picked.per_sm;
  if (g.cluster > 1) {
    // A cluster must fit one GPC: fewer may be resident than the SMs' CTAs suggest, and a slot
    // past them would run as a second wave.
    g.resident_clusters = generic_resident_clusters(g, "sizing the generic backward's clusters of " + spec.str());
    // A GPU whose GPCs hold no non-portable cluster of this shape: the portable plan.
    if (g.resident_clusters < 1 && g.cluster > unsigned(kMaxPortableCluster)) {
      detail::log().debug("generic backward of {}: no cluster of {} CTAs resident; clusters of at most {}",
                          spec.str(), g.cluster, kMaxPortableCluster);
      return generic_plan(spec, vec, kMaxPortableCluster);
    }
  }
  return g;
}

size_t Runtime::generic_workspace_bytes(const Spec& spec, int64_t rows, int64_t rows_per_batch, int64_t max_slots) {
  if (spec.phase != Phase::kBackward) return 0;
  const size_t limit = max_slots > 0 ? generic_slot_bytes(spec, rows, rows_per_batch) * max_slots : 0;
  // The launch's vector width follows its pointers, unknown here, and each width's kernel fits its
  // own number of CTAs a SM: enough for the widest grid. (Sized for one-element packs alone, the
  // workspace held N = 1024's 16-byte-pack launch to 3 CTAs a SM of the 7 it fits.)
  size_t bytes = 0;
  for (const int vec : generic_vecs(row_dtype(spec)))
    if (spec.n % vec == 0) bytes = std::max(bytes, generic_launch(spec, vec, rows, rows_per_batch, limit).workspace_bytes);
  return bytes;
}

void Runtime::launch_generic(const Spec& spec, const LaunchArgs& args, CUstream stream) {
  if (const std::string why = generic_refusal(spec); !why.empty()) throw Error(Status::kNotSupported, why);
  const int vec = max_vec_for(spec, args);
  Spec shaped = spec;  // validate_launch checks the pointers against this vector width
  shaped.block = BlockConfig{};
  shaped.block->threads_per_row = 32;
  shaped.block->rows_per_cta = 1;
  shaped.block->vec = vec;
  try {
    validate_launch(shaped, args);
  } catch (const Error& e) {
    // Named as the caller named the spec: a generic launch has no block config.
    std::string what = std::string(e.what()).substr(std::string(to_string(e.status())).size() + 2);
    const std::string pinned = "launch of " + shaped.str();
    if (const size_t at = what.find(pinned); at != std::string::npos)
      what.replace(at, pinned.size(), "launch of " + spec.str() + " (generic kernel, vec=" + std::to_string(vec) + ")");
    throw Error(e.status(), what);
  }
  const bool backward = spec.phase == Phase::kBackward;
  const GenericLaunch g = generic_launch(spec, vec, args.rows, args.rows_per_batch, backward ? args.workspace_bytes : 0);
  if (backward && args.workspace_bytes < g.workspace_bytes)
    throw Error(Status::kInvalidArgument, "launch of " + spec.str() + " (generic kernel): workspace_bytes=" +
                                              std::to_string(args.workspace_bytes) + " is less than the " +
                                              std::to_string(g.workspace_bytes) +
                                              " bytes its one partial slot a group needs");
  use_context(context_, spec.str() + " (generic kernel)");
  NormParams p = params_of(spec, args);
  p.n = spec.n;
  p.generic_flags = g.flags;
  p.generic_stage_packs = g.stage_packs;
  p.generic_segment_packs = g.segment_packs;
  p.partial_slots = args.rows > 0 ? static_cast<int>(g.slots) : 0;  // no rows: the sums come out zero
  void* params[] = {&p};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.generic_launches;
  }
  if (args.rows > 0 && g.grid_x > 0) {
    CUlaunchAttribute attrs[2];
    const CUlaunchConfig config = generic_config(g, g.grid_x, stream, attrs);
    if (g.carveout >= 0 && !carveout_launch_attribute())
      NORMJIT_CU_CTX(cuFuncSetAttribute(g.function, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, g.carveout),
                     "setting the L1 / shared-memory split of the generic kernel of " + spec.str());
    NORMJIT_CU_CTX(cuLaunchKernelEx(&config, g.function, params, nullptr),
                   "launching the generic kernel of " + spec.str() +
                       (g.cluster > 1 ? " in clusters of " + std::to_string(g.cluster) + " CTAs" : std::string()));
  }
  if (backward)
    NORMJIT_CU_CTX(cuLaunchKernel(g.reduce, static_cast<unsigned>(ceil_div(spec.n, 32)), g.grid_y, 1, 256, 1, 1, 0,
                                  stream, params, nullptr),
                   "launching the generic dgamma/dbeta reduction of " + spec.str());
}

RuntimeCounters Runtime::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

}  // namespace normjit
