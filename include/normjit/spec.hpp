#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace normjit {

// AdaLayerNorm and AdaRMSNorm: LayerNorm / RMSNorm with gamma and beta per batch item ([B, N];
// x [B·S, N] with S rows per batch). With zero_centered, AdaLayerNorm is DiT's modulate form
// x̂·(1 + scale) + shift.
enum class Norm { kLayerNorm, kRMSNorm, kAdaLayerNorm, kAdaRMSNorm };
// Per-batch weights (the Ada norms).
constexpr bool is_adaptive(Norm n) { return n == Norm::kAdaLayerNorm || n == Norm::kAdaRMSNorm; }
// LayerNorm math (mean subtracted, mean saved) rather than RMSNorm's.
constexpr bool subtracts_mean(Norm n) { return n == Norm::kLayerNorm || n == Norm::kAdaLayerNorm; }
// The norm without per-batch weights: what the pick tables and the norm kernels' math see.
constexpr Norm base_norm(Norm n) { return subtracts_mean(n) ? Norm::kLayerNorm : Norm::kRMSNorm; }
enum class Phase { kForwardTraining, kForwardInference, kBackward };
enum class DType { kF32, kF16, kBF16 };
// The epilogue applied to the normalized output. Open set: each value has a row in the
// epilogue table (generator/spec.cpp) and a device functor (templates/normjit/epilogue_*.cuh);
// the norm kernels never change.
//   relu_bitmask: y = clamp(norm(x), lower, upper) plus a packed mask (bit k of byte j set when
//                 lower < y < upper for feature 8j+k); backward multiplies dy by the mask.
//   gelu:         y = gelu_tanh(norm(x)); backward recomputes the pre-activation.
//   fp8_e4m3, fp8_e5m2: y_quant = satfinite(round_nearest_even(norm(x) * scale)) in FP8, scale a
//                 device float; amax (optional) gets max |norm(x)| (TransformerEngine's delayed
//                 scaling); y in x's dtype is written too where given. Forward only (sm_89+): the
//                 backward of a quantized output is the plain norm's.
//   fp8_e4m3_row, fp8_e5m2_row, int8_row: dynamic per-row scaling (vLLM's per-token): each row's
//                 scale = amax(row) / qmax (448, 57344, 127; 1 for a row of zeros) goes to
//                 row_scales, the codes of y / scale to y_quant (int8: round half to even, clamped
//                 to [-128, 127]). Forward only; a clustered row reduces its amax over the cluster.
//   mxfp8_e4m3, mxfp8_e5m2: OCP MXFP8: every 32 consecutive values of a row share an E8M0 scale
//                 X = 2^(floor(log2(amax of the block)) - emax of the element format), written to
//                 block_scales ([rows, ceil(n / 32)] bytes, row-major, or swizzled: below); the codes of y / X go to
//                 y_quant. Forward only; a row group's lanes must cover whole blocks
//                 (threads_per_row * vec a multiple of 32; n / cluster too).
//   mxfp4:        OCP MXFP4: as mxfp8 with e2m1 elements (emax 2, max 6): X = 2^(floor(log2 amax) - 2)
//                 per 32 values, codes e2m1(y / X). Two codes a byte, the first element in the low
//                 nibble (OCP, torch.float4_e2m1fn_x2): y_quant holds n / 2 bytes a row, and its
//                 rows lie row_stride / 2 bytes apart (x's row stride in elements, halved: the
//                 codes keep x's layout at half a byte an element). n and row_stride even.
//   nvfp4:        NVIDIA NVFP4: 16 values per e4m3 block scale s = e4m3(amax(block) / 6 *
//                 S_enc), codes e2m1(y * S_enc / s) (0 where s is 0), packed as mxfp4's; S_enc
//                 is the caller's fp32 tensor scale at quant_scale (448 * 6 / amax(tensor), as
//                 TransformerEngine and FlashInfer take it); y ~ code * s / S_enc.
//   Block scales are row-major [rows, ceil(n / block)] or, by LaunchArgs::block_scale_layout,
//   the 128x4-tiled layout the GEMM libraries read (runtime.hpp).
// New values go at the end: the numbers are part of the kernel cache key.
enum class Epilogue {
  kNone,
  kReluBitmask,
  kGelu,
  kFp8E4M3,
  kFp8E5M2,
  kFp8E4M3Row,
  kFp8E5M2Row,
  kInt8Row,
  kMxfp8E4M3,
  kMxfp8E5M2,
  kMxfp4,
  kNvfp4
};

// Per-tensor FP8 with a given scale (quant_scale, optional amax).
inline bool scales_per_tensor(Epilogue e) { return e == Epilogue::kFp8E4M3 || e == Epilogue::kFp8E5M2; }
// Dynamic per-row scaling (row_scales).
inline bool scales_per_row(Epilogue e) {
  return e == Epilogue::kFp8E4M3Row || e == Epilogue::kFp8E5M2Row || e == Epilogue::kInt8Row;
}
// Block scales (block_scales): MX, 32 values a block; NVFP4, 16.
inline bool scales_per_block(Epilogue e) {
  return e == Epilogue::kMxfp8E4M3 || e == Epilogue::kMxfp8E5M2 || e == Epilogue::kMxfp4 || e == Epilogue::kNvfp4;
}
constexpr int kMxBlock = 32;
constexpr int kNvfp4Block = 16;
// Values per block scale of a block-scaled epilogue; 0 for the others.
inline int scale_block_size(Epilogue e) {
  return e == Epilogue::kNvfp4 ? kNvfp4Block : scales_per_block(e) ? kMxBlock : 0;
}
// e2m1 codes, two a byte (mxfp4, nvfp4).
inline bool packs_fp4(Epilogue e) { return e == Epilogue::kMxfp4 || e == Epilogue::kNvfp4; }
// Reads the caller's fp32 scale at quant_scale: per-tensor FP8, and NVFP4's tensor scale S_enc.
inline bool reads_quant_scale(Epilogue e) { return scales_per_tensor(e) || e == Epilogue::kNvfp4; }
// True for the epilogues that quantize y into y_quant.
inline bool quantizes(Epilogue e) { return scales_per_tensor(e) || scales_per_row(e) || scales_per_block(e); }
// Forward: where a CTA keeps its row between the statistics and output passes: registers (reg),
// dynamic shared memory (smem: one row per CTA, or one segment per CTA of a cluster; at most
// kMaxSharedRowBytes per CTA), or nowhere, streaming it twice (gmem). Backward: reg = one fused
// persistent kernel with the row in registers; smem = the same with x and dy in shared memory
// (2 * N / cluster * sizeof(x) bytes per CTA); gmem = row sums, then a column-tiled dx/dgamma kernel.
// Both: pipe = smem with two row buffers in a persistent grid; each thread copies its packs of the
// next row in asynchronously (cp.async) while the CTA works on the current one. pipe3 / pipe4
// keep three or four buffers: two or three rows in flight behind the current one. tma (tma3, tma4)
// = pipe whose rows arrive by bulk copies (sm_90 cp.async.bulk, the TMA unit): one thread copies a
// whole row segment and an mbarrier per buffer tells the CTA when its bytes have landed.
enum class RowCache { kRegisters, kGlobal, kShared, kSharedPipelined };
// smem and pipe: the row (segment) waits in dynamic shared memory.
constexpr bool in_shared_memory(RowCache c) { return c == RowCache::kShared || c == RowCache::kSharedPipelined; }
// The most dynamic shared memory a smem row may take (sm_90's per-CTA opt-in limit, 227 KB).
constexpr int64_t kMaxSharedRowBytes = 227 * 1024;
// sm_90's shared memory a SM, and what each CTA takes of it beside its row (the driver's 1 KB and
// the kernels' static scratch): how many CTAs' rows fit a SM.
constexpr int64_t kSharedBytesPerSm = 228 * 1024;
constexpr int64_t kSharedReservePerCta = 2048;

struct BlockConfig {
  int threads_per_row = 0;  // <= 32: a power of two (sub-warp); > 32: a multiple of 32
  int rows_per_cta = 0;     // > 1 only when threads_per_row <= 32
  int vec = 0;              // elements per vector access; divides N
  RowCache cache = RowCache::kRegisters;
  // CTAs per row (sm_90 thread-block cluster): each holds N / cluster columns in registers and
  // the row statistics are summed across the cluster through distributed shared memory.
  int cluster = 1;
  // Row buffers of a pipelined row (pipe): 2-4. Every other row cache keeps the default, 2.
  int stages = 2;
  // Pipelined rows only: the rows arrive by bulk copies (spelled tma[3|4]) instead of each
  // thread's cp.async of its packs. Needs 16-byte packs and sm_90.
  bool bulk_copy = false;
  // Backward bulk-copied rows only (spelled ws[3-8]): one more warp per CTA fills a ring of
  // `stages` row buffers while the threads_per_row threads compute, each of their warps releasing
  // a buffer once done with it (at once where a thread holds one pack, moved into registers).
  // Up to kMaxProducerStages buffers.
  bool producer_warp = false;
  bool operator==(const BlockConfig& o) const {
    return threads_per_row == o.threads_per_row && rows_per_cta == o.rows_per_cta && vec == o.vec &&
           cache == o.cache && cluster == o.cluster && stages == o.stages && bulk_copy == o.bulk_copy &&
           producer_warp == o.producer_warp;
  }
  bool operator!=(const BlockConfig& o) const { return !(*this == o); }
};

// Names one kernel. Canonical string (print/parse round-trip):
//   <norm>.<phase>.<x dtype>.w_<weight dtype>.n<N>[.bias][.zero_centered][.residual|.residual_f32][.bias_in][.memory_efficient][.<epilogue>][.cfg_t<T>_r<R>_v<V>[_c<C>]_<reg|gmem|smem|pipe[3|4]|tma[3|4]|ws[3-8]>]
// (_c<C> only for clusters of C > 1 CTAs per row; pipe3 / pipe4: a pipelined row of 3 / 4 buffers;
// tma: a pipelined row filled by bulk copies; ws: a backward tma row with a producer warp)
// e.g. "layernorm.fwd_train.bf16.w_f32.n4096.bias" or "rmsnorm.fwd_infer.f16.w_f16.n7.cfg_t1_r256_v1_reg".
struct Spec {
  Norm norm = Norm::kLayerNorm;
  Phase phase = Phase::kForwardTraining;
  DType x_dtype = DType::kBF16;
  DType w_dtype = DType::kBF16;
  int64_t n = 0;
  bool has_bias = false;  // forward: beta is added; backward: dbeta (dbias) is produced
  // Zero-centred weight (Gemma, TransformerEngine): the scale is 1 + gamma; dgamma keeps its meaning.
  bool zero_centered = false;
  // Residual add. Forward: h = x + residual (rounded to x's dtype) is written out and normalized.
  // Backward (x is then h): dx = dnorm(dy) + dh_out, the gradient of both x and residual.
  // Forward rows of a pipelined block config (pipe, tma) are not supported: resolve() picks the
  // non-pipelined shared-memory row instead.
  bool residual = false;
  // With residual (token .residual_f32): the residual stream (residual, h, dh_out) is fp32 while x,
  // y, dy and dx keep x's dtype (a bf16 model with an fp32 residual stream, as Megatron's
  // fp32_residual_connection): h = x + residual is not rounded to x's dtype. Rows are held and
  // normalized in fp32, so block configs are those of an f32 spec (row_dtype()). The backward
  // writes dh twice: in x's dtype to dx (the gradient of x) and in fp32 to dresidual.
  bool residual_f32 = false;
  // With residual, forward only: h = x + bias_in + residual, bias_in [N] in the weight dtype (a
  // preceding linear layer's bias). Summed in fp32 and rounded once. Its gradient is the column sum
  // of the backward's dx, which the caller forms (normjit.torch does).
  bool bias_in = false;
  // Memory-saving backward (Apex's memory_efficient): the backward reads the forward's output y
  // instead of x and recovers x̂ = (y - beta) / gamma' (gamma' = gamma, or 1 + gamma zero-centred),
  // so training keeps y and rstd, not x and mean. Backward only, epilogue none (a clamp or gelu
  // cannot be inverted). Exact where y is; x̂'s error grows as |beta / gamma'|, and a column with
  // gamma' = 0 cannot be recovered (docs/fusions.md): the caller keeps gamma' away from zero.
  bool memory_efficient = false;
  Epilogue epilogue = Epilogue::kNone;
  std::optional<BlockConfig> block;  // filled by the heuristic when absent

  std::string str() const;
  static Spec parse(std::string_view text);  // throws Error(kInvalidSpec) naming the bad token

  // Convenience: weight dtype defaults to the x dtype.
  static Spec make(Norm norm, Phase phase, DType x, int64_t n, bool has_bias = false);

  bool operator==(const Spec& o) const;
  bool operator!=(const Spec& o) const { return !(*this == o); }
};

const char* to_string(Norm v);
const char* to_string(Phase v);
const char* to_string(DType v);
const char* to_string(Epilogue v);
const char* to_string(RowCache v);
int dtype_size(DType d);
// The dtype a spec's kernels hold and normalize rows in: f32 for an fp32 residual stream, else x's.
inline DType row_dtype(const Spec& s) { return s.residual_f32 ? DType::kF32 : s.x_dtype; }
// Backward shared-memory rows whose threads hold more values than registers fit two fp32 sums
// for (16 per thread above 768 threads, 24 at most 768; 8 fewer with a residual, 8 fewer
// memory_efficient) keep the dbeta sums
// in shared memory too;
// the dgamma sums stay in registers.
bool dbeta_sums_in_shared(const Spec& s, const BlockConfig& b);
// A residual backward's bulk-copied rows (tma, tma3...) bring dh_out into each row buffer beside
// x and dy, in rows of more than 3072 values and CTAs under 1024 threads, where the three rows (and
// the dbeta sums) fit one CTA's shared memory; otherwise the dx pass reads dh_out from global memory.
bool bulk_copies_dh_out(const Spec& s, const BlockConfig& b);
// A memory_efficient fused backward (reg, smem, pipe) keeps per-column values of x̂ = (y - beta) / gamma'
// for its columns in shared memory, written once per CTA instead of read per row: 1/gamma' (fp32,
// reciprocal), then beta (weight dtype, beta) where room is left. Each part only where it leaves
// every CTA an SM holds (as its registers allow, estimated) its share of sm_90's 228 KB, within
// kMaxSharedRowBytes; otherwise x̂ comes from gamma and beta in global memory, divided per row.
struct XhatTable {
  bool reciprocal = false;
  bool beta = false;
};
XhatTable xhat_table(const Spec& s, const BlockConfig& b);
// Its bytes per CTA (0 without one): after the row buffers and dbeta sums of a shared-memory row,
// alone for a row in registers.
int64_t xhat_table_bytes(const Spec& s, const BlockConfig& b);
// Packs of b.vec elements in each CTA's segment of a row split over b.cluster CTAs: n / vec /
// cluster rounded up, and for block-scaled outputs up to whole scale blocks. Where that leaves
// the last CTA fewer packs its segment is shorter (ragged_segments): rows in registers or one
// buffer of shared memory only.
int64_t segment_packs(const Spec& s, const BlockConfig& b);
// The last CTA's packs: segment_packs() unless ragged, then fewer (none or less: no such split).
int64_t last_segment_packs(const Spec& s, const BlockConfig& b);
bool ragged_segments(const Spec& s, const BlockConfig& b);
// Whether each CTA's segment holds whole relu_bitmask mask bytes and whole block-scale blocks
// (always true for one CTA per row).
bool segments_hold_whole_epilogue_units(const Spec& s, const BlockConfig& b);
// Dynamic shared memory per CTA of a shared-memory row (smem or pipe) split over b.cluster
// CTAs: the row's segment of x; in the backward, of dy too (both once per buffer for pipe), fp32 dbeta
// sums where dbeta_sums_in_shared(), and the xhat_table.
int64_t shared_row_bytes(const Spec& s, const BlockConfig& b);

constexpr int64_t kMaxHiddenSize = 262144;
// A row held in registers takes at most this many packs per thread (an unrolled array).
constexpr int64_t kMaxRegisterPacks = 16;

// Parses a spec's block-config suffix, "cfg_t<T>_r<R>_v<V>[_c<C>]_<cache>", without checking it
// against any spec (validate() does that); throws Error(kInvalidSpec) naming the bad field.
BlockConfig parse_block_config(std::string_view text);

// Throws Error(kInvalidSpec) naming the field when the spec cannot name a kernel (N out of range,
// a block config that breaks its rules, ...).
void validate(const Spec& spec);

// Largest cluster (CTAs per row). Past 8, the portable limit, the runtime opts the kernel in to
// non-portable cluster sizes (sm_90 allows 16) and fails with a clear error where the GPU cannot
// co-schedule that many CTAs.
constexpr int kMaxCluster = 16;
constexpr int kMaxPortableCluster = 8;
// Most row buffers a pipelined row keeps.
constexpr int kMaxPipeStages = 4;
constexpr int kMaxProducerStages = 8;  // ws rows

// Fills spec.block with the heuristic's choice when absent: the row of the GPU class's pick table
// (generator/picks/, docs/picks.md) that holds the spec, else a rule-based fallback. max_vec caps
// the vector width, e.g. when a caller's pointers are less aligned than 16 bytes. sm is the
// target's compute capability (90 for sm_90): clusters are chosen only from sm_90 on. max_cluster caps the CTAs per
// row: the runtime passes kMaxPortableCluster once the GPU has failed to co-schedule 16 CTAs.
// Offline tools resolve with 16, as the runtime does on an H100 or H200.
Spec resolve(const Spec& spec, int max_vec = 16, int sm = 90, int max_cluster = kMaxCluster);

}  // namespace normjit
