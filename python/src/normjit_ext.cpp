// normjit._normjit: the C++ API (include/normjit/) for Python. Kernel.launch is the hot path of
// normjit.torch: pointers and the stream arrive as ints, nothing is allocated or parsed, and the
// GIL is released around the launch.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <thread>

#include "normjit/normjit.hpp"
#include "normjit/quant_reference.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using normjit::Error;
using normjit::Spec;
using normjit::Status;

// normjit.Error and one subclass per Status; set up in the module init.
PyObject* g_error = nullptr;
PyObject* g_status_error[7] = {};

PyObject* new_exception(nb::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string qualified = std::string("normjit.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (!type) throw nb::python_error();
  m.attr(name) = nb::handle(type);
  return type;
}

PyObject* exception_for(Status s) {
  const int i = static_cast<int>(s);
  return i >= 0 && i < 7 && g_status_error[i] ? g_status_error[i] : g_error;
}

Spec spec_from(nb::handle h) {
  if (nb::isinstance<Spec>(h)) return nb::cast<Spec>(h);
  if (nb::isinstance<nb::str>(h)) return Spec::parse(nb::cast<std::string>(h));
  throw Error(Status::kInvalidArgument,
              "spec=" + nb::cast<std::string>(nb::repr(h)) + " is neither a normjit.Spec nor a spec string");
}

std::string block_string(const Spec& s) {
  if (!s.block) return {};
  const std::string text = s.str();
  return text.substr(text.find(".cfg_") + 1);
}

// Over the fields operator== compares; building the string would cost more than a dict lookup.
size_t spec_hash(const Spec& s) {
  size_t h = 0;
  auto mix = [&h](int64_t v) { h = (h ^ static_cast<size_t>(v)) * 0x100000001b3ull; };
  for (int64_t v : {int64_t(s.norm), int64_t(s.phase), int64_t(s.x_dtype), int64_t(s.w_dtype), s.n,
                    int64_t(s.has_bias), int64_t(s.epilogue), int64_t(s.zero_centered), int64_t(s.residual),
                    int64_t(s.residual_f32), int64_t(s.bias_in), int64_t(s.memory_efficient)})
    mix(v);
  if (const auto& b = s.block)
    for (int v : {b->threads_per_row, b->rows_per_cta, b->vec, int(b->cache), b->cluster, b->stages, int(b->bulk_copy),
                  int(b->producer_warp)})
      mix(v);
  return h;
}

const char* tuning_mode_name(normjit::TuningMode m) {
  switch (m) {
    case normjit::TuningMode::kHeuristic: return "heuristic";
    case normjit::TuningMode::kDatabase: return "db";
    case normjit::TuningMode::kTuneOnMiss: return "tune";
  }
  return "unknown";
}

// As Runtime's constructor finds it: NORMJIT_TUNING_DB, else tuning.json in the cache directory.
std::filesystem::path tuning_db_path(const std::optional<std::string>& cache_dir) {
  if (const char* p = std::getenv("NORMJIT_TUNING_DB"); p && *p) return p;
  return (cache_dir && !cache_dir->empty() ? std::filesystem::path(*cache_dir) : normjit::DiskCache::default_dir()) /
         "tuning.json";
}

// The pointers of a LaunchArgs, as ints from Python.
normjit::LaunchArgs pointer_args(uintptr_t x, uintptr_t gamma, uintptr_t beta, uintptr_t y, uintptr_t dy,
                                 uintptr_t dx, uintptr_t dgamma, uintptr_t dbeta, uintptr_t mask) {
  normjit::LaunchArgs a;
  a.x = reinterpret_cast<const void*>(x);
  a.gamma = reinterpret_cast<const void*>(gamma);
  a.beta = reinterpret_cast<const void*>(beta);
  a.y = reinterpret_cast<void*>(y);
  a.dy = reinterpret_cast<const void*>(dy);
  a.dx = reinterpret_cast<void*>(dx);
  a.dgamma = reinterpret_cast<void*>(dgamma);
  a.dbeta = reinterpret_cast<void*>(dbeta);
  a.mask = reinterpret_cast<uint8_t*>(mask);
  return a;
}

// Compiles specs into a disk cache in `jobs` threads, as normjit-precompile does. Every per-spec
// failure (a spec that does not parse or resolve, a compile error) is returned in "errors", so one
// bad entry does not hide the others; a bad arch or jobs raises.
nb::dict precompile(nb::iterable specs, const std::string& arch, std::optional<std::string> cache_dir, int jobs,
                    nb::object progress, int batch) {
  if (jobs < 0) throw Error(Status::kInvalidArgument, "jobs=" + std::to_string(jobs) + " is negative");
  if (batch < 1 || batch > 64)
    throw Error(Status::kInvalidArgument, "batch=" + std::to_string(batch) + " is not in [1, 64]");
  const normjit::Target target = normjit::Target::parse(arch);
  struct Job {
    std::string text;  // the spec as given, then resolved
    std::optional<Spec> spec;
    bool cached = false;
    bool stored = false;
    std::string not_stored_why;
    std::string error;
  };
  std::vector<Job> work;
  for (nb::handle h : specs) {
    Job job;
    try {
      job.text = nb::isinstance<Spec>(h) ? nb::cast<Spec>(h).str() : nb::cast<std::string>(nb::str(h));
      job.spec = normjit::resolve(spec_from(h), 16, target.arch);
      job.text = job.spec->str();
    } catch (const Error& e) {
      job.error = e.what();
    }
    work.push_back(std::move(job));
  }
  // As normjit-precompile: NORMJIT_BUNDLE is not consulted, since a kernel found there is not stored.
  normjit::DiskCacheOptions options = normjit::DiskCacheOptions::from_env();
  options.bundle.clear();
  normjit::DiskCache cache(cache_dir.value_or(""), options);
  const size_t total = work.size();
  const unsigned threads_wanted =
      jobs > 0 ? static_cast<unsigned>(jobs) : std::max(1u, std::thread::hardware_concurrency());

  // Units of work, as normjit-precompile --batch groups them: up to `batch` specs of one phase in
  // one NVRTC program (DiskCache::lookup_batch); a spec that did not parse is a unit of its own.
  std::vector<std::string> keys;
  for (const auto& job : work)
    keys.push_back(!job.spec ? "" : job.spec->phase == normjit::Phase::kBackward ? "bwd" : "fwd");
  const std::vector<std::vector<size_t>> units =
      normjit::compile_batch_groups(keys, static_cast<size_t>(batch));
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mutex;
  std::condition_variable finished;
  size_t done = 0;
  auto record = [](Job& job, const normjit::DiskCache::Lookup& r) {
    job.cached = r.source != normjit::DiskCache::Lookup::Source::kCompiled;
    job.stored = r.on_disk;
    job.not_stored_why = r.not_stored_why;
  };
  auto alone = [&](Job& job) {
    if (!job.spec) return;
    try {
      record(job, cache.lookup(*job.spec, target));
    } catch (const std::exception& e) {
      job.error = e.what();
    }
  };
  auto worker = [&] {
    for (size_t u; !stop && (u = next++) < units.size();) {
      const std::vector<size_t>& unit = units[u];
      if (unit.size() == 1) {
        alone(work[unit[0]]);
      } else {
        std::vector<Spec> group;
        for (size_t i : unit) group.push_back(*work[i].spec);
        try {
          const std::vector<normjit::DiskCache::Lookup> found = cache.lookup_batch(group, target);
          for (size_t k = 0; k < unit.size(); ++k) record(work[unit[k]], found[k]);
        } catch (const std::exception&) {
          for (size_t i : unit) alone(work[i]);  // each failure then names its spec
        }
      }
      std::lock_guard<std::mutex> lock(mutex);
      done += unit.size();
      finished.notify_one();
    }
  };
  std::vector<std::thread> threads;
  {
    nb::gil_scoped_release release;
    for (unsigned t = 0; t < std::min<size_t>(threads_wanted, units.size()); ++t) threads.emplace_back(worker);
  }
  // This thread waits without the GIL and takes it back to report progress and to see Ctrl-C.
  size_t reported = 0;
  std::optional<nb::python_error> failure;
  while (reported < total && !failure) {
    size_t now;
    {
      nb::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(mutex);
      finished.wait_for(lock, std::chrono::milliseconds(100), [&] { return done > reported; });
      now = done;
    }
    try {
      if (PyErr_CheckSignals() != 0) throw nb::python_error();
      if (now > reported && progress.is_valid() && !progress.is_none()) progress(now, total);
    } catch (nb::python_error& e) {
      failure.emplace(std::move(e));
    }
    reported = now;
  }
  stop = true;
  {
    nb::gil_scoped_release release;
    for (auto& t : threads) t.join();
  }
  if (failure) throw std::move(*failure);

  size_t compiled = 0, cached = 0, failed = 0, not_stored = 0;
  std::string first_not_stored_why;
  nb::list errors;
  for (const Job& j : work) {
    if (j.error.empty() && j.spec && !j.stored && not_stored++ == 0) first_not_stored_why = j.not_stored_why;
    if (!j.error.empty()) {
      ++failed;
      errors.append(nb::make_tuple(j.text, j.error));
    } else if (j.cached) {
      ++cached;
    } else {
      ++compiled;
    }
  }
  nb::dict result;
  result["compiled"] = compiled;
  result["cached"] = cached;
  result["failed"] = failed;
  result["errors"] = errors;
  result["cache_dir"] = cache.dir().string();
  // Filling the cache is the whole job: kernels compiled only into memory are a failure.
  if (not_stored)
    throw Error(Status::kCacheError, std::to_string(not_stored) + " of " + std::to_string(total) +
                                         " kernel(s) could not be stored in cache " + cache.dir().string() + ": " +
                                         (first_not_stored_why.empty() ? "(no reason recorded)" : first_not_stored_why));
  return result;
}


// Kernel.launch and ModeLauncher.launch: the same arguments, run(target, args, stream) with them.
template <class Target, class Run>
void def_launch(nb::class_<Target>& cls, Run run) {
  cls.def("launch",
           [run](const Target& target, uintptr_t x, uintptr_t gamma, uintptr_t beta, uintptr_t mean, uintptr_t rstd,
              uintptr_t y, uintptr_t dy, uintptr_t dx, uintptr_t dgamma, uintptr_t dbeta, uintptr_t workspace,
              size_t workspace_bytes, uintptr_t mask, float clip_lower, float clip_upper, int64_t rows,
              int64_t row_stride, int64_t rows_per_batch, float eps, uintptr_t stream, uintptr_t residual,
              uintptr_t h, uintptr_t dh_out, uintptr_t y_quant, uintptr_t quant_scale, uintptr_t amax,
              uintptr_t row_scales, uintptr_t block_scales, int block_scale_layout, uintptr_t dresidual,
              uintptr_t bias_in) {
             normjit::LaunchArgs a = pointer_args(x, gamma, beta, y, dy, dx, dgamma, dbeta, mask);
             a.dresidual = reinterpret_cast<void*>(dresidual);
             a.bias_in = reinterpret_cast<const void*>(bias_in);
             a.block_scale_layout = static_cast<normjit::BlockScaleLayout>(block_scale_layout);
             a.residual = reinterpret_cast<const void*>(residual);
             a.h = reinterpret_cast<void*>(h);
             a.dh_out = reinterpret_cast<const void*>(dh_out);
             a.y_quant = reinterpret_cast<void*>(y_quant);
             a.quant_scale = reinterpret_cast<const float*>(quant_scale);
             a.amax = reinterpret_cast<float*>(amax);
             a.row_scales = reinterpret_cast<float*>(row_scales);
             a.block_scales = reinterpret_cast<uint8_t*>(block_scales);
             a.mean = reinterpret_cast<float*>(mean);
             a.rstd = reinterpret_cast<float*>(rstd);
             a.workspace = reinterpret_cast<void*>(workspace);
             a.workspace_bytes = workspace_bytes;
             a.clip_lower = clip_lower;
             a.clip_upper = clip_upper;
             a.rows = rows;
             a.row_stride = row_stride;
             a.rows_per_batch = rows_per_batch;
             a.eps = eps;
             run(target, a, reinterpret_cast<CUstream>(stream));
           },
           "x"_a, "gamma"_a, "beta"_a, "mean"_a, "rstd"_a, "y"_a, "dy"_a, "dx"_a, "dgamma"_a, "dbeta"_a,
           "workspace"_a, "workspace_bytes"_a, "mask"_a, "clip_lower"_a, "clip_upper"_a, "rows"_a, "row_stride"_a,
           "rows_per_batch"_a, "eps"_a, "stream"_a, "residual"_a = 0, "h"_a = 0, "dh_out"_a = 0, "y_quant"_a = 0,
           "quant_scale"_a = 0, "amax"_a = 0, "row_scales"_a = 0, "block_scales"_a = 0, "block_scale_layout"_a = 0,
           "dresidual"_a = 0, "bias_in"_a = 0, nb::call_guard<nb::gil_scoped_release>(),
           "Launches on `stream` (0: the legacy default stream). Arguments: x, gamma, beta, mean, rstd, y, dy, dx, "
           "dgamma, dbeta, workspace, workspace_bytes, mask, clip_lower, clip_upper, rows, row_stride, "
           "rows_per_batch, eps, stream, then residual, h, dh_out (residual specs) and y_quant, quant_scale, amax "
           "(fp8_e4m3 / fp8_e5m2 specs) or y_quant, row_scales (*_row specs) or y_quant, block_scales (mxfp8_*, "
           "mxfp4 specs; nvfp4: with quant_scale, its S_enc), then block_scale_layout (0 row-major, 1 the GEMMs' "
           "swizzled 128x4 tiles), then dresidual (residual_f32 backward) and bias_in (bias_in forward); pointers "
           "as ints, 0 where unused.");
}

// Launches of one spec through its runtime's compile mode (Runtime::launch, Runtime::workspace_bytes):
// what normjit.torch and normjit.launch use in async and generic modes, where the kernel that runs
// changes from the generic one to the specialized one once that is compiled.
struct ModeLauncher {
  normjit::Runtime* runtime;
  Spec spec;
  int max_vec;
};
}  // namespace

NB_MODULE(_normjit, m) {
  m.doc() = "normjit's C++ API: specs, runtimes, kernels, the disk cache (see the normjit package).";
  // Runtimes held in module-level caches (normjit.torch) live until exit; that is not a leak.
  nb::set_leak_warnings(false);

  // Exceptions: normjit.Error, and per Status a subclass; argument and spec errors are ValueErrors too.
  g_error = new_exception(m, "Error", PyExc_RuntimeError, "Every error normjit raises; the message is the C++ one.");
  auto sub = [&](Status s, const char* name, PyObject* also, const char* doc) {
    nb::object bases = also ? nb::make_tuple(nb::handle(g_error), nb::handle(also)) : nb::make_tuple(nb::handle(g_error));
    g_status_error[static_cast<int>(s)] = new_exception(m, name, bases.ptr(), doc);
  };
  sub(Status::kInvalidArgument, "InvalidArgumentError", PyExc_ValueError, "An argument is wrong; the message names it.");
  sub(Status::kInvalidSpec, "InvalidSpecError", PyExc_ValueError, "A spec that cannot name a kernel.");
  sub(Status::kNotSupported, "NotSupportedError", nullptr, "A valid spec or device this version cannot serve.");
  sub(Status::kCompileFailed, "CompileError", nullptr, "NVRTC rejected the source; the message has the log.");
  sub(Status::kDriverUnavailable, "DriverUnavailableError", nullptr, "No CUDA driver or no GPU.");
  sub(Status::kCudaError, "CudaError", nullptr, "A CUDA Driver API call failed.");
  sub(Status::kCacheError, "CacheError", nullptr, "The disk cache or a bundle could not be read or written.");
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(exception_for(e.status()), e.what());
    }
  });

  nb::class_<Spec>(m, "Spec", "A kernel's name: <norm>.<phase>.<x dtype>.w_<w dtype>.n<N>[.bias][.<epilogue>][.cfg_...]")
      .def("__init__", [](Spec* self, const std::string& text) { new (self) Spec(Spec::parse(text)); }, "text"_a)
      .def("__str__", &Spec::str)
      .def("__repr__", [](const Spec& s) { return "normjit.Spec('" + s.str() + "')"; })
      .def("__eq__", [](const Spec& a, const Spec& b) { return a == b; })
      .def("__eq__", [](const Spec&, nb::handle) { return nb::borrow(Py_NotImplemented); })
      .def("__hash__", [](const Spec& s) { return static_cast<int64_t>(spec_hash(s) >> 1); })
      .def("__reduce__", [](nb::handle self) {
        return nb::make_tuple(self.type(), nb::make_tuple(nb::cast<const Spec&>(self).str()));
      })
      .def_prop_ro("norm", [](const Spec& s) { return normjit::to_string(s.norm); })
      .def_prop_ro("phase", [](const Spec& s) { return normjit::to_string(s.phase); })
      .def_prop_ro("x_dtype", [](const Spec& s) { return normjit::to_string(s.x_dtype); })
      .def_prop_ro("w_dtype", [](const Spec& s) { return normjit::to_string(s.w_dtype); })
      .def_prop_ro("epilogue", [](const Spec& s) { return normjit::to_string(s.epilogue); })
      .def_prop_ro("n", [](const Spec& s) { return s.n; })
      .def_prop_ro("has_bias", [](const Spec& s) { return s.has_bias; })
      .def_prop_ro("zero_centered", [](const Spec& s) { return s.zero_centered; })
      .def_prop_ro("residual", [](const Spec& s) { return s.residual; })
      .def_prop_ro("residual_f32", [](const Spec& s) { return s.residual_f32; })
      .def_prop_ro("bias_in", [](const Spec& s) { return s.bias_in; })
      .def_prop_ro("memory_efficient", [](const Spec& s) { return s.memory_efficient; })
      .def_prop_ro("block", [](const Spec& s) -> std::optional<std::string> {
        if (!s.block) return std::nullopt;
        return block_string(s);
      })
      .def("resolve", [](const Spec& s, int max_vec, int sm, int max_cluster) {
        return normjit::resolve(s, max_vec, sm, max_cluster);
      }, "max_vec"_a = 16, "sm"_a = 90, "max_cluster"_a = normjit::kMaxCluster,
         "This spec with the heuristic's block config filled in (unchanged when it has one).");

  auto kernel_class = nb::class_<normjit::Kernel>(m, "Kernel", "A loaded kernel of one resolved spec; get one from Runtime.kernel().");
  kernel_class
      .def_prop_ro("spec", [](const normjit::Kernel& k) { return k.spec(); })
      .def_prop_ro("name", [](const normjit::Kernel& k) { return k.name(); })
      .def_prop_ro("threads_per_cta", &normjit::Kernel::threads_per_cta)
      .def_prop_ro("local_memory_bytes", &normjit::Kernel::local_memory_bytes)
      .def("workspace_bytes", &normjit::Kernel::workspace_bytes, "rows"_a, "rows_per_batch"_a = 0);
  def_launch(kernel_class, [](const normjit::Kernel& k, const normjit::LaunchArgs& a, CUstream stream) { k.launch(a, stream); });

  nb::class_<normjit::Runtime>(m, "Runtime", "normjit on one GPU: its kernels, loaded once, and the disk cache.")
      .def("__init__",
           [](normjit::Runtime* self, int device, std::optional<std::string> cache_dir) {
             nb::gil_scoped_release release;
             new (self) normjit::Runtime(device, cache_dir.value_or(""));
           },
           "device"_a = 0, "cache_dir"_a = nb::none())
      .def_prop_ro("device_ordinal", [](const normjit::Runtime& r) { return r.device().ordinal; })
      .def_prop_ro("device_name", [](const normjit::Runtime& r) { return r.device().name; })
      .def_prop_ro("sm", [](const normjit::Runtime& r) { return r.device().sm_major * 10 + r.device().sm_minor; })
      .def_prop_ro("sm_count", [](const normjit::Runtime& r) { return r.device().sm_count; })
      .def_prop_ro("max_cluster", &normjit::Runtime::max_cluster)
      .def_prop_ro("tuning_mode", [](const normjit::Runtime& r) { return tuning_mode_name(r.tuning_mode()); })
      .def_prop_ro("tuning_db_path", [](const normjit::Runtime& r) { return r.tuning_db_path().string(); })
      .def_prop_ro("cache_dir", [](normjit::Runtime& r) { return r.disk_cache().dir().string(); })
      .def("choose", [](const normjit::Runtime& r, nb::handle spec, int max_vec) { return r.choose(spec_from(spec), max_vec); },
           "spec"_a, "max_vec"_a = 16, "The resolved spec kernel() would load for pointers allowing max_vec.")
      .def("counters", [](const normjit::Runtime& r) {
        const normjit::RuntimeCounters c = r.counters();
        nb::dict d;
        d["memory_hits"] = c.memory_hits;
        d["disk_hits"] = c.disk_hits;
        d["compiles"] = c.compiles;
        d["image_seconds"] = c.image_seconds;
        d["module_seconds"] = c.module_seconds;
        d["generic_launches"] = c.generic_launches;
        d["background_compiles"] = c.background_compiles;
        return d;
      })
      .def_prop_rw(
          "compile_mode", [](const normjit::Runtime& r) { return std::string(normjit::to_string(r.compile_mode())); },
          [](normjit::Runtime& r, const std::string& mode) {
            r.set_compile_mode(normjit::parse_compile_mode(mode, "compile_mode"));
          },
          "sync, async or generic (docs/generic.md); NORMJIT_COMPILE_MODE when the runtime was created.")
      .def("wait_for_background_compiles",
           [](normjit::Runtime& r) {
             nb::gil_scoped_release release;
             r.wait_for_background_compiles();
           },
           "Async mode: blocks until the background compiles queued so far are done.")
      .def("kernel",
           [](normjit::Runtime& r, nb::handle spec_h, int max_vec) -> const normjit::Kernel& {
             const Spec spec = spec_from(spec_h);
             nb::gil_scoped_release release;  // a miss compiles or loads a module
             // Full-width vectors, or a pinned block: get() also tunes on a miss and falls back
             // from clusters the device cannot co-schedule.
             if (spec.block || max_vec >= 16 / normjit::dtype_size(normjit::row_dtype(spec))) return r.get(spec);
             return r.get(r.choose(spec, max_vec));
           },
           "spec"_a, "max_vec"_a = 16, nb::rv_policy::reference_internal,
           "The kernel for a spec (its block chosen for pointers that allow max_vec); it keeps this runtime alive.")
      .def(
          "launcher",
          [](normjit::Runtime& r, nb::handle spec_h, int max_vec) { return ModeLauncher{&r, spec_from(spec_h), max_vec}; },
          "spec"_a, "max_vec"_a = 16, nb::keep_alive<0, 1>(),
          "Launches of a spec that follow this runtime's compile mode (ModeLauncher); nothing compiles here.");

  auto launcher_class = nb::class_<ModeLauncher>(
      m, "ModeLauncher",
      "Launches of one spec as its Runtime's compile mode says (sync: the specialized kernel; async: the generic "
      "kernel until the specialized one is compiled in the background; generic: the generic kernel); get one from "
      "Runtime.launcher(). Its launch() takes Kernel.launch's arguments.");
  launcher_class.def_prop_ro("spec", [](const ModeLauncher& l) { return l.spec; })
      .def_prop_ro("max_vec", [](const ModeLauncher& l) { return l.max_vec; })
      .def(
          "workspace_bytes",
          [](const ModeLauncher& l, int64_t rows, int64_t rows_per_batch) {
            nb::gil_scoped_release release;  // sync mode: a first call compiles or loads
            return l.runtime->workspace_bytes(l.spec, rows, rows_per_batch, l.max_vec);
          },
          "rows"_a, "rows_per_batch"_a = 0,
          "The workspace the next launch needs (a backward: the specialized kernel's once it is loaded, else the "
          "generic kernel's); size it before each launch.");
  def_launch(launcher_class, [](const ModeLauncher& l, const normjit::LaunchArgs& a, CUstream stream) {
    l.runtime->launch(l.spec, a, stream);
  });

  m.def("shared_runtime",
        [](int device) -> normjit::Runtime& {
          nb::gil_scoped_release release;  // the first call creates it (driver, context, cache)
          return normjit::shared_runtime(device);
        },
        "device"_a, nb::rv_policy::reference,
        "The process's Runtime of a device, created on first use and shared by every part of the process "
        "(normjit.torch's Python and C++ paths alike).");

  m.def("max_vec_for",
        [](const Spec& spec, uintptr_t x, uintptr_t gamma, uintptr_t beta, uintptr_t y, uintptr_t dy, uintptr_t dx,
           uintptr_t dgamma, uintptr_t dbeta, uintptr_t mask, int64_t row_stride, uintptr_t residual, uintptr_t h,
           uintptr_t dh_out, uintptr_t y_quant, uintptr_t dresidual, uintptr_t bias_in) {
          normjit::LaunchArgs a = pointer_args(x, gamma, beta, y, dy, dx, dgamma, dbeta, mask);
          a.row_stride = row_stride;
          a.dresidual = reinterpret_cast<void*>(dresidual);
          a.bias_in = reinterpret_cast<const void*>(bias_in);
          a.residual = reinterpret_cast<const void*>(residual);
          a.h = reinterpret_cast<void*>(h);
          a.dh_out = reinterpret_cast<const void*>(dh_out);
          a.y_quant = reinterpret_cast<void*>(y_quant);
          return normjit::max_vec_for(spec, a);
        },
        "spec"_a, "x"_a, "gamma"_a, "beta"_a, "y"_a, "dy"_a, "dx"_a, "dgamma"_a, "dbeta"_a, "mask"_a, "row_stride"_a,
        "residual"_a = 0, "h"_a = 0, "dh_out"_a = 0, "y_quant"_a = 0, "dresidual"_a = 0, "bias_in"_a = 0,
        "The widest vector (elements) the pointers (ints), row stride and n allow. Arguments: spec, x, gamma, beta, "
        "y, dy, dx, dgamma, dbeta, mask, row_stride, then residual, h, dh_out, y_quant, dresidual, bias_in.");

  m.def("_precompile", &precompile, "specs"_a, "arch"_a = "sm_90", "cache_dir"_a = nb::none(), "jobs"_a = 0,
        "progress"_a = nb::none(), "batch"_a = 1);

  m.def("export_bundle",
        [](std::optional<std::string> cache_dir, const std::string& bundle_path, std::optional<nb::iterable> specs,
           const std::string& arch) {
          normjit::DiskCache cache(cache_dir.value_or(""));
          std::vector<std::string> names;
          if (specs) {
            const normjit::Target target = normjit::Target::parse(arch);
            for (nb::handle h : *specs) {
              // An entry's file name as it is, else a spec resolved as precompile resolves it.
              if (nb::isinstance<nb::str>(h)) {
                const std::string text = nb::cast<std::string>(h);
                if (text.size() > 7 && text.compare(text.size() - 7, 7, ".kernel") == 0) {
                  names.push_back(text);
                  continue;
                }
              }
              names.push_back(cache.entry_path(normjit::resolve(spec_from(h), 16, target.arch), target).filename().string());
            }
          }
          nb::gil_scoped_release release;
          return normjit::export_bundle(cache.dir(), bundle_path, names);
        },
        "cache_dir"_a.none(), "bundle_path"_a, "specs"_a = nb::none(), "arch"_a = "sm_90",
        "Writes cache entries into one bundle file: those of `specs` (spec strings, Specs or entry file names) "
        "for `arch`, or every valid entry when specs is None. Returns how many.");
  m.def("import_bundle",
        [](const std::string& bundle_path, std::optional<std::string> cache_dir) {
          normjit::DiskCache cache(cache_dir.value_or(""));
          nb::gil_scoped_release release;
          return normjit::import_bundle(bundle_path, cache.dir());
        },
        "bundle_path"_a, "cache_dir"_a = nb::none(),
        "Verifies a bundle, then writes its entries into the cache directory. Returns how many.");

  m.def("version", &normjit::version, "normjit's version.");
  // The quantized formats' host references (include/normjit/quant_reference.hpp), for tests.
  m.def(
      "_reference_encode",
      [](const std::string& format, const std::vector<double>& values) {
        normjit::reference::MiniFloat f;
        if (format == "e4m3") f = normjit::reference::MiniFloat::kE4M3;
        else if (format == "e5m2") f = normjit::reference::MiniFloat::kE5M2;
        else if (format == "e2m1") f = normjit::reference::MiniFloat::kE2M1;
        else throw Error(Status::kInvalidArgument, "format='" + format + "' is not e4m3, e5m2 or e2m1");
        std::vector<uint8_t> out;
        out.reserve(values.size());
        for (double v : values) out.push_back(normjit::reference::encode_satfinite(f, v));
        return nb::bytes(reinterpret_cast<const char*>(out.data()), out.size());
      },
      "format"_a, "values"_a, "Codes of values in an FP8 / FP4 format: round to nearest even, saturating.");
  m.def("nvrtc_version", &normjit::nvrtc_version, "NVRTC's version: major * 1000 + minor * 10.");
  m.def("default_cache_dir", [] { return normjit::DiskCache::default_dir().string(); },
        "NORMJIT_CACHE_DIR, else $XDG_CACHE_HOME/normjit, else ~/.cache/normjit.");
  m.def("tuning_db_path", [](std::optional<std::string> cache_dir) { return tuning_db_path(cache_dir).string(); },
        "cache_dir"_a = nb::none(), "The tuning database a Runtime of this cache directory reads.");
  m.def("compile_mode", [] { return std::string(normjit::to_string(normjit::compile_mode_from_env())); },
        "The compile mode a Runtime would take (NORMJIT_COMPILE_MODE): sync, async or generic.");
  m.def("generic_unsupported_why", [](nb::handle spec) { return normjit::generic_unsupported_why(spec_from(spec)); },
        "spec"_a, "Empty when a generic kernel (built into the library) covers the spec; else why not.");
  m.def("generic_images",
        [] {
          nb::list out;
          for (const normjit::GenericImage& g : normjit::generic_images())
            out.append(nb::make_tuple(normjit::to_string(g.x), normjit::to_string(g.program), g.arch, g.is_ptx,
                                      g.image.size()));
          return out;
        },
        "The generic kernels' images built into the library: (x dtype, program ('norm' or 'quant'), arch, is_ptx, "
        "bytes) each. The quant program (the quantizing epilogues) needs sm_89 or newer: no sm_80 image.");
  m.def("tuning_mode",
        [](std::optional<std::string> cache_dir) {
          std::error_code ec;
          return tuning_mode_name(normjit::tuning_mode_from_env(std::filesystem::exists(tuning_db_path(cache_dir), ec)));
        },
        "cache_dir"_a = nb::none(), "The tuning mode a Runtime would take (NORMJIT_TUNING): heuristic, db or tune.");

  // The data pointer, shape and strides (elements) of a DLPack-exporting array.
  m.def("_dlpack_info", [](nb::ndarray<> a) {
    nb::list shape, strides;
    for (size_t i = 0; i < a.ndim(); ++i) {
      shape.append(a.shape(i));
      strides.append(a.stride(i));
    }
    return nb::make_tuple(reinterpret_cast<uintptr_t>(a.data()), nb::tuple(shape), nb::tuple(strides),
                          a.itemsize());
  });
}
