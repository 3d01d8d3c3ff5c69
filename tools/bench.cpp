// normjit-bench: verifies normjit kernels against the fp64 CPU reference and times them with
// CUDA events, next to a device-to-device copy of the same bytes measured in the same process.
// --graph adds CUDA-graph replay timing: one graph of K launches over K rotating buffer sets,
// which takes the host's launch cost out of launch-bound (small) shapes.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <filesystem>
#include <random>

#include "normjit/normjit.hpp"
#include "normjit/quant_reference.hpp"
#include "normjit/reference.hpp"
#include "runtime/device_scratch.hpp"
#include "tools/output.hpp"

namespace nj = normjit;

#ifdef NORMJIT_TUNE_TOOL
constexpr const char* kTool = "normjit-tune";
#else
constexpr const char* kTool = "normjit-bench";
#endif
using Clock = std::chrono::steady_clock;

namespace {

using nj::detail::DeviceBuffer;
using nj::detail::time_median_us;

// The legacy stream cannot be captured. Non-blocking, so that no legacy-stream work (fills,
// memsets) joins a capture; the caller orders the two with cuCtxSynchronize.
struct Stream {
  CUstream stream = nullptr;
  Stream() { NORMJIT_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING)); }
  ~Stream() { nj::driver().cuStreamDestroy(stream); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

// An executable graph of `count` calls of fn(i), captured from `stream`.
struct Graph {
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() {
    if (exec) nj::driver().cuGraphExecDestroy(exec);
    if (graph) nj::driver().cuGraphDestroy(graph);
  }
  template <class Fn>
  void capture(CUstream stream, int count, const std::string& what, Fn&& fn) {
    // Global mode: a sync, an allocation or legacy-stream work from any thread during the capture
    // fails it, so whatever fn does that cannot live in a graph is reported, not silently run.
    NORMJIT_CU_CTX(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), "capturing " + what);
    int i = 0;
    try {
      for (; i < count; ++i) fn(i);
    } catch (...) {
      // End the (now invalid) capture so the stream stays usable; the first error is the one thrown.
      CUgraph broken = nullptr;
      nj::driver().cuStreamEndCapture(stream, &broken);
      if (broken) nj::driver().cuGraphDestroy(broken);
      std::fprintf(stderr, "normjit-bench: capturing %s failed at call %d of %d\n", what.c_str(), i + 1, count);
      throw;
    }
    NORMJIT_CU_CTX(cuStreamEndCapture(stream, &graph), "capturing " + what);
    NORMJIT_CU_CTX(cuGraphInstantiate(&exec, graph, 0), "instantiating the graph of " + what);
    NORMJIT_CU_CTX(cuGraphUpload(exec, stream), "uploading the graph of " + what);
  }
  void replay(CUstream stream) const { NORMJIT_CU(cuGraphLaunch(exec, stream)); }
};

}  // namespace

int main(int argc, char** argv) {
#ifdef NORMJIT_TUNE_TOOL
  CLI::App app{"Tune normjit kernels on a GPU: verify and time each spec's candidate block configs, keep the "
               "fastest in a tuning database (--tuning-db)."};
#else
  CLI::App app{"Verify and time normjit kernels on a GPU."};
#endif
  std::vector<std::string> spec_args;
  int64_t rows = 32768;
  int device = 0, warmup = 5, reps = 25, batch = 10, verify_rows = 16;
  int64_t rows_per_batch = 0;
  std::string json_path, cache_dir;
  bool no_verify = false, graph = false, generic = false, first_call = false;
  unsigned seed = std::random_device{}();
  app.add_option("specs", spec_args, "Spec strings")->required();
  app.add_option("-M,--rows", rows, "Rows (M)")->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(1) << 31));
  app.add_option("--device", device, "GPU ordinal")->capture_default_str();
  app.add_option("--rows-per-batch", rows_per_batch, "AdaLayerNorm: rows per batch (S); default: all rows")
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "Warm-up batches")->capture_default_str();
  app.add_option("--reps", reps, "Timed batches (median taken)")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--batch", batch, "Launches per timed batch (--graph: also graph replays per timed batch)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--verify-rows", verify_rows, "Rows checked against the fp64 reference")->capture_default_str();
  app.add_option("--seed", seed, "Random seed (default: fresh)");
  app.add_option("--cache-dir", cache_dir, "Disk cache directory");
  app.add_option("--json", json_path, "Write results as JSON to this file ('-' for stdout)");
  app.add_flag("--no-verify", no_verify, "Skip the reference check");
#ifdef NORMJIT_TUNE_TOOL
  bool tune = true;
#else
  bool tune = false;
  app.add_flag("--tune", tune, "Tune: time each spec's candidate block configs (normjit-tune)");
#endif
  bool launch_overhead = false;
  app.add_flag("--launch-overhead", launch_overhead,
               "Forward specs: host time per Kernel::launch against a raw cuLaunchKernel of the same kernel");
  std::string tuning_db_path;
  double budget_s = 60;
  size_t max_candidates = 24;
  app.add_option("--tuning-db", tuning_db_path, "Tuning database to update with the winners (JSON)");
  app.add_option("--budget-s", budget_s, "Tuning: seconds per spec before the remaining candidates are dropped")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-candidates", max_candidates, "Tuning: candidates per spec, nearest the heuristic first")
      ->capture_default_str()
      ->check(CLI::Range(size_t(1), size_t(256)));
  bool in_place = false;
  app.add_flag("--in-place", in_place,
               "Forward specs: y written over x (and a residual's h over residual), as FlashInfer's "
               "fused_add_rmsnorm does; outputs are not verified (the inputs are gone)");
  app.add_flag("--generic", generic,
               "Time the generic kernels (Runtime::launch_generic) instead of the specialized ones; rows are "
               "labelled generic:SPEC");
  app.add_flag("--first-call", first_call,
               "Time each forward spec's first launch in this process as NORMJIT_COMPILE_MODE runs it (use an empty "
               "--cache-dir): until launch() returns, until the kernel is done, until the specialized kernel is "
               "ready (async), and the launch after");
  app.add_flag("--graph", graph,
               "Also time CUDA-graph replay: one graph of K launches (and one of K copies) over K >= 16 "
               "rotating buffer sets that exceed 4x L2; verifies a replay's outputs");
  CLI11_PARSE(app, argc, argv);

  try {
    nj::Runtime rt(device, cache_dir);
    const nj::DeviceInfo& dev = rt.device();
    std::fprintf(stderr, "device %d: %s (%s, %d SMs, L2 %d MB), driver %d, NVRTC %d, seed %u\n", dev.ordinal,
                 dev.name.c_str(), rt.target().str().c_str(), dev.sm_count, dev.l2_bytes >> 20, dev.driver_version,
                 nj::nvrtc_version(), seed);
    const nj::detail::FillKernels util(rt.target(), dev.sm_count);
    nlohmann::json results = nlohmann::json::array();
    bool all_ok = true;
    bool output_failed = false;  // an output file the user asked for was not written
    if (graph)
      std::printf("%-58s %8s %5s %10s %10s %6s %10s %6s %9s %9s %7s %10s %9s %9s\n", "spec", "rows", "K", "graph us",
                  "copy us", "ratio", "copy=B us", "ratio=B", "GB/s", "copy GB/s", "%copy", "stream us", "max_err/tol",
                  "first get");
    else
      std::printf("%-58s %8s %10s %9s %9s %7s %9s %9s\n", "spec", "rows", "us", "GB/s", "copy GB/s", "%copy",
                  "max_err/tol", "first get");
    // Verifies and times one spec; its results row.
    auto measure = [&](const std::string& spec_text, size_t si) -> nlohmann::json {
      const nj::Spec requested = nj::Spec::parse(spec_text);
      const auto t0 = Clock::now();
      const nj::RuntimeCounters before = rt.counters();
      const nj::Kernel& kernel = rt.get(requested);
      const double first_get_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      const nj::RuntimeCounters after = rt.counters();
      // A memory hit where a tuner loaded the candidate just before.
      const char* first_get_kind = after.compiles > before.compiles     ? "compiled"
                                   : after.disk_hits > before.disk_hits ? "disk hit"
                                                                        : "memory hit";
      const double image_ms = 1e3 * (after.image_seconds - before.image_seconds);
      const double module_ms = 1e3 * (after.module_seconds - before.module_seconds);
      const nj::Spec& spec = kernel.spec();
      // In-process hit: the cost of get() on an already loaded kernel.
      constexpr int kHitLoops = 200000;
      const auto h0 = Clock::now();
      for (int i = 0; i < kHitLoops; ++i) (void)rt.get(spec);
      const double hit_ns = std::chrono::duration<double, std::nano>(Clock::now() - h0).count() / kHitLoops;

      const bool backward = spec.phase == nj::Phase::kBackward;
      const bool ada = nj::is_adaptive(spec.norm);
      const bool bitmask = spec.epilogue == nj::Epilogue::kReluBitmask;
      const int64_t rpb = ada ? (rows_per_batch > 0 ? rows_per_batch : rows) : 0;
      const int64_t groups = ada ? rows / rpb : 1;
      // The forward that feeds a backward its mean, rstd and mask.
      nj::Spec fwd_spec = spec;
      fwd_spec.block.reset();
      if (backward) fwd_spec.phase = nj::Phase::kForwardTraining;
      // A residual backward's x is h: its statistics come from the plain forward of x. An fp32
      // stream's backward reads h in fp32: the residual forward writes it (and its statistics).
      const bool stream_f32 = spec.residual_f32;
      if (backward && !stream_f32) fwd_spec.residual = false;
      fwd_spec.bias_in = false;
      fwd_spec.memory_efficient = false;
      // A memory_efficient backward reads the forward's y (kept in its own buffers) instead of x.
      const bool from_y = spec.memory_efficient;
      const bool residual = spec.residual;
      // M·N tensors of the stream's dtype the residual adds: residual read and h written (forward),
      // dh_out read (backward; an fp32 stream also writes dresidual).
      const int residual_streams = residual ? (backward ? (stream_f32 ? 2 : 1) : 2) : 0;
      const nj::Kernel& forward = rt.get(fwd_spec);
      const bool training = forward.spec().phase == nj::Phase::kForwardTraining;
      const bool has_mean = (training || backward) && nj::subtracts_mean(spec.norm);

      const int xs = nj::dtype_size(spec.x_dtype), ws = nj::dtype_size(spec.w_dtype);
      const int64_t n = spec.n;
      const size_t x_bytes = size_t(rows) * n * xs;
      // The residual stream's tensors: x's dtype, or f32 (residual_f32).
      const int rs = nj::dtype_size(nj::row_dtype(spec));
      const size_t r_bytes = size_t(rows) * n * rs;
      const size_t mask_bytes = size_t(rows) * nj::mask_row_bytes(n);
      // Rotate over enough buffer sets that the tensors one launch touches exceed 4x the L2.
      const int64_t per_set = int64_t((backward ? 3 : 2) * x_bytes + residual_streams * r_bytes);
      // --graph: at least 16 sets, and enough that the copy (2·M·N·itemsize per set, less than the
      // kernel touches) also exceeds 4x L2 per replay.
      constexpr int64_t kMaxGraphSets = 2048;
      const int sets = static_cast<int>(
          graph ? std::clamp<int64_t>((4LL * dev.l2_bytes) / int64_t(2 * x_bytes) + 1, 16, kMaxGraphSets)
                : std::clamp<int64_t>((4LL * dev.l2_bytes) / per_set + 1, 1, 64));
      if (graph && double(sets) * 2 * x_bytes <= 4.0 * dev.l2_bytes)
        std::fprintf(stderr,
                     "normjit-bench: warning: --rows %lld with %s: %d buffer sets (the most --graph uses) touch %.1f "
                     "MB per copy replay, not over 4x L2 (%.1f MB); times include L2 hits\n",
                     (long long)rows, spec.str().c_str(), sets, double(sets) * 2 * x_bytes / 1e6,
                     4.0 * dev.l2_bytes / 1e6);
      // Each input read once, each output written once. Backward, as genai_layers counts it:
      // dy, x read and dx written (3·M·N·itemsize), gamma read and dgamma (+ dbeta) written.
      // Residual: the forward also reads residual and writes h, the backward reads dh_out.
      // Quantizing epilogues write one byte of y an element instead of x's dtype.
      const bool quant = nj::quantizes(spec.epilogue);
      const bool per_tensor = nj::scales_per_tensor(spec.epilogue), per_row = nj::scales_per_row(spec.epilogue),
                 per_block = nj::scales_per_block(spec.epilogue);
      const int64_t blocks_per_row = nj::block_scale_row_bytes(n, spec.epilogue);
      const bool fp4 = nj::packs_fp4(spec.epilogue), reads_scale = nj::reads_quant_scale(spec.epilogue);
      // NVFP4's S_enc: 448 * 6 / 8, for |y| up to about 8 (larger values clamp their block's scale).
      const float nvfp4_s_enc = 336.0f;
      const double weight_bytes = double(groups) * n * ws;
      // An fp32 stream's backward reads h (its x) in fp32; bias_in is read once, [N].
      const double bytes =
          double(residual_streams) * r_bytes + (stream_f32 && backward ? double(r_bytes) - double(x_bytes) : 0.0) +
          (spec.bias_in ? double(n) * ws : 0.0) +
          (backward ? 3.0 * x_bytes + weight_bytes * (2 + (spec.has_bias ? (from_y ? 2 : 1) : 0))
                    : x_bytes * (quant ? 1.0 + (fp4 ? 0.5 : 1.0) / xs : 2.0) + weight_bytes * (spec.has_bias ? 2 : 1) +
                          double(rows) * 4 * ((training ? 1 : 0) + (has_mean ? 1 : 0) + (per_row ? 1 : 0)) +
                          (per_block ? double(rows) * blocks_per_row : 0.0) +
                          (bitmask ? mask_bytes : 0));
      // --graph also replays a copy of the launch's own bytes (half read, half written) per set: the
      // M·N copy above moves fewer bytes than a backward does.
      const size_t same_half = graph ? (size_t(bytes / 2) + 15) / 16 * 16 : 0;
      DeviceBuffer same_src(same_half * sets), same_dst(same_half * sets);
      DeviceBuffer x(x_bytes * sets), y(x_bytes * sets), dy(backward ? x_bytes * sets : 0),
          gamma(groups * n * ws), beta(spec.has_bias ? groups * n * ws : 0), mean(rows * 4 * sets),
          rstd(rows * 4 * sets), mask(bitmask ? mask_bytes * sets : 0), dgamma(backward ? groups * n * ws : 0),
          dbeta(backward && spec.has_bias ? groups * n * ws : 0),
          workspace(backward ? (generic ? rt.generic_workspace_bytes(spec, rows, rpb) : kernel.workspace_bytes(rows, rpb))
                             : 0),
          residual_in(residual && (!backward || stream_f32) ? r_bytes * sets : 0),
          h_out(residual && (!backward || stream_f32) ? r_bytes * sets : 0),
          dh_out(residual && backward ? r_bytes * sets : 0), dresidual(stream_f32 && backward ? r_bytes * sets : 0),
          bias_in(spec.bias_in ? n * ws : 0), quant_scale(reads_scale ? 4 : 0), amax(per_tensor ? 4 : 0),
          row_scales(per_row ? rows * 4 * sets : 0), block_scales(per_block ? rows * blocks_per_row * sets : 0),
          y_in(from_y ? x_bytes * sets : 0);
      const unsigned s0 = seed + 17 * static_cast<unsigned>(si);
      util.run(x.get(), spec.x_dtype, (long long)(rows * n * sets), s0, 2.0f, 0.5f);
      util.run(gamma.get(), spec.w_dtype, groups * n, s0 + 1, 0.5f, 1.0f);
      if (spec.has_bias) util.run(beta.get(), spec.w_dtype, groups * n, s0 + 2, 0.5f, 0.0f);
      if (backward) util.run(dy.get(), spec.x_dtype, (long long)(rows * n * sets), s0 + 3, 1.0f, 0.0f);
      const nj::DType stream_dtype = nj::row_dtype(spec);
      if (residual_in.bytes) util.run(residual_in.get(), stream_dtype, (long long)(rows * n * sets), s0 + 4, 1.0f, 0.0f);
      if (dh_out.bytes) util.run(dh_out.get(), stream_dtype, (long long)(rows * n * sets), s0 + 5, 1.0f, 0.0f);
      if (spec.bias_in) util.run(bias_in.get(), spec.w_dtype, n, s0 + 7, 0.5f, 0.0f);
      NORMJIT_CU(cuMemsetD8(y.ptr, 0xff, y.bytes));  // poison: NaN in every dtype
      if (per_tensor) {
        util.run(quant_scale.get(), nj::DType::kF32, 1, s0 + 6, 0.0f, 1.0f);  // scale 1
        NORMJIT_CU(cuMemsetD8(amax.ptr, 0, 4));
      } else if (reads_scale) {
        util.run(quant_scale.get(), nj::DType::kF32, 1, s0 + 6, 0.0f, nvfp4_s_enc);
      }
      auto forward_args = [&](int set) {
        nj::LaunchArgs a;
        a.x = static_cast<char*>(x.get()) + size_t(set) * x_bytes;
        a.y = static_cast<char*>(y.get()) + size_t(set) * x_bytes;
        a.gamma = gamma.get();
        a.beta = spec.has_bias ? beta.get() : nullptr;
        a.mean = has_mean ? reinterpret_cast<float*>(mean.get()) + size_t(set) * rows : nullptr;
        a.rstd = training ? reinterpret_cast<float*>(rstd.get()) + size_t(set) * rows : nullptr;
        a.mask = bitmask ? reinterpret_cast<uint8_t*>(mask.get()) + size_t(set) * mask_bytes : nullptr;
        a.clip_lower = 0.f;
        a.clip_upper = 6.f;
        a.rows = rows;
        a.row_stride = n;
        a.rows_per_batch = rpb;
        a.eps = 1e-5f;
        if (residual_in.bytes) {
          a.residual = static_cast<char*>(residual_in.get()) + size_t(set) * r_bytes;
          a.h = static_cast<char*>(h_out.get()) + size_t(set) * r_bytes;
        }
        if (in_place && !backward) {
          a.y = const_cast<void*>(a.x);
          if (a.residual) a.h = const_cast<void*>(a.residual);
        }
        if (spec.bias_in && !backward) a.bias_in = bias_in.get();
        if (quant) {  // the codes in y's buffer; no y in x's dtype
          a.y_quant = a.y;
          a.y = nullptr;
          if (per_tensor) {
            a.quant_scale = static_cast<const float*>(quant_scale.get());
            a.amax = static_cast<float*>(amax.get());
          } else if (per_row) {
            a.row_scales = reinterpret_cast<float*>(row_scales.get()) + size_t(set) * rows;
          } else {
            a.block_scales = reinterpret_cast<uint8_t*>(block_scales.get()) + size_t(set) * rows * blocks_per_row;
            if (reads_scale) a.quant_scale = static_cast<const float*>(quant_scale.get());  // nvfp4's S_enc
          }
        }
        return a;
      };
      auto backward_args = [&](int set) {
        nj::LaunchArgs a = forward_args(set);
        nj::detail::set_backward_inputs(spec, a, beta.get(),
                                        from_y ? static_cast<char*>(y_in.get()) + size_t(set) * x_bytes : nullptr);
        a.dy = static_cast<char*>(dy.get()) + size_t(set) * x_bytes;
        a.dx = static_cast<char*>(y.get()) + size_t(set) * x_bytes;  // dx reuses y's buffers
        a.dgamma = dgamma.get();
        a.dbeta = spec.has_bias ? dbeta.get() : nullptr;
        a.workspace = workspace.get();
        a.workspace_bytes = workspace.bytes;
        a.residual = nullptr;
        a.h = nullptr;
        if (residual) a.dh_out = static_cast<char*>(dh_out.get()) + size_t(set) * r_bytes;
        if (stream_f32) {  // x is the forward's h, in fp32
          a.x = static_cast<char*>(h_out.get()) + size_t(set) * r_bytes;
          a.dresidual = static_cast<char*>(dresidual.get()) + size_t(set) * r_bytes;
        }
        return a;
      };
      auto launch = [&](int set, CUstream stream) {
        if (generic) rt.launch_generic(spec, backward ? backward_args(set) : forward_args(set), stream);
        else if (backward) kernel.launch(backward_args(set), stream);
        else kernel.launch(forward_args(set), stream);
      };
      nj::Spec bare = spec;  // a generic kernel has no block config
      bare.block.reset();
      const std::string label = generic ? "generic:" + bare.str() : spec.str();
      if (backward) {
        for (int set = 0; set < sets; ++set) forward.launch(forward_args(set));
        if (from_y) NORMJIT_CU(cuMemcpyDtoDAsync(y_in.ptr, y.ptr, y.bytes, nullptr));
        NORMJIT_CU(cuMemsetD8(y.ptr, 0xff, y.bytes));
      }
      std::unique_ptr<Stream> stream;
      Graph kernel_graph, copy_graph, same_bytes_graph;
      if (graph) {
        stream = std::make_unique<Stream>();
        const CUstream s = stream->stream;
        NORMJIT_CU(cuCtxSynchronize());  // fills and the backward's forward ran on the legacy stream
        kernel_graph.capture(s, sets, spec.str(), [&](int set) { launch(set, s); });
        copy_graph.capture(s, sets, "the copy baseline", [&](int set) {
          const size_t off = size_t(set) * x_bytes;
          NORMJIT_CU(cuMemcpyDtoDAsync(y.ptr + off, x.ptr + off, x_bytes, s));
        });
        same_bytes_graph.capture(s, sets, "the same-bytes copy", [&](int set) {
          const size_t off = size_t(set) * same_half;
          NORMJIT_CU(cuMemcpyDtoDAsync(same_dst.ptr + off, same_src.ptr + off, same_half, s));
        });
        // Poison what the graph writes, so each set's outputs must come from this one replay.
        if (!backward && training) NORMJIT_CU(cuMemsetD8(rstd.ptr, 0xff, rstd.bytes));
        if (!backward && has_mean) NORMJIT_CU(cuMemsetD8(mean.ptr, 0xff, mean.bytes));
        NORMJIT_CU(cuCtxSynchronize());
        kernel_graph.replay(s);
        NORMJIT_CU(cuStreamSynchronize(s));
      } else {
        launch(0, nullptr);
        NORMJIT_CU(cuCtxSynchronize());
      }

      // Sampled rows against the fp64 reference: y (forward) or dx (backward), and stats. Set 0
      // after one launch; --graph: rows spread over all K sets, first and last included.
      double worst = 0;  // max over checked elements of err / (atol + rtol |ref|)
      auto note = [&](double e) { worst = std::isnan(e) ? INFINITY : std::max(worst, e); };  // NaN fails
      if (!no_verify && !(in_place && !backward)) {
        const int64_t check = std::min<int64_t>(rows, verify_rows);
        std::vector<char> hx(n * xs), hout(n * xs), hdy(n * xs), hg(n * ws), hb(spec.has_bias ? n * ws : 0);
        std::vector<uint8_t> hmask(nj::mask_row_bytes(n));
        std::vector<char> hres(residual ? n * rs : 0), hh(residual ? n * rs : 0), hbias_in(spec.bias_in ? n * ws : 0);
        if (spec.bias_in) NORMJIT_CU(cuMemcpyDtoH(hbias_in.data(), bias_in.ptr, hbias_in.size()));
        const nj::reference::Tolerance tol =
            backward ? nj::reference::backward_tolerance(spec.x_dtype) : nj::reference::tolerance(spec.x_dtype);
        for (int64_t c = 0; c < check; ++c) {
          const int64_t r = check == 1 ? 0 : c * (rows - 1) / (check - 1);
          const int64_t set = !graph ? 0 : check == 1 ? sets - 1 : c * (sets - 1) / (check - 1);
          const int64_t w_row = ada ? r / rpb : 0;
          const size_t x_off = size_t(set) * x_bytes + size_t(r) * n * xs, stat_off = (size_t(set) * rows + r) * 4;
          NORMJIT_CU(cuMemcpyDtoH(hg.data(), gamma.ptr + w_row * n * ws, hg.size()));
          if (spec.has_bias) NORMJIT_CU(cuMemcpyDtoH(hb.data(), beta.ptr + w_row * n * ws, hb.size()));
          NORMJIT_CU(cuMemcpyDtoH(hx.data(), x.ptr + x_off, hx.size()));
          std::vector<char> hin = hx;  // what the kernel normalized: x, or h of a residual forward
          // Row r of a residual stream's tensor (x's dtype, or f32) in this set.
          const size_t r_off = size_t(set) * r_bytes + size_t(r) * n * rs;
          if (residual && (!backward || stream_f32)) {
            // h must be (x + bias_in) + residual in fp32, rounded once to the stream's dtype, bit for
            // bit; the reference normalizes it (the backward of an fp32 stream reads that h).
            NORMJIT_CU(cuMemcpyDtoH(hres.data(), residual_in.ptr + r_off, hres.size()));
            NORMJIT_CU(cuMemcpyDtoH(hh.data(), h_out.ptr + r_off, hh.size()));
            std::vector<char> sum(n * rs);
            for (int64_t i = 0; i < n; ++i) {
              float v = nj::reference::load(hx.data(), spec.x_dtype, i);
              if (spec.bias_in) v += nj::reference::load(hbias_in.data(), spec.w_dtype, i);
              nj::reference::store(sum.data(), stream_dtype, i, v + nj::reference::load(hres.data(), stream_dtype, i));
              if (std::memcmp(sum.data() + i * rs, hh.data() + i * rs, rs) != 0) note(INFINITY);
            }
            hin = sum;
          }
          NORMJIT_CU(cuMemcpyDtoH(hout.data(), y.ptr + x_off, hout.size()));
          float stat_mean = 0, stat_rstd = 0;
          if (training || backward) NORMJIT_CU(cuMemcpyDtoH(&stat_rstd, rstd.ptr + stat_off, 4));
          if (has_mean) NORMJIT_CU(cuMemcpyDtoH(&stat_mean, mean.ptr + stat_off, 4));
          if (bitmask)
            NORMJIT_CU(cuMemcpyDtoH(hmask.data(), mask.ptr + size_t(set) * mask_bytes + r * hmask.size(),
                                    hmask.size()));
          std::vector<double> want;
          if (backward) {
            NORMJIT_CU(cuMemcpyDtoH(hdy.data(), dy.ptr + x_off, hdy.size()));
            nj::Spec one = spec;
            one.norm = nj::base_norm(spec.norm);  // one row, its batch's weights
            if (from_y) {  // against the same math from the y it read (backward_from_y)
              std::vector<char> hy(n * xs);
              NORMJIT_CU(cuMemcpyDtoH(hy.data(), y_in.ptr + x_off, hy.size()));
              want = nj::reference::backward_from_y(one, hdy.data(), hy.data(), hg.data(),
                                                    spec.has_bias ? hb.data() : nullptr, &stat_rstd, 1, n)
                         .dx;
            } else {
              want = nj::reference::backward(one, hdy.data(), hin.data(), hg.data(),
                                             spec.has_bias ? hb.data() : nullptr, &stat_mean, &stat_rstd,
                                             hmask.data(), 1, n)
                         .dx;
            }
            if (residual) {
              NORMJIT_CU(cuMemcpyDtoH(hres.data(), dh_out.ptr + r_off, hres.size()));
              for (int64_t i = 0; i < n; ++i) want[i] += nj::reference::load(hres.data(), stream_dtype, i);
            }
            if (stream_f32) {  // dresidual: dh unrounded, within f32's backward tolerance
              std::vector<char> hdr(n * 4);
              NORMJIT_CU(cuMemcpyDtoH(hdr.data(), dresidual.ptr + r_off, hdr.size()));
              const nj::reference::Tolerance tf = nj::reference::backward_tolerance(nj::DType::kF32);
              for (int64_t i = 0; i < n; ++i)
                note(std::abs(nj::reference::load(hdr.data(), nj::DType::kF32, i) - want[i]) /
                     (tf.atol + tf.rtol * std::abs(want[i])));
            }
          } else {
            nj::Spec one = spec;
            one.norm = nj::base_norm(spec.norm);
            const auto ref = nj::reference::forward(one, hin.data(), hg.data(), spec.has_bias ? hb.data() : nullptr, 1,
                                                    n, 1e-5, 0, 0.0, 6.0);
            want = ref.y;
            if (training) note(std::abs(stat_rstd - ref.rstd[0]) / (1e-6 + 1e-4 * ref.rstd[0]));
            if (has_mean) note(std::abs(stat_mean - ref.mean[0]) / (1e-5 + 1e-4 * std::abs(ref.mean[0])));
          }
          if (!quant) {
            for (int64_t i = 0; i < n; ++i) {
              const double got = nj::reference::load(hout.data(), spec.x_dtype, i);
              note(std::abs(got - want[i]) / (tol.atol + tol.rtol * std::abs(want[i])));
            }
            continue;
          }
          // Quantized: the codes (row r of set's buffer, one byte each; e2m1: half a byte, low
          // nibble first) decoded and unscaled, within half a step of the format (plus the fp32
          // y's own error) of the fp64 y.
          std::vector<uint8_t> codes(n);
          if (fp4) {
            std::vector<uint8_t> packed(n / 2);
            NORMJIT_CU(cuMemcpyDtoH(packed.data(), y.ptr + size_t(set) * x_bytes + size_t(r) * (n / 2), n / 2));
            for (int64_t i = 0; i < n; ++i) codes[i] = (packed[i / 2] >> (i % 2 ? 4 : 0)) & 0xF;
          } else {
            NORMJIT_CU(cuMemcpyDtoH(codes.data(), y.ptr + size_t(set) * x_bytes + size_t(r) * n, n));
          }
          float dequant = 1.f;  // per tensor: the filled quant_scale is 1
          if (per_row) NORMJIT_CU(cuMemcpyDtoH(&dequant, row_scales.ptr + (size_t(set) * rows + r) * 4, 4));
          std::vector<uint8_t> scale_codes(per_block ? blocks_per_row : 0);
          if (per_block)
            NORMJIT_CU(cuMemcpyDtoH(scale_codes.data(), block_scales.ptr + (size_t(set) * rows + r) * blocks_per_row,
                                    scale_codes.size()));
          const bool int8 = spec.epilogue == nj::Epilogue::kInt8Row;
          const auto format = int8  ? nj::reference::MiniFloat::kE4M3  // unused for int8
                              : fp4 ? nj::reference::MiniFloat::kE2M1
                                    : nj::reference::fp8_element(spec.epilogue);
          const bool e5m2 = format == nj::reference::MiniFloat::kE5M2;
          const double half_step_rel = int8 ? 0.0 : fp4 ? 0.25 : e5m2 ? 0.125 : 0.0625;
          const int block = nj::scale_block_size(spec.epilogue);
          const nj::reference::Tolerance f32_tol = nj::reference::tolerance(nj::DType::kF32);
          for (int64_t i = 0; i < n; ++i) {
            if (per_block)
              dequant = spec.epilogue == nj::Epilogue::kNvfp4
                            ? static_cast<float>(nj::reference::decode(nj::reference::MiniFloat::kE4M3,
                                                                       scale_codes[i / block]) / nvfp4_s_enc)
                            : static_cast<float>(nj::reference::decode_e8m0(scale_codes[i / block]));
            const double half_step_abs =
                (int8 ? 0.5 : fp4 ? 0.25 : e5m2 ? std::ldexp(1.0, -17) : std::ldexp(1.0, -10)) * dequant;
            const double code_value = int8 ? static_cast<double>(static_cast<int8_t>(codes[i]))
                                           : nj::reference::decode(format, codes[i]);
            const double got = code_value * dequant;
            // FP8 saturates at its largest finite value times the scale (MXFP8: a block's amax / X
            // reaches up to 2^(emax + 1), past e4m3's 448).
            const double limit = int8 ? INFINITY : nj::reference::max_finite(format) * dequant;
            const double want_saturated = std::clamp(want[i], -limit, limit);
            note(std::abs(got - want_saturated) / (half_step_abs + half_step_rel * std::abs(want_saturated) + f32_tol.atol +
                                             f32_tol.rtol * std::abs(want_saturated)));
          }
        }
        if (!(worst <= 1.0)) all_ok = false;
      }

      const double us = time_median_us(warmup, reps, batch, [&](int i) { launch(i % sets, nullptr); });
      const double copy_us = time_median_us(warmup, reps, batch, [&](int i) {
        const size_t off = size_t(i % sets) * x_bytes;
        NORMJIT_CU(cuMemcpyDtoDAsync(y.ptr + off, x.ptr + off, x_bytes, nullptr));
      });
      const double gbps = bytes / us * 1e-3, copy_gbps = 2.0 * x_bytes / copy_us * 1e-3;
      nlohmann::json row{{"spec", label}, {"requested", requested.str()}, {"rows", rows}, {"n", n},
                         {"us", us}, {"bytes", bytes}, {"gbps", gbps}, {"copy_us", copy_us}, {"copy_gbps", copy_gbps},
                         {"pct_copy", 100.0 * gbps / copy_gbps}, {"verified", !no_verify && !(in_place && !backward)},
                         {"max_err_over_tol", worst}, {"first_get", first_get_kind}, {"first_get_ms", first_get_ms},
                         {"first_get_image_ms", image_ms}, {"first_get_module_ms", module_ms},
                         {"in_process_hit_ns", hit_ns}, {"buffer_sets", sets}};
      if (graph) {
        // `batch` replays of K launches per event pair; per-launch time = per-replay time / K.
        const CUstream s = stream->stream;
        const double graph_us =
            time_median_us(warmup, reps, batch, [&](int) { kernel_graph.replay(s); }, s) / sets;
        const double copy_graph_us =
            time_median_us(warmup, reps, batch, [&](int) { copy_graph.replay(s); }, s) / sets;
        const double same_bytes_us =
            time_median_us(warmup, reps, batch, [&](int) { same_bytes_graph.replay(s); }, s) / sets;
        const double g_gbps = bytes / graph_us * 1e-3, g_copy_gbps = 2.0 * x_bytes / copy_graph_us * 1e-3;
        std::printf("%-58s %8lld %5d %10.2f %10.2f %6.3f %10.2f %6.3f %9.1f %9.1f %6.1f%% %10.2f %9.3f %s %.2f ms\n",
                    label.c_str(), (long long)rows, sets, graph_us, copy_graph_us, graph_us / copy_graph_us,
                    same_bytes_us, graph_us / same_bytes_us, g_gbps, g_copy_gbps, 100.0 * g_gbps / g_copy_gbps, us,
                    worst, first_get_kind, first_get_ms);
        row["copy_same_bytes_graph_us"] = same_bytes_us;  // per copy of the launch's own bytes
        row["graph_ratio_same_bytes"] = graph_us / same_bytes_us;
        row["graph_us"] = graph_us;  // per launch
        row["copy_graph_us"] = copy_graph_us;  // per copy of M·N·itemsize bytes
        row["graph_ratio"] = graph_us / copy_graph_us;
        row["graph_gbps"] = g_gbps;
        row["copy_graph_gbps"] = g_copy_gbps;
        row["graph_pct_copy"] = 100.0 * g_gbps / g_copy_gbps;
        row["graph_launches"] = sets;  // K: launches (and copies) per graph, one per buffer set
        row["graph_replays_per_sample"] = batch;
        row["graph_samples"] = reps;
        // Bytes one replay moves over the L2 size: above 4 means the sets cannot stay in L2.
        row["graph_l2_multiple"] = bytes * sets / dev.l2_bytes;
        row["copy_graph_l2_multiple"] = 2.0 * x_bytes * sets / dev.l2_bytes;
        if (!no_verify) row["verified_by"] = "graph replay";  // rows spread over all K sets
      } else {
        std::printf("%-58s %8lld %10.2f %9.1f %9.1f %6.1f%% %9.3f %s %.2f ms\n", label.c_str(), (long long)rows,
                    us, gbps, copy_gbps, 100.0 * gbps / copy_gbps, worst, first_get_kind, first_get_ms);
      }
      if (launch_overhead && !backward) {
        // Host time to enqueue one launch: Kernel::launch (validation, context check, parameter
        // packing) against a raw cuLaunchKernel of the same function and parameters. 200 launches
        // per sample stay under the launch queue's depth, so the host never waits on the GPU.
        const nj::LaunchArgs a = forward_args(0);
        nj::Kernel::RawLaunch raw = kernel.raw_forward_launch(a);
        void* params[] = {raw.params.data()};
        // Raw and normjit samples alternate, so drift in clocks or queue state hits both alike.
        auto sample_us = [&](auto&& enqueue) {
          NORMJIT_CU(cuCtxSynchronize());
          const auto t0 = Clock::now();
          for (int i = 0; i < 200; ++i) enqueue();
          return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 200;
        };
        auto raw_launch = [&] {
          NORMJIT_CU(cuLaunchKernel(raw.function, raw.grid_x, 1, 1, raw.threads, 1, 1, raw.dynamic_smem_bytes, nullptr,
                                    params, nullptr));
        };
        auto normjit_launch = [&] { kernel.launch(a); };
        std::vector<double> raw_samples, normjit_samples;
        for (int rep = 0; rep < 21; ++rep) {
          raw_samples.push_back(sample_us(raw_launch));
          normjit_samples.push_back(sample_us(normjit_launch));
        }
        NORMJIT_CU(cuCtxSynchronize());
        const double raw_us = nj::detail::median_of(raw_samples);
        const double launch_us = nj::detail::median_of(normjit_samples);
        std::printf("  host launch: normjit %.3f us, raw cuLaunchKernel %.3f us (%.2fx); in-process get %.0f ns\n",
                    launch_us, raw_us, launch_us / raw_us, hit_ns);
        row["host_launch_us"] = launch_us;
        row["raw_launch_us"] = raw_us;
        row["host_launch_ratio"] = launch_us / raw_us;
      }
      std::fflush(stdout);
      return row;
    };

    if (first_call) {
      // A spec's first launch in this process, as the compile mode (NORMJIT_COMPILE_MODE) runs it:
      // the time until launch() returns and until its kernel has finished; async mode also the
      // time until the specialized kernel is ready, and the launch after that.
      std::printf("%-58s %8s %12s %12s %12s %12s\n", "spec", "mode", "return ms", "done ms", "ready ms", "next us");
      for (const std::string& text : spec_args) {
        const nj::Spec spec = nj::Spec::parse(text);
        if (spec.phase == nj::Phase::kBackward) {
          std::fprintf(stderr, "normjit-bench --first-call: %s: forward specs only\n", text.c_str());
          all_ok = false;
          continue;
        }
        const int64_t n = spec.n;
        const size_t x_bytes = size_t(rows) * n * nj::dtype_size(spec.x_dtype);
        const int64_t groups = 1;  // AdaLayerNorm: one batch of all rows
        DeviceBuffer x(x_bytes), y(x_bytes), gamma(groups * n * nj::dtype_size(spec.w_dtype)),
            beta(spec.has_bias ? groups * n * nj::dtype_size(spec.w_dtype) : 0), mean(rows * 4), rstd(rows * 4),
            mask(spec.epilogue == nj::Epilogue::kReluBitmask ? rows * nj::mask_row_bytes(n) : 0);
        util.run(x.get(), spec.x_dtype, (long long)(rows * n), seed, 2.0f, 0.5f);
        util.run(gamma.get(), spec.w_dtype, n, seed + 1, 0.5f, 1.0f);
        if (spec.has_bias) util.run(beta.get(), spec.w_dtype, n, seed + 2, 0.5f, 0.0f);
        NORMJIT_CU(cuCtxSynchronize());
        nj::LaunchArgs a;
        a.x = x.get();
        a.y = y.get();
        a.gamma = gamma.get();
        a.beta = spec.has_bias ? beta.get() : nullptr;
        const bool training = spec.phase == nj::Phase::kForwardTraining;
        a.mean = training && nj::subtracts_mean(spec.norm) ? reinterpret_cast<float*>(mean.get()) : nullptr;
        a.rstd = training ? reinterpret_cast<float*>(rstd.get()) : nullptr;
        a.mask = mask.bytes ? reinterpret_cast<uint8_t*>(mask.get()) : nullptr;
        a.rows = rows;
        a.row_stride = n;
        a.rows_per_batch = nj::is_adaptive(spec.norm) ? rows : 0;
        const auto t0 = Clock::now();
        rt.launch(spec, a);
        const double return_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        NORMJIT_CU(cuCtxSynchronize());
        const double done_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        double ready_ms = 0, next_us = 0;
        const bool async = rt.compile_mode() == nj::CompileMode::kAsync;
        if (async) {
          rt.wait_for_background_compiles();
          ready_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        }
        const auto t1 = Clock::now();
        rt.launch(spec, a);
        NORMJIT_CU(cuCtxSynchronize());
        next_us = std::chrono::duration<double, std::micro>(Clock::now() - t1).count();
        const nj::RuntimeCounters c = rt.counters();
        std::printf("%-58s %8s %12.3f %12.3f %12.1f %12.1f\n", spec.str().c_str(), nj::to_string(rt.compile_mode()),
                    return_ms, done_ms, ready_ms, next_us);
        results.push_back({{"spec", spec.str()}, {"rows", rows}, {"mode", nj::to_string(rt.compile_mode())},
                           {"first_launch_return_ms", return_ms}, {"first_launch_done_ms", done_ms},
                           {"specialized_ready_ms", ready_ms}, {"next_launch_us", next_us},
                           {"generic_launches", c.generic_launches}, {"background_compiles", c.background_compiles},
                           {"compiles", c.compiles}});
      }
    } else if (!tune) {
      for (size_t si = 0; si < spec_args.size(); ++si) results.push_back(measure(spec_args[si], si));
    } else {
      // Tuning: per spec, the heuristic's config and then the other candidates, nearest first,
      // until the budget is spent; the fastest verified one wins. The heuristic is a candidate, so
      // the winner is never slower than it in this measurement.
      nj::TuningDb db;
      if (!tuning_db_path.empty() && std::filesystem::exists(tuning_db_path)) db = nj::TuningDb::load(tuning_db_path);
      std::printf("\n");
      size_t si = 0;
      std::vector<std::string> summary;
      const auto with = [](const nj::Spec& base, const nj::BlockConfig& b) {
        nj::Spec s = base;
        s.block = b;
        return s;
      };
      for (const std::string& text : spec_args) {
        nj::Spec base = nj::Spec::parse(text);
        base.block.reset();
        // A timed candidate's row; tuning_candidate is its index among this spec's timed ones.
        const size_t first_row = results.size();
        const nj::CandidateSearch found = nj::search_candidates(
            nj::candidate_configs(base, rt.target().arch, 16, max_candidates), budget_s,
            [&](const nj::BlockConfig& b) { return rt.get(with(base, b)).local_memory_bytes(); },
            [&](const nj::BlockConfig& b) {
              nlohmann::json row = measure(with(base, b).str(), si++);
              const bool ok = no_verify || row["max_err_over_tol"].get<double>() <= 1.0;
              const double us = row["us"].get<double>();
              row["tuning_candidate"] = static_cast<int>(results.size() - first_row);
              results.push_back(row);
              return nj::CandidateTime{us, ok};
            },
            [&](const nj::BlockConfig& b, const char* what, const std::string& why) {
              std::fprintf(stderr, "normjit-tune: %s %s: %s\n", what, with(base, b).str().c_str(), why.c_str());
            });
        if (!found.best) {
          std::fprintf(stderr, "normjit-tune: no verified candidate for %s\n", base.str().c_str());
          all_ok = false;
          continue;
        }
        const nj::BlockConfig best = *found.best;
        const double heuristic_us = found.heuristic_us, best_us = found.best_us;
        nj::TuningEntry entry;
        entry.config = best;
        entry.us = best_us;
        entry.heuristic_us = heuristic_us;
        entry.rows = rows;
        db.record(rt.tuning_key(base), entry);
        const nj::Spec won = with(base, best);
        char line[512];
        std::snprintf(line, sizeof(line), "%-58s %10.2f %10.2f %7.3fx  %3d timed %2d skipped %2d pruned  %s",
                      base.str().c_str(), heuristic_us, best_us, heuristic_us / best_us, found.timed, found.skipped,
                      found.pruned, won.str().substr(won.str().find(".cfg_") + 5).c_str());
        summary.push_back(line);
      }
      std::printf("\n%-58s %10s %10s %8s\n", "spec", "heur. us", "tuned us", "speedup");
      for (const auto& line : summary) std::printf("%s\n", line.c_str());
      if (!tuning_db_path.empty()) {
        // A database that cannot be saved fails the run, after the JSON below is still written.
        try {
          db.save(tuning_db_path);
          std::fprintf(stderr, "normjit-tune: %zu entries in %s\n", db.size(), tuning_db_path.c_str());
        } catch (const nj::Error& e) {
          std::fprintf(stderr, "%s: error: --tuning-db: %s\n", kTool, e.what());
          output_failed = true;
        }
      }
    }
    if (!json_path.empty()) {
      nlohmann::json doc{{"device", dev.name}, {"sm", rt.target().str()}, {"sm_count", dev.sm_count},
                         {"driver", dev.driver_version}, {"nvrtc", nj::nvrtc_version()}, {"seed", seed},
                         {"results", results}};
      if (const std::string why = nj::tools::write_output(json_path, doc.dump(2) + "\n"); !why.empty()) {
        std::fprintf(stderr, "%s: error: --json: %s\n", kTool, why.c_str());
        output_failed = true;
      }
    }
    if (!all_ok) std::fprintf(stderr, "%s: verification FAILED (max_err/tol > 1) for at least one spec\n", kTool);
    return all_ok && !output_failed ? 0 : 1;
  } catch (const nj::Error& e) {
    std::fprintf(stderr, "%s: %s\n", kTool, e.what());
    return 2;
  }
}
