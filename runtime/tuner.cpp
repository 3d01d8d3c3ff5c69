// Tuning on a miss (NORMJIT_TUNING=tune): the spec's candidate block configs are timed on scratch
// buffers of random data, the fastest is recorded in the tuning database and used from then on.
#include <sys/file.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "normjit/compiler.hpp"
#include "normjit/driver.hpp"
#include "normjit/error.hpp"
#include "normjit/runtime.hpp"
#include "runtime/device_scratch.hpp"
#include "runtime/log.hpp"

namespace normjit {
namespace {

int64_t env_int(const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (*end != '\0' || n < lo || n > hi)
    throw Error(Status::kInvalidArgument, std::string(name) + "='" + v + "' must be an integer in [" +
                                              std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return n;
}

// A number of seconds >= 0. from_chars: a host program's locale cannot change what "0.5" means.
double env_seconds(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  double s = 0;
  const char* last = v + std::strlen(v);
  const auto [end, ec] = std::from_chars(v, last, s);
  if (ec != std::errc() || end != last || !std::isfinite(s) || s < 0)
    throw Error(Status::kInvalidArgument, std::string(name) + "='" + v + "' must be a number of seconds >= 0");
  return s;
}

}  // namespace

CandidateSearch search_candidates(const std::vector<BlockConfig>& candidates, double budget_s,
                                  const std::function<int(const BlockConfig&)>& local_memory_bytes,
                                  const std::function<CandidateTime(const BlockConfig&)>& time_us,
                                  const std::function<void(const BlockConfig&, const char* what,
                                                           const std::string& why)>& note) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  CandidateSearch r;
  for (size_t c = 0; c < candidates.size(); ++c) {
    const BlockConfig& b = candidates[c];
    // The first timed candidate runs whatever the budget, so there is always a baseline.
    if (r.timed > 0 && budget_s > 0 && std::chrono::duration<double>(Clock::now() - t0).count() > budget_s) {
      r.dropped = static_cast<int>(candidates.size() - c);
      break;
    }
    CandidateTime t;
    try {
      // Pruned without timing: a candidate that spills (the first timed one, the baseline, is timed).
      if (r.timed > 0) {
        if (const int local = local_memory_bytes(b); local > 0) {
          note(b, "pruned", std::to_string(local) + " bytes of local memory per thread");
          ++r.pruned;
          continue;
        }
      }
      t = time_us(b);
    } catch (const Error& e) {  // e.g. more shared memory than this device has
      note(b, "skipping", e.what());
      ++r.skipped;
      continue;
    }
    // Unverified, it still counts as timed, and its time is the heuristic's if it is the first.
    if (r.timed++ == 0) r.heuristic_us = t.us;
    if (t.verified && (!r.best || t.us < r.best_us)) {
      r.best_us = t.us;
      r.best = b;
    }
  }
  return r;
}

Spec Runtime::tune_on_miss(const Spec& requested) {
  Spec spec = requested;
  spec.block.reset();
  const int64_t n = spec.n;
  // About 2^25 elements per buffer: past the L2 of current GPUs, and a few ms per candidate.
  const int64_t rows = env_int("NORMJIT_TUNE_ROWS", std::clamp<int64_t>((int64_t(1) << 25) / n, 1, 65536), 1,
                               int64_t(1) << 24);
  const size_t limit = static_cast<size_t>(env_int("NORMJIT_TUNE_CANDIDATES", 8, 1, 256));
  const double budget_s = env_seconds("NORMJIT_TUNE_BUDGET_S", 0);
  const bool backward = spec.phase == Phase::kBackward;
  const bool ada = is_adaptive(spec.norm);
  const int xs = dtype_size(spec.x_dtype), ws = dtype_size(spec.w_dtype);
  const size_t x_bytes = size_t(rows) * n * xs;
  // The residual stream's tensors (residual, h, dh_out, dresidual): x's dtype, or f32 (residual_f32).
  const size_t r_bytes = size_t(rows) * n * dtype_size(row_dtype(spec));
  Spec fwd = spec;
  fwd.phase = Phase::kForwardTraining;
  // A residual backward's x is h: its statistics come from the plain forward. An fp32 stream's
  // backward reads h in fp32: the residual forward writes it (and its statistics).
  fwd.residual = spec.residual_f32;
  fwd.bias_in = false;
  fwd.memory_efficient = false;
  const std::vector<BlockConfig> candidates = candidate_configs(spec, target_.arch, 16, limit);
  // NORMJIT_TUNE_BATCH=1: the candidates neither loaded nor on disk compile together, in one NVRTC
  // program (each entry then holds the batch's image; docs/cache.md, "Batched compiles"), and are
  // loaded from it. Off by default, as normjit-precompile --batch is: modules of a batch's kernels
  // have not been timed on a GPU. Not under a time budget, which may drop candidates never
  // compiled. A batch that fails, or a candidate that does not load, is left to get() below,
  // which compiles it alone or reports it.
  const bool batch = env_int("NORMJIT_TUNE_BATCH", 0, 0, 1) == 1;
  if (batch && budget_s == 0 && candidates.size() > 1) {
    std::vector<Spec> cold;
    for (const BlockConfig& b : candidates) {
      Spec s = spec;
      s.block = b;
      if (!is_loaded(s) && !disk_cache_.has_entry(s, target_)) cold.push_back(s);
    }
    if (cold.size() > 1) {
      std::vector<DiskCache::Lookup> found;
      try {
        found = disk_cache_.lookup_batch(cold, target_);
      } catch (const Error& e) {
        detail::log().debug("tuning {}: batched compile of {} candidates failed ({}); compiling each alone",
                            spec.str(), cold.size(), e.what());
      }
      for (size_t k = 0; k < found.size(); ++k) {
        try {
          (void)get_resolved(cold[k], &found[k]);
        } catch (const Error&) {
        }
      }
    }
  }
  size_t workspace = 0;
  for (const BlockConfig& b : candidates) {
    Spec s = spec;
    s.block = b;
    if (backward) workspace = std::max(workspace, get(s).workspace_bytes(rows, ada ? rows : 0));
  }

  NORMJIT_CU(cuCtxSetCurrent(context_));
  using detail::DeviceBuffer;
  DeviceBuffer x(x_bytes), y(x_bytes), dy(backward ? x_bytes : 0), gamma(n * ws), beta(n * ws), mean(rows * 4),
      rstd(rows * 4), mask(size_t(rows) * mask_row_bytes(n)), dgamma(n * ws), dbeta(n * ws), work(workspace),
      residual(spec.residual ? r_bytes : 0), h(spec.residual && (!backward || spec.residual_f32) ? r_bytes : 0),
      dresidual(backward && spec.residual_f32 ? r_bytes : 0), bias_in(spec.bias_in ? n * ws : 0),
      quant_scale(reads_quant_scale(spec.epilogue) ? 4 : 0), amax(scales_per_tensor(spec.epilogue) ? 4 : 0),
      row_scales(scales_per_row(spec.epilogue) ? rows * 4 : 0),
      block_scales(rows * block_scale_row_bytes(n, spec.epilogue));
  {
    const detail::FillKernels fill(target_, device_.sm_count);
    const unsigned seed = static_cast<unsigned>(n * 7919 + static_cast<int>(spec.phase));
    fill.run(x.get(), spec.x_dtype, rows * n, seed, 2.0f, 0.5f);
    fill.run(gamma.get(), spec.w_dtype, n, seed + 1, 0.5f, 1.0f);
    fill.run(beta.get(), spec.w_dtype, n, seed + 2, 0.5f, 0.0f);
    if (backward) fill.run(dy.get(), spec.x_dtype, rows * n, seed + 3, 1.0f, 0.0f);
    if (spec.residual) fill.run(residual.get(), row_dtype(spec), rows * n, seed + 4, 1.0f, 0.0f);
    if (spec.bias_in) fill.run(bias_in.get(), spec.w_dtype, n, seed + 6, 0.5f, 0.0f);
    if (reads_quant_scale(spec.epilogue))
      fill.run(quant_scale.get(), DType::kF32, 1, seed + 5, 0.0f, 1.0f);  // scale 1
    if (scales_per_tensor(spec.epilogue)) NORMJIT_CU(cuMemsetD8(amax.ptr, 0, 4));
    NORMJIT_CU(cuCtxSynchronize());  // the fills finish before their module is unloaded
  }
  LaunchArgs a;
  a.x = x.get();
  a.y = y.get();
  a.gamma = gamma.get();
  a.beta = spec.has_bias ? beta.get() : nullptr;
  a.mean = subtracts_mean(spec.norm) && spec.phase != Phase::kForwardInference ? static_cast<float*>(mean.get()) : nullptr;
  a.rstd = spec.phase != Phase::kForwardInference ? static_cast<float*>(rstd.get()) : nullptr;
  a.mask = spec.epilogue == Epilogue::kReluBitmask ? static_cast<unsigned char*>(mask.get()) : nullptr;
  a.rows = rows;
  a.row_stride = n;
  a.rows_per_batch = ada ? rows : 0;
  a.eps = 1e-5f;
  a.clip_lower = 0.f;
  a.clip_upper = 6.f;
  if (spec.residual && !backward) {
    a.residual = residual.get();
    a.h = h.get();
    if (spec.bias_in) a.bias_in = bias_in.get();
  }
  if (quantizes(spec.epilogue)) {  // the codes in y's buffer; no y in x's dtype
    a.y_quant = y.get();
    a.y = nullptr;
    if (scales_per_tensor(spec.epilogue)) {
      a.quant_scale = static_cast<const float*>(quant_scale.get());
      a.amax = static_cast<float*>(amax.get());
    } else if (scales_per_row(spec.epilogue)) {
      a.row_scales = static_cast<float*>(row_scales.get());
    } else {
      a.block_scales = static_cast<uint8_t*>(block_scales.get());
      if (reads_quant_scale(spec.epilogue)) a.quant_scale = static_cast<const float*>(quant_scale.get());  // nvfp4
    }
  }
  if (backward) {
    LaunchArgs f = a;
    f.mean = subtracts_mean(spec.norm) ? static_cast<float*>(mean.get()) : nullptr;
    f.rstd = static_cast<float*>(rstd.get());
    if (fwd.residual) {  // an fp32 stream: h, the backward's x, from x + residual
      f.residual = residual.get();
      f.h = h.get();
    }
    get(fwd).launch(f);  // the statistics (and mask) the backward reads
    a.mean = f.mean;
    // A memory_efficient backward reads the forward's y, moved into x's buffer (dx takes y's).
    if (spec.memory_efficient) NORMJIT_CU(cuMemcpyDtoDAsync(x.ptr, y.ptr, x_bytes, nullptr));
    detail::set_backward_inputs(spec, a, beta.get(), x.get());
    a.rstd = f.rstd;
    a.dy = dy.get();
    a.dx = y.get();
    a.dgamma = dgamma.get();
    a.dbeta = spec.has_bias ? dbeta.get() : nullptr;
    a.workspace = work.get();
    a.workspace_bytes = workspace;
    if (spec.residual) a.dh_out = residual.get();
    if (spec.residual_f32) {
      a.x = h.get();
      a.dresidual = dresidual.get();
    }
  }

  const auto with = [&](const BlockConfig& b) {
    Spec s = spec;
    s.block = b;
    return s;
  };
  const CandidateSearch found = search_candidates(
      candidates, budget_s,
      [&](const BlockConfig& b) {
        // A capped kernel's allowed spill (GeneratedSource::spill_allowance_bytes) is not pruned.
        const int local = get(with(b)).local_memory_bytes();
        return local > spill_allowance_bytes(with(b)) ? local : 0;
      },
      [&](const BlockConfig& b) {
        const Kernel& k = get(with(b));
        // Median of 7 batches of 5 launches after 5 warm-up launches.
        return CandidateTime{detail::time_median_us(5, 7, 5, [&](int) { k.launch(a); })};
      },
      [&](const BlockConfig& b, const char* what, const std::string& why) {
        detail::log().info("tuning {}: {} {}: {}", spec.str(), what, with(b).str(), why);
      });
  if (!found.best) throw Error(Status::kNotSupported, "tuning " + spec.str() + ": no candidate ran");
  if (found.dropped > 0)
    detail::log().info("tuning {}: NORMJIT_TUNE_BUDGET_S={} spent, {} candidates not timed", spec.str(), budget_s,
                       found.dropped);
  const BlockConfig best = *found.best;
  const double best_us = found.best_us, heuristic_us = found.heuristic_us;

  TuningEntry entry;
  entry.config = best;
  entry.us = best_us;
  entry.heuristic_us = heuristic_us;
  entry.rows = rows;
  const TuningKey key = tuning_key(spec);
  {
    std::lock_guard<std::mutex> lock(tuning_mutex_);
    tuning_db_.record(key, entry);
    // Merged into the file under a lock, so concurrent processes keep each other's winners.
    const std::string lock_path = tuning_db_path_.string() + ".lock";
    const int fd = tuning_db_path_.empty() ? -1 : ::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (tuning_db_path_.empty()) {
      detail::log().warn("tuned {} kept in memory only: the cache directory is not usable and NORMJIT_TUNING_DB is unset",
                         spec.str());
    } else if (fd >= 0 && ::flock(fd, LOCK_EX) == 0) {
      try {
        std::error_code ec;
        if (std::filesystem::exists(tuning_db_path_, ec)) tuning_db_.merge(TuningDb::load(tuning_db_path_.string()));
        tuning_db_.save(tuning_db_path_.string());
      } catch (const Error& e) {
        detail::log().warn("tuning database {} not updated: {}", tuning_db_path_.string(), e.what());
      }
    } else {
      detail::log().warn("tuning database {} not updated: cannot lock {}", tuning_db_path_.string(), lock_path);
    }
    if (fd >= 0) ::close(fd);
  }
  Spec tuned = spec;
  tuned.block = best;
  detail::log().info("tuned {}: {} ({:.2f} us; heuristic {:.2f} us)", spec.str(), tuned.str(), best_us, heuristic_us);
  return tuned;
}

}  // namespace normjit
