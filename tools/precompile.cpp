// normjit-precompile: compiles a manifest of specs (and/or specs given on the command line) into
// the disk cache for one or more named archs. Needs no GPU. Its whole job is to fill the cache (or
// a bundle): a kernel it could not store, or an output it could not write, makes it fail.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <thread>

#include "normjit/normjit.hpp"
#include "tools/manifest.hpp"
#include "tools/output.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Compile normjit kernels into the disk cache (no GPU needed)."};
  std::vector<std::string> manifests, spec_args, archs{"sm_90"};
  std::string cache_dir, json_path, bundle_path, import_path;
  unsigned jobs = std::max(1u, std::thread::hardware_concurrency());
  bool quiet = false;
  unsigned batch = 1;
  app.add_option("specs", spec_args, "Spec strings, e.g. layernorm.fwd_train.bf16.w_bf16.n4096");
  app.add_option("-m,--manifest", manifests, "Manifest file: one spec per line, # comments")->check(CLI::ExistingFile);
  app.add_option("-a,--arch", archs, "Target arch(s), e.g. sm_90 (repeatable)")->capture_default_str();
  app.add_option("-c,--cache-dir", cache_dir, "Cache directory (default: NORMJIT_CACHE_DIR, XDG, ~/.cache/normjit)");
  app.add_option("-j,--jobs", jobs, "Parallel compile threads")->capture_default_str()->check(CLI::Range(1u, 256u));
  app.add_option("--json", json_path, "Write a JSON summary to this file ('-' for stdout)");
  app.add_flag("-q,--quiet", quiet, "No per-kernel progress lines");
  app.add_option("--batch", batch,
                 "Specs compiled together, up to this many in one NVRTC program (each cache entry then holds "
                 "the whole program's cubin)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  app.add_option("--bundle", bundle_path, "Also write this run's kernels (every spec x arch) into one bundle file");
  app.add_option("--import", import_path, "Verify a bundle and import its entries into the cache; nothing else")
      ->check(CLI::ExistingFile);
  CLI11_PARSE(app, argc, argv);

  try {
    if (!import_path.empty()) {
      if (!spec_args.empty() || !manifests.empty() || !bundle_path.empty()) {
        std::cerr << "normjit-precompile: --import takes no specs, manifests or --bundle\n";
        return 2;
      }
      const std::filesystem::path dir = cache_dir.empty() ? normjit::DiskCache::default_dir() : std::filesystem::path(cache_dir);
      const size_t n = normjit::import_bundle(import_path, dir);
      std::fprintf(stderr, "normjit-precompile: imported %zu entries from %s into %s\n", n, import_path.c_str(),
                   dir.string().c_str());
      return 0;
    }
    std::vector<normjit::Spec> specs;
    for (const auto& m : manifests) {
      auto more = normjit::tools::read_manifest(m);
      specs.insert(specs.end(), more.begin(), more.end());
    }
    for (const auto& s : spec_args) specs.push_back(normjit::Spec::parse(s));
    if (specs.empty()) {
      std::cerr << "normjit-precompile: no specs given (pass specs or --manifest FILE)\n";
      return 2;
    }
    std::vector<normjit::Target> targets;
    for (const auto& a : archs) targets.push_back(normjit::Target::parse(a));

    // NORMJIT_BUNDLE is not consulted: a kernel found there would not be stored in the directory.
    normjit::DiskCacheOptions options = normjit::DiskCacheOptions::from_env();
    options.bundle.clear();
    normjit::DiskCache cache(cache_dir, options);
    struct Job {
      normjit::Spec spec;
      normjit::Target target;
      double compile_ms = 0;
      double wall_ms = 0;
      bool cached = false;
      bool stored = false;
      std::string not_stored_why;
      std::string error;
    };
    std::vector<Job> work;
    for (const auto& t : targets)
      for (const auto& s : specs) work.push_back({normjit::resolve(s, 16, t.arch), t});

    // Units of work: specs of one target and phase in groups of up to `batch`, one NVRTC program
    // each, on one thread (compile_batch).
    std::vector<std::string> keys;
    for (const Job& job : work)
      keys.push_back(job.target.str() + (job.spec.phase == normjit::Phase::kBackward ? " bwd" : " fwd"));
    const std::vector<std::vector<size_t>> units = normjit::compile_batch_groups(keys, batch);

    std::atomic<size_t> next{0}, done{0};
    std::mutex print_mutex;
    const auto start = std::chrono::steady_clock::now();
    auto record = [&](Job& job, const normjit::DiskCache::Lookup& r, double wall_ms) {
      job.compile_ms = r.compile_ms;
      job.cached = r.source != normjit::DiskCache::Lookup::Source::kCompiled;
      job.stored = r.on_disk;
      job.not_stored_why = r.not_stored_why;
      job.wall_ms = wall_ms;
    };
    auto report = [&](const Job& job) {
      const size_t n = ++done;
      if (quiet && job.error.empty()) return;
      std::lock_guard<std::mutex> lock(print_mutex);
      if (job.error.empty())
        std::fprintf(stderr, "[%zu/%zu] %-8s %s %s %.1f ms\n", n, work.size(), job.cached ? "cached" : "compiled",
                     job.target.str().c_str(), job.spec.str().c_str(), job.wall_ms);
      else
        std::fprintf(stderr, "[%zu/%zu] FAILED   %s %s\n%s\n", n, work.size(), job.target.str().c_str(),
                     job.spec.str().c_str(), job.error.c_str());
    };
    auto run_alone = [&](Job& job) {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        const normjit::DiskCache::Lookup r = cache.lookup(job.spec, job.target);
        record(job, r, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      } catch (const normjit::Error& e) {
        job.error = e.what();
      }
      report(job);
    };
    auto worker = [&] {
      for (size_t u; (u = next++) < units.size();) {
        const std::vector<size_t>& unit = units[u];
        if (unit.size() == 1) {
          run_alone(work[unit[0]]);
          continue;
        }
        std::vector<normjit::Spec> batch_specs;
        for (size_t i : unit) batch_specs.push_back(work[i].spec);
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<normjit::DiskCache::Lookup> found;
        try {
          found = cache.lookup_batch(batch_specs, work[unit[0]].target);
        } catch (const normjit::Error&) {
          for (size_t i : unit) run_alone(work[i]);  // each failure then names its spec
          continue;
        }
        const double share =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / unit.size();
        for (size_t k = 0; k < unit.size(); ++k) {
          record(work[unit[k]], found[k], share);
          report(work[unit[k]]);
        }
      }
    };
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < std::min<size_t>(jobs, units.size()); ++t) threads.emplace_back(worker);
    for (auto& t : threads) t.join();
    const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    std::vector<double> compile_ms;
    size_t failed = 0, cached = 0, not_stored = 0;
    std::vector<std::string> not_stored_whys;  // distinct, in order of first appearance
    for (const auto& j : work) {
      if (!j.error.empty()) ++failed;
      else if (j.cached) ++cached;
      else compile_ms.push_back(j.compile_ms);
      if (j.error.empty() && !j.stored) {
        ++not_stored;
        if (std::find(not_stored_whys.begin(), not_stored_whys.end(), j.not_stored_why) == not_stored_whys.end())
          not_stored_whys.push_back(j.not_stored_why);
      }
    }
    std::sort(compile_ms.begin(), compile_ms.end());
    const double median = compile_ms.empty() ? 0 : compile_ms[compile_ms.size() / 2];
    std::fprintf(stderr,
                 "normjit-precompile: %zu kernel(s) for %zu arch(s): %zu compiled, %zu cached, %zu failed in %.2f s "
                 "with %u job(s); median compile %.1f ms; cache %s\n",
                 work.size(), targets.size(), compile_ms.size(), cached, failed, total_s, jobs, median,
                 cache.dir().string().c_str());
    if (not_stored) {
      std::fprintf(stderr, "normjit-precompile: error: %zu of %zu kernel(s) could not be stored in cache %s:\n",
                   not_stored, work.size(), cache.dir().string().c_str());
      for (const auto& why : not_stored_whys)
        std::fprintf(stderr, "  %s\n", why.empty() ? "(no reason recorded)" : why.c_str());
    }
    int rc = failed || not_stored ? 1 : 0;
    if (!json_path.empty()) {
      nlohmann::json j;
      j["kernels"] = work.size();
      j["compiled"] = compile_ms.size();
      j["cached"] = cached;
      j["failed"] = failed;
      j["not_stored"] = not_stored;
      j["seconds"] = total_s;
      j["jobs"] = jobs;
      j["batch"] = batch;
      j["median_compile_ms"] = median;
      j["compile_ms"] = compile_ms;
      j["cache_dir"] = cache.dir().string();
      const normjit::CacheCounters counters = cache.counters();
      // Cached kernels another thread or process compiled while this one waited on the key's lock.
      j["waited_for_another_compile"] = counters.waited_hits;
      j["corrupt_entries"] = counters.corrupt_entries;
      j["evictions"] = counters.evictions;
      j["untrusted_entries"] = counters.untrusted_entries;
      j["nvrtc_version"] = normjit::nvrtc_version();
      if (const std::string why = normjit::tools::write_output(json_path, j.dump(2) + "\n"); !why.empty()) {
        std::cerr << "normjit-precompile: error: --json: " << why << "\n";
        rc = 1;
      }
    }
    if (!bundle_path.empty()) {
      if (failed || not_stored) {
        std::cerr << "normjit-precompile: error: not writing bundle " << bundle_path << ": " << failed
                  << " kernel(s) failed, " << not_stored << " not stored in the cache\n";
        return 1;
      }
      std::vector<std::string> names;
      for (const auto& j : work) names.push_back(cache.entry_path(j.spec, j.target).filename().string());
      std::sort(names.begin(), names.end());
      names.erase(std::unique(names.begin(), names.end()), names.end());
      const size_t n = normjit::export_bundle(cache.dir(), bundle_path, names);
      std::fprintf(stderr, "normjit-precompile: wrote %zu entries to bundle %s\n", n, bundle_path.c_str());
    }
    return rc;
  } catch (const normjit::Error& e) {
    std::cerr << "normjit-precompile: error: " << e.what() << "\n";
    return 2;
  }
}
