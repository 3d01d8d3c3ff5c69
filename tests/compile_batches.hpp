// Compiles many specs for a test the way normjit-precompile does: up to eight of one target and
// phase in one NVRTC program (compile_batch, which gives each kernel the machine code a compile
// alone gives it, and compiles alone what it cannot batch), on every core. test_compile's grid:
// 324 -> 271 s on two cores. batch = 1: one spec a program.
#pragma once

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "normjit/normjit.hpp"

namespace normjit::testing {

struct CompileJob {
  Spec spec;  // resolved
  Target target;
};

struct CompiledJob {
  GeneratedSource src;
  CompileResult result;
  std::vector<KernelResources> resources;  // the ptxas report of this spec's own kernels
  std::string error;                       // validate, generate or compile failed: the Error's text
};

// done(i, compiled) is called once per job, from the worker threads.
template <class Done>
void compile_in_batches(const std::vector<CompileJob>& jobs, Done&& done, size_t batch = 8) {
  std::vector<std::string> keys;
  for (const CompileJob& job : jobs)
    keys.push_back(job.target.str() + (job.spec.phase == Phase::kBackward ? " bwd" : " fwd"));
  const std::vector<std::vector<size_t>> units = compile_batch_groups(keys, batch);
  auto finish = [&](size_t i, CompiledJob& c) {
    if (c.error.empty())
      for (KernelResources& k : parse_ptxas_report(c.result.log))
        if (is_kernel_of(c.src, k.function)) c.resources.push_back(std::move(k));
    done(i, c);
  };
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t u; (u = next++) < units.size();) {
      std::vector<CompiledJob> compiled(units[u].size());
      std::vector<GeneratedSource> sources;
      std::vector<size_t> source_of;  // member index of each source
      for (size_t m = 0; m < units[u].size(); ++m) {
        try {
          validate(jobs[units[u][m]].spec);
          compiled[m].src = generate(jobs[units[u][m]].spec);
          sources.push_back(compiled[m].src);
          source_of.push_back(m);
        } catch (const Error& e) {
          compiled[m].error = e.what();
        }
      }
      std::vector<CompileResult> results;
      try {
        results = compile_batch(sources, jobs[units[u][0]].target);
      } catch (const Error&) {
        results.clear();  // one at a time below, so that each failure names its own spec
      }
      for (size_t k = 0; k < sources.size(); ++k) {
        CompiledJob& c = compiled[source_of[k]];
        if (!results.empty()) {
          c.result = std::move(results[k]);
          continue;
        }
        try {
          c.result = compile(c.src, jobs[units[u][source_of[k]]].target);
        } catch (const Error& e) {
          c.error = e.what();
        }
      }
      for (size_t m = 0; m < units[u].size(); ++m) finish(units[u][m], compiled[m]);
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < std::max(2u, std::thread::hardware_concurrency()); ++t) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
}

}  // namespace normjit::testing
