// A record of earlier NVRTC compiles for the CPU suite's compile grids, which on two cores took
// most of its time. Each job is keyed by its kernel cache key (DiskCache::key: source, headers,
// options, arch, NVRTC and normjit versions: everything that changes the machine code), and the
// record keeps its kernels' ptxas report. A job whose key is recorded takes the recorded report
// instead of a compile; every 32nd recorded job is compiled anyway and must agree with it; a job
// whose key is not recorded (a changed template, another NVRTC) is compiled.
//   NORMJIT_UPDATE_GOLDEN=1: every job is compiled and the record rewritten (when all compiled);
//   NORMJIT_COMPILE_RECORD_FULL=1: every job is compiled, the record left as it is.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "normjit/normjit.hpp"
#include "tests/compile_batches.hpp"

namespace normjit::testing {

namespace record_detail {

inline bool env_is_1(const char* name) {
  const char* v = std::getenv(name);
  return v && std::string(v) == "1";
}

// function=registers/stack/stores/loads, sorted by function; the kernel's own name as "~".
inline std::string format(std::vector<KernelResources> kernels, const std::string& kernel_name) {
  std::sort(kernels.begin(), kernels.end(),
            [](const KernelResources& a, const KernelResources& b) { return a.function < b.function; });
  std::string out;
  for (const KernelResources& k : kernels) {
    std::string f = k.function;
    if (!kernel_name.empty() && f.compare(0, kernel_name.size(), kernel_name) == 0)
      f = "~" + f.substr(kernel_name.size());
    out += (out.empty() ? "" : " ") + f + "=" + std::to_string(k.registers) + "/" +
           std::to_string(k.stack_frame_bytes) + "/" + std::to_string(k.spill_store_bytes) + "/" +
           std::to_string(k.spill_load_bytes);
  }
  return out;
}

inline std::vector<KernelResources> parse(const std::string& text, const std::string& kernel_name) {
  std::vector<KernelResources> kernels;
  std::istringstream in(text);
  for (std::string word; in >> word;) {
    KernelResources k;
    const size_t eq = word.rfind('=');
    char s1 = 0, s2 = 0, s3 = 0;
    std::istringstream figures(eq == std::string::npos ? "" : word.substr(eq + 1));
    figures >> k.registers >> s1 >> k.stack_frame_bytes >> s2 >> k.spill_store_bytes >> s3 >> k.spill_load_bytes;
    if (eq == std::string::npos || figures.fail() || s1 != '/' || s2 != '/' || s3 != '/')
      throw std::runtime_error("bad kernel figures '" + word + "' in a compile record");
    k.function = word.substr(0, eq);
    if (!k.function.empty() && k.function[0] == '~') k.function = kernel_name + k.function.substr(1);
    kernels.push_back(k);
  }
  return kernels;
}

}  // namespace record_detail

struct RecordedCompiles {
  // Per job: its kernels' ptxas report, compiled or recorded; empty where the compile failed
  // (on_compiled saw the error).
  std::vector<std::vector<KernelResources>> resources;
  std::vector<std::string> failures;  // compiled jobs that disagree with their record
  size_t compiled = 0, from_record = 0, verified = 0, not_recorded = 0;
  bool full = false;
  std::string path;

  size_t compiled_count() const { return compiled; }
  std::string summary() const {
    std::ostringstream s;
    s << compiled_count() << " compiled (" << verified << " of them to check the record), " << from_record
      << " from " << path;
    if (!full && not_recorded > 0) s << "; " << not_recorded << " not in the record: NORMJIT_UPDATE_GOLDEN=1 adds them";
    return s.str();
  }
};

// kFromEnvironment: as the variables above say; kUseRecord: the record only (the helper's own test).
enum class RecordMode { kFromEnvironment, kUseRecord };

// Compiles jobs through compile_in_batches (batch as there), or takes them from the record at
// record_path. on_compiled(i, compiled) is called for each compiled job from the worker threads,
// under the helper's lock.
template <class OnCompiled>
RecordedCompiles compile_with_record(const std::vector<CompileJob>& jobs, const std::string& record_path,
                                     OnCompiled&& on_compiled, size_t batch,
                                     RecordMode mode = RecordMode::kFromEnvironment) {
  const bool from_env = mode == RecordMode::kFromEnvironment;
  const bool update = from_env && record_detail::env_is_1("NORMJIT_UPDATE_GOLDEN");
  RecordedCompiles out;
  out.full = update || (from_env && record_detail::env_is_1("NORMJIT_COMPILE_RECORD_FULL"));
  out.path = record_path;
  out.resources.resize(jobs.size());

  std::map<std::string, std::string> record;  // key -> figures; none when rewriting it
  if (!update) {
    std::ifstream in(record_path);
    for (std::string line; std::getline(in, line);) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream fields(line);
      std::string spec_text, arch, key, figures;
      fields >> spec_text >> arch >> key;
      std::getline(fields >> std::ws, figures);
      if (key.empty()) throw std::runtime_error("bad line in " + record_path + ": '" + line + "'");
      record[key] = figures;
    }
  }
  std::vector<std::string> keys(jobs.size()), names(jobs.size()), figures(jobs.size());
  std::vector<size_t> to_compile;
  size_t recorded = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    try {
      const GeneratedSource src = generate(jobs[i].spec);
      keys[i] = DiskCache::key(src, jobs[i].target);
      names[i] = src.kernel_name;
    } catch (const Error&) {
      // Compiled below, where the error reaches on_compiled with the spec.
    }
    const auto it = keys[i].empty() ? record.end() : record.find(keys[i]);
    if (it != record.end()) {
      figures[i] = it->second;
      out.resources[i] = record_detail::parse(it->second, names[i]);
      ++recorded;
    } else {
      ++out.not_recorded;
    }
    const bool check = it != record.end() && recorded % 32 == 1;
    if (out.full || it == record.end() || check) {
      to_compile.push_back(i);
      if (it != record.end()) ++out.verified;
    } else {
      ++out.from_record;
    }
  }
  std::vector<CompileJob> compile_jobs;
  for (size_t i : to_compile) compile_jobs.push_back(jobs[i]);
  out.compiled = to_compile.size();
  bool any_failed = false;
  std::mutex mutex;
  compile_in_batches(compile_jobs, [&](size_t k, const CompiledJob& c) {
    const size_t i = to_compile[k];
    std::lock_guard<std::mutex> lock(mutex);
    on_compiled(i, c);
    if (!c.error.empty()) {
      out.resources[i].clear();
      any_failed = true;
      return;
    }
    const std::string now = record_detail::format(c.resources, c.src.kernel_name);
    if (!figures[i].empty() && figures[i] != now)
      out.failures.push_back("the compile record disagrees with a compile of " + jobs[i].spec.str() + " " +
                             jobs[i].target.str() + ": recorded '" + figures[i] + "', compiled '" + now + "' (" +
                             record_path + "; NORMJIT_UPDATE_GOLDEN=1 rewrites it)");
    figures[i] = now;
    out.resources[i] = c.resources;
  }, batch);
  if (update && !any_failed && out.failures.empty()) {
    std::vector<std::string> lines;
    for (size_t i = 0; i < jobs.size(); ++i)
      if (!keys[i].empty()) lines.push_back(jobs[i].spec.str() + " " + jobs[i].target.str() + " " + keys[i] + " " + figures[i]);
    std::sort(lines.begin(), lines.end());
    lines.erase(std::unique(lines.begin(), lines.end()), lines.end());
    std::ofstream file(record_path);
    file << "# Compiles recorded for a test (tests/compile_record.hpp): spec, arch, kernel cache key, then each\n"
            "# kernel as function=registers/stack/spill stores/spill loads (~: the spec's kernel name).\n"
            "# Written with NORMJIT_UPDATE_GOLDEN=1; a job whose key is not here is compiled.\n";
    for (const auto& l : lines) file << l << "\n";
  }
  return out;
}

}  // namespace normjit::testing
