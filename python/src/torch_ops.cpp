// normjit.torch's eager path in C++: torch.ops.normjit.eager_norm runs a norm (and its fusions) on
// CUDA tensors with its autograd node in C++, so a call costs the host what torch's own norms cost;
// a Python autograd.Function alone costs about as much as torch's whole forward and backward.
// torch.compile, fake tensors and CPU tensors go to the Python custom ops (normjit/torch/ops.py),
// whose CUDA implementation (normjit/torch/_launch.py) this file follows step for step.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <array>
#include <cuda_runtime_api.h>
#include <cmath>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "normjit/normjit.hpp"

namespace {

using at::Tensor;
using normjit::DType;
using normjit::Norm;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Errors raised here build their message without iostreams (c10::str, TORCH_CHECK's formatting):
// in a build against torch 2.11 with g++ 13, stream insertion compiled into this library crashed.
// A std::runtime_error reaches Python as RuntimeError with its message.
[[noreturn]] void fail(const std::string& message) { throw std::runtime_error("normjit: " + message); }

normjit::Runtime& runtime(int device) {
  // Creating it makes its device's context current: keep torch's current device.
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  return normjit::shared_runtime(device);
}

DType dtype_of(const Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kF32;
    case at::kHalf: return DType::kF16;
    case at::kBFloat16: return DType::kBF16;
    default: break;
  }
  fail(std::string(name) + ".dtype=" + c10::toString(t.scalar_type()) + " is not float32, float16 or bfloat16");
}

// The loaded kernels, by spec fields and vector width packed in one word; also the set of specs
// warmed for CUDA-graph capture, where a miss is an error instead of a compile.
std::mutex kernels_mutex;
std::unordered_map<uint64_t, const normjit::Kernel*> kernels;
std::unordered_map<int64_t, std::vector<std::string>> kernel_names;  // by device, in load order

uint64_t pack(int device, const normjit::Spec& s, int max_vec) {
  uint64_t k = static_cast<uint64_t>(s.n);  // <= 262144: 19 bits; 47 in all
  k = k << 8 | static_cast<uint64_t>(device);
  k = k << 2 | static_cast<uint64_t>(s.norm);
  k = k << 2 | static_cast<uint64_t>(s.phase);
  k = k << 2 | static_cast<uint64_t>(s.x_dtype);
  k = k << 2 | static_cast<uint64_t>(s.w_dtype);
  k = k << 3 | static_cast<uint64_t>(s.epilogue);
  k = k << 3 | (s.has_bias ? 4u : 0u) | (s.zero_centered ? 2u : 0u) | (s.residual ? 1u : 0u);
  return k << 5 | static_cast<uint64_t>(max_vec);
}

// The runtime API's query, as torch's own: it needs no current context on this thread (the autograd
// engine's device threads may have none).
bool capturing(CUstream stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &status));
  return status != cudaStreamCaptureStatusNone;
}

// What a launch runs: a loaded kernel (sync mode), or, where kernel is null, the runtime's compile
// mode (async: the generic kernel until the specialized one is compiled in the background; generic).
struct KernelRef {
  const normjit::Kernel* kernel = nullptr;
  normjit::Runtime* runtime = nullptr;
  normjit::Spec spec;
  int max_vec = 16;

  size_t workspace_bytes(int64_t rows, int64_t rows_per_batch) const {
    return kernel ? kernel->workspace_bytes(rows, rows_per_batch)
                  : runtime->workspace_bytes(spec, rows, rows_per_batch, max_vec);
  }
  void launch(const normjit::LaunchArgs& a, CUstream stream) const {
    if (kernel) kernel->launch(a, stream);
    else runtime->launch(spec, a, stream);
  }
};

KernelRef kernel_for(int device, const normjit::Spec& spec, const normjit::LaunchArgs& args, CUstream stream) {
  const int max_vec = normjit::max_vec_for(spec, args);
  const uint64_t key = pack(device, spec, max_vec);
  {
    std::lock_guard<std::mutex> lock(kernels_mutex);
    auto it = kernels.find(key);
    if (it != kernels.end()) return {it->second};
  }
  normjit::Runtime& rt = runtime(device);
  if (rt.compile_mode() != normjit::CompileMode::kSync) return {nullptr, &rt, spec, max_vec};
  if (capturing(stream)) {
    fail("kernel " + spec.str() + " (max_vec=" + std::to_string(max_vec) +
         ") is not loaded, and a CUDA graph is being captured, where it cannot be compiled; run the op once with "
         "the same shapes, dtypes and alignment before capturing (or set NORMJIT_COMPILE_MODE=async: a generic "
         "kernel is captured instead)");
  }
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  // Full-width vectors: get() also tunes on a miss and falls back from clusters the device cannot
  // co-schedule; narrower ones take the heuristic's choice for that width.
  const normjit::Kernel& k = max_vec >= 16 / normjit::dtype_size(spec.x_dtype) ? rt.get(spec)
                                                                               : rt.get(rt.choose(spec, max_vec));
  std::lock_guard<std::mutex> lock(kernels_mutex);
  if (kernels.emplace(key, &k).second) kernel_names[device].push_back(k.name());
  return {&k};
}

// A cached ones [n] weight: the kernels always read a gamma.
Tensor ones_weight(const Tensor& like, at::ScalarType dtype, int64_t n, CUstream stream) {
  static std::mutex mutex;
  static std::unordered_map<uint64_t, Tensor> ones;
  const uint64_t key = static_cast<uint64_t>(n) << 16 | static_cast<uint64_t>(like.get_device()) << 8 |
                       static_cast<uint64_t>(dtype);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = ones.find(key);
  if (it != ones.end()) return it->second;
  Tensor w = at::ones({n}, like.options().dtype(dtype));
  // Inside capture the fill is only recorded, not run: keep it out of the cache.
  if (!capturing(stream)) ones.emplace(key, w);
  return w;
}

// The stride between rows of t [..., n] whose leading dimensions flatten into evenly strided rows
// with a contiguous last dimension; 0 when they do not (t must then be made contiguous).
int64_t row_stride(const Tensor& t) {
  const int64_t n = t.size(-1);
  if (t.is_contiguous()) return n;
  if (n > 1 && t.stride(-1) != 1) return 0;
  int64_t rs = -1, count = 1;
  for (int64_t i = t.dim() - 2; i >= 0; --i) {
    const int64_t size = t.size(i);
    if (size == 1) continue;
    if (rs < 0) {
      rs = t.stride(i);
    } else if (t.stride(i) != rs * count) {
      return 0;
    }
    count *= size;
  }
  if (rs < 0) return n;
  return rs >= n ? rs : 0;  // overlapping rows (an expanded tensor) take a copy
}

// t itself when its rows are evenly strided, else a contiguous copy; rs gets the row stride.
Tensor with_rows(const Tensor& t, int64_t& rs) {
  rs = row_stride(t);
  if (rs != 0) return t;
  rs = t.size(-1);
  return t.contiguous();
}

// An uninitialized tensor of x's shape and dtype whose rows lie rs elements apart.
Tensor like_rows(const Tensor& x, int64_t rs) {
  if (rs == x.size(-1)) return at::empty(x.sizes(), x.options());
  std::vector<int64_t> strides(x.dim(), 1);
  int64_t step = rs;
  for (int64_t i = x.dim() - 2; i >= 0; --i) {
    strides[i] = step;
    step *= x.size(i);
  }
  return at::empty_strided(x.sizes(), strides, x.options());
}

CUstream current_stream(int device) {
  return reinterpret_cast<CUstream>(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream());
}

void launch(const KernelRef& k, const normjit::LaunchArgs& a, int device, CUstream stream) {
  if (device != c10::cuda::current_device()) {
    // The runtime launches in the current context: make it the tensor's device.
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    k.launch(a, stream);
  } else {
    k.launch(a, stream);
  }
}

// The spec of a launch on x [..., n] with this weight (its dtype), unresolved: the runtime picks
// the block config.
normjit::Spec spec_of(Norm norm, normjit::Phase phase, const Tensor& x, const Tensor& weight, bool has_bias,
                      bool zero_centered, bool residual, normjit::Epilogue epilogue) {
  normjit::Spec spec;
  spec.norm = norm;
  spec.phase = phase;
  spec.x_dtype = dtype_of(x, "x");
  spec.w_dtype = dtype_of(weight, "weight");
  spec.n = x.size(-1);
  spec.has_bias = has_bias;
  spec.zero_centered = zero_centered;
  spec.residual = residual;
  spec.epilogue = epilogue;
  return spec;
}

struct Forward {
  Tensor x, y, h, mean, rstd, mask;  // x: as launched (the forward's input, or its contiguous copy)
};

Forward run_forward(Tensor x, Tensor residual, Tensor weight, const Tensor& bias, Norm norm, double eps,
                    bool training, bool zero_centered, normjit::Epilogue epilogue, double clip_lower,
                    double clip_upper) {
  Forward f;
  const int64_t n = x.size(-1);
  int64_t rs = n;
  if (residual.defined()) {
    int64_t rrs = n;
    x = with_rows(x, rs);
    residual = with_rows(residual, rrs);
    if (rrs != rs) {
      x = x.contiguous();
      residual = residual.contiguous();
      rs = n;
    }
    f.h = like_rows(x, rs);
  } else {
    x = with_rows(x, rs);
  }
  f.x = x;
  f.y = like_rows(x, rs);
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  const auto f32 = x.options().dtype(at::kFloat);
  if (training) {
    f.rstd = at::empty({rows}, f32);
    if (normjit::subtracts_mean(norm)) f.mean = at::empty({rows}, f32);
  }
  if (epilogue != normjit::Epilogue::kNone) {
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = normjit::mask_row_bytes(n);
    f.mask = at::empty(shape, x.options().dtype(at::kByte));
  }
  const int device = x.get_device();
  const CUstream stream = current_stream(device);
  if (!weight.defined()) {
    weight = ones_weight(x, x.scalar_type(), n, stream);
  } else if (!weight.is_contiguous()) {
    weight = weight.contiguous();
  }
  const Tensor b = bias.defined() && !bias.is_contiguous() ? bias.contiguous() : bias;
  if (rows == 0) return f;

  const normjit::Spec spec =
      spec_of(norm, training ? normjit::Phase::kForwardTraining : normjit::Phase::kForwardInference, x, weight,
              b.defined(), zero_centered, residual.defined(), epilogue);

  normjit::LaunchArgs a;
  a.x = x.data_ptr();
  a.gamma = weight.data_ptr();
  a.beta = b.defined() ? b.data_ptr() : nullptr;
  a.y = f.y.data_ptr();
  a.mask = f.mask.defined() ? static_cast<uint8_t*>(f.mask.data_ptr()) : nullptr;
  a.row_stride = rs;
  if (residual.defined()) {
    a.residual = residual.data_ptr();
    a.h = f.h.data_ptr();
  }
  const KernelRef k = kernel_for(device, spec, a, stream);
  a.mean = f.mean.defined() ? f.mean.data_ptr<float>() : nullptr;
  a.rstd = f.rstd.defined() ? f.rstd.data_ptr<float>() : nullptr;
  a.clip_lower = static_cast<float>(clip_lower);
  a.clip_upper = static_cast<float>(clip_upper);
  a.rows = rows;
  a.rows_per_batch = normjit::is_adaptive(norm) ? rows / weight.size(0) : 0;
  a.eps = static_cast<float>(eps);
  launch(k, a, device, stream);
  return f;
}

// (dx, dweight, dbias): x is the forward's (its h with a residual), dh_out the gradient arriving
// on h or undefined; weight undefined: ones, and no dweight.
std::array<Tensor, 3> run_backward(Tensor dy, Tensor dh_out, Tensor x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd, const Tensor& mask, Norm norm, bool zero_centered,
                                   normjit::Epilogue epilogue, bool bias_grad) {
  const int64_t n = x.size(-1);
  int64_t rs = n;
  x = with_rows(x, rs);
  if (dy.scalar_type() != x.scalar_type()) dy = dy.to(x.scalar_type());
  if (row_stride(dy) != rs) {  // x, dy and dx share one row stride
    x = x.contiguous();
    dy = dy.contiguous();
    rs = n;
  }
  if (dh_out.defined()) {
    if (dh_out.scalar_type() != x.scalar_type()) dh_out = dh_out.to(x.scalar_type());
    if (row_stride(dh_out) != rs) {
      x = x.contiguous();
      dy = dy.contiguous();
      dh_out = dh_out.contiguous();
      rs = n;
    }
  }
  const int device = x.get_device();
  const CUstream stream = current_stream(device);
  Tensor dx = like_rows(x, rs);
  const Tensor gamma = weight.defined() ? weight.contiguous() : ones_weight(x, x.scalar_type(), n, stream);
  Tensor dgamma = at::empty_like(gamma);
  Tensor dbeta = bias_grad ? at::empty_like(gamma) : Tensor();
  const int64_t rows = x.numel() / n;
  if (rows == 0) {
    dgamma.zero_();
    if (dbeta.defined()) dbeta.zero_();
    return {dx, weight.defined() ? dgamma : Tensor(), dbeta};
  }
  const normjit::Spec spec = spec_of(norm, normjit::Phase::kBackward, x, gamma, bias_grad, zero_centered,
                                     dh_out.defined(), epilogue);

  normjit::LaunchArgs a;
  a.x = x.data_ptr();
  a.gamma = gamma.data_ptr();
  a.dy = dy.data_ptr();
  a.dx = dx.data_ptr();
  a.dgamma = dgamma.data_ptr();
  a.dbeta = dbeta.defined() ? dbeta.data_ptr() : nullptr;
  a.mask = mask.defined() ? static_cast<uint8_t*>(mask.data_ptr()) : nullptr;
  a.row_stride = rs;
  a.dh_out = dh_out.defined() ? dh_out.data_ptr() : nullptr;
  const KernelRef k = kernel_for(device, spec, a, stream);
  a.rows = rows;
  a.rows_per_batch = normjit::is_adaptive(norm) ? rows / gamma.size(0) : 0;
  a.mean = normjit::subtracts_mean(norm) ? mean.data_ptr<float>() : nullptr;
  a.rstd = rstd.data_ptr<float>();
  a.workspace_bytes = k.workspace_bytes(rows, a.rows_per_batch);
  Tensor workspace = at::empty({static_cast<int64_t>(std::max<size_t>(a.workspace_bytes, 16))},
                               x.options().dtype(at::kByte));
  a.workspace = workspace.data_ptr();
  a.clip_lower = 0.f;
  a.clip_upper = INFINITY;
  launch(k, a, device, stream);
  return {dx, weight.defined() ? dgamma : Tensor(), dbeta};
}

// Outputs: y, then h with a residual, then the mask with an epilogue.
variable_list outputs_of(const Forward& f) {
  variable_list out{f.y};
  if (f.h.defined()) out.push_back(f.h);
  if (f.mask.defined()) out.push_back(f.mask);
  return out;
}

// The optional tensors go in as std::optional: apply() makes no graph edge for an absent one, so the
// indices of needs_input_grad() count only the tensors present.
struct NormFunction : public torch::autograd::Function<NormFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const std::optional<Tensor>& residual_arg,
                               const std::optional<Tensor>& weight_arg, const std::optional<Tensor>& bias_arg,
                               int64_t norm, double eps, bool zero_centered, int64_t epilogue, double clip_lower,
                               double clip_upper) {
    const Tensor residual = residual_arg.value_or(Tensor()), weight = weight_arg.value_or(Tensor());
    const Tensor bias = bias_arg.value_or(Tensor());
    const Forward f = run_forward(x, residual, weight, bias, static_cast<Norm>(norm), eps, true, zero_centered,
                                  static_cast<normjit::Epilogue>(epilogue), clip_lower, clip_upper);
    ctx->saved_data["norm"] = norm;
    ctx->saved_data["epilogue"] = epilogue;
    ctx->saved_data["zero_centered"] = zero_centered;
    ctx->saved_data["residual"] = residual.defined();
    ctx->saved_data["has_weight"] = weight.defined();
    ctx->saved_data["has_bias"] = bias.defined();
    // mean / rstd never reach the caller, so nothing can modify them in place: saved_data skips
    // save_for_backward's version checks.
    ctx->saved_data["mean"] = f.mean;
    ctx->saved_data["rstd"] = f.rstd;
    ctx->save_for_backward({residual.defined() ? f.h : f.x, weight, f.mask});
    if (f.mask.defined()) ctx->mark_non_differentiable({f.mask});
    return outputs_of(f);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const bool residual = ctx->saved_data["residual"].toBool();
    const Tensor mean = ctx->saved_data["mean"].toTensor();  // undefined for RMSNorm
    // Edges: x, then residual, weight and bias where present.
    size_t edge = 1;
    const bool want_dx = ctx->needs_input_grad(0);
    const bool want_dres = residual && ctx->needs_input_grad(edge++);
    const bool want_dw = ctx->saved_data["has_weight"].toBool() && ctx->needs_input_grad(edge++);
    const bool want_db = ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(edge++);
    auto [dx, dw, db] = run_backward(grads[0], residual ? grads[1] : Tensor(), saved[0], saved[1], mean,
                                     ctx->saved_data["rstd"].toTensor(), saved[2],
                                     static_cast<Norm>(ctx->saved_data["norm"].toInt()),
                                     ctx->saved_data["zero_centered"].toBool(),
                                     static_cast<normjit::Epilogue>(ctx->saved_data["epilogue"].toInt()), want_db);
    return {want_dx ? dx : Tensor(), want_dres ? dx : Tensor(), want_dw ? dw : Tensor(), want_db ? db : Tensor(),
            Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

// The integer codes and the device the ops take, checked alike; `op` names the op in the message.
Norm checked_norm(const char* op, int64_t norm) {
  if (norm < 0 || norm > static_cast<int64_t>(Norm::kAdaRMSNorm)) {
    fail(std::string(op) + ": norm=" + std::to_string(norm) + " is not a normjit::Norm (0-3)");
  }
  return static_cast<Norm>(norm);
}

normjit::Epilogue checked_epilogue(const char* op, int64_t epilogue) {
  if (epilogue != 0 && epilogue != static_cast<int64_t>(normjit::Epilogue::kReluBitmask)) {
    fail(std::string(op) + ": epilogue=" + std::to_string(epilogue) + " is not none (0) or relu_bitmask (1)");
  }
  return static_cast<normjit::Epilogue>(epilogue);
}

void require_cuda(const char* op, const Tensor& x) {
  if (!x.is_cuda()) fail(std::string(op) + ": x is on " + x.device().str() + "; it takes CUDA tensors");
}

// The arguments are checked by normjit.torch before this is called (shapes, dtypes, devices).
std::vector<Tensor> eager_norm(const Tensor& x, const std::optional<Tensor>& residual,
                               const std::optional<Tensor>& weight, const std::optional<Tensor>& bias, int64_t norm,
                               double eps, bool zero_centered, int64_t epilogue, double clip_lower, double clip_upper) {
  const Norm kind = checked_norm("eager_norm", norm);
  // The Ada norms' rows per batch item come from the weight's first dimension.
  if (normjit::is_adaptive(kind) && !(weight && weight->defined() && weight->dim() == 2)) {
    fail("eager_norm: norm=" + std::to_string(norm) + " (adaptive) needs a weight [B, N]");
  }
  const normjit::Epilogue ep = checked_epilogue("eager_norm", epilogue);
  require_cuda("eager_norm", x);
  const Tensor r = residual.value_or(Tensor()), w = weight.value_or(Tensor()), b = bias.value_or(Tensor());
  const bool grad = at::GradMode::is_enabled() &&
                    (x.requires_grad() || (r.defined() && r.requires_grad()) || (w.defined() && w.requires_grad()) ||
                     (b.defined() && b.requires_grad()));
  if (grad) {
    return NormFunction::apply(x, residual, weight, bias, norm, eps, zero_centered, epilogue, clip_lower, clip_upper);
  }
  return outputs_of(run_forward(x, r, w, b, kind, eps, false, zero_centered, ep, clip_lower, clip_upper));
}

// The backward alone, with the statistics a training forward saved: what torch's own
// native_layer_norm_backward is to F.layer_norm, for callers (and benches) that hold mean / rstd
// themselves. Returns (dx, dweight, dbias); dbias undefined unless bias_grad.
std::vector<Tensor> eager_norm_backward(const Tensor& dy, const std::optional<Tensor>& dh_out, const Tensor& x,
                                        const std::optional<Tensor>& weight, const std::optional<Tensor>& mean,
                                        const Tensor& rstd, const std::optional<Tensor>& mask, int64_t norm,
                                        bool zero_centered, int64_t epilogue, bool bias_grad) {
  const Norm kind = checked_norm("eager_norm_backward", norm);
  const normjit::Epilogue ep = checked_epilogue("eager_norm_backward", epilogue);
  require_cuda("eager_norm_backward", x);
  if (normjit::subtracts_mean(kind) && !(mean && mean->defined())) {
    fail("eager_norm_backward: norm=" + std::to_string(norm) + " subtracts the mean and needs the saved mean");
  }
  const Tensor m = mask.value_or(Tensor());
  if (ep != normjit::Epilogue::kNone && !m.defined()) {
    fail("eager_norm_backward: epilogue=relu_bitmask needs the forward's mask");
  }
  auto [dx, dw, db] = run_backward(dy, dh_out.value_or(Tensor()), x, weight.value_or(Tensor()),
                                   mean.value_or(Tensor()), rstd, m, kind, zero_centered, ep, bias_grad);
  return {dx, dw, db};
}

std::vector<std::string> eager_kernels(int64_t device) {
  std::lock_guard<std::mutex> lock(kernels_mutex);
  auto it = kernel_names.find(device);
  return it == kernel_names.end() ? std::vector<std::string>{} : it->second;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(normjit, m) {
  m.def("eager_norm(Tensor x, Tensor? residual, Tensor? weight, Tensor? bias, int norm, float eps, "
        "bool zero_centered, int epilogue, float clip_lower, float clip_upper) -> Tensor[]");
  // One kernel for autograd and backends alike: it records its own autograd node.
  m.impl("eager_norm", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(eager_norm));
  m.def("eager_norm_backward(Tensor dy, Tensor? dh_out, Tensor x, Tensor? weight, Tensor? mean, Tensor rstd, "
        "Tensor? mask, int norm, bool zero_centered, int epilogue, bool bias_grad) -> Tensor[]");
  m.impl("eager_norm_backward", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(eager_norm_backward));
  // The kernels eager_norm loaded on a device (warmed for CUDA-graph capture), by name.
  m.def("eager_kernels(int device) -> str[]", &eager_kernels);
}
