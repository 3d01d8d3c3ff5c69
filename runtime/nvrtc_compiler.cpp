#include <nvrtc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <charconv>
#include <cstdlib>
#include <cstdio>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>

#include "normjit/compiler.hpp"
#include "normjit/error.hpp"
#include "runtime/log.hpp"

// One check macro for NVRTC; `ctx` names what was being compiled.
#define NORMJIT_NVRTC(call, ctx)                                                                       \
  do {                                                                                                \
    const nvrtcResult nj_res_ = (call);                                                               \
    if (nj_res_ != NVRTC_SUCCESS)                                                                     \
      throw ::normjit::Error(::normjit::Status::kCompileFailed,                                       \
                             std::string(ctx) + ": " #call " failed: " + nvrtcGetErrorString(nj_res_)); \
  } while (0)

namespace normjit {

std::string version() { return NORMJIT_VERSION; }

int nvrtc_version() {
  int major = 0, minor = 0;
  NORMJIT_NVRTC(nvrtcVersion(&major, &minor), "nvrtc_version");
  return major * 1000 + minor * 10;
}

std::vector<int> nvrtc_supported_archs() {
  // Fixed for the process; asked on every cache key and compile otherwise.
  static const std::vector<int> archs = [] {
    int count = 0;
    NORMJIT_NVRTC(nvrtcGetNumSupportedArchs(&count), "nvrtc_supported_archs");
    std::vector<int> list(count);
    NORMJIT_NVRTC(nvrtcGetSupportedArchs(list.data()), "nvrtc_supported_archs");
    return list;
  }();
  return archs;
}

Target Target::parse(std::string_view text) {
  std::string_view digits = text;
  if (digits.substr(0, 3) == "sm_") digits.remove_prefix(3);
  int arch = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), arch);
  if (ec != std::errc() || ptr != digits.data() + digits.size() || arch < 80 || arch > 1000)
    throw Error(Status::kInvalidArgument,
                "arch '" + std::string(text) + "' is not sm_XY with XY >= 80 (normjit needs sm_80 or newer)");
  return Target{arch};
}

std::string Target::str() const { return "sm_" + std::to_string(arch); }

std::vector<std::string> compile_options(const Target& target, bool* emits_ptx) {
  const std::vector<int> supported = nvrtc_supported_archs();
  std::string arch_flag;
  bool ptx = false;
  if (std::find(supported.begin(), supported.end(), target.arch) != supported.end()) {
    arch_flag = "-arch=sm_" + std::to_string(target.arch);
  } else {
    // NVRTC predates this GPU: PTX for the newest arch it knows, for the driver to JIT.
    int best = 0;
    for (int a : supported)
      if (a <= target.arch) best = std::max(best, a);
    if (best == 0)
      throw Error(Status::kNotSupported, "NVRTC supports no arch at or below " + target.str());
    arch_flag = "-arch=compute_" + std::to_string(best);
    ptx = true;
  }
  if (emits_ptx) *emits_ptx = ptx;
  // --minimal skips the implicit CUDA runtime headers NVRTC would otherwise parse (most of a
  // small kernel's compile time); the templates need only built-ins.
  // -v: the ptxas resource report in the log, read to catch local-memory spills (see compile).
  std::vector<std::string> options{arch_flag, "-std=c++17", "--minimal", "-DNORMJIT_JIT=1"};
  if (!ptx) options.push_back("--ptxas-options=-v");
  // For experiments (e.g. -Ofc=mid); these enter the cache key like every other option.
  if (const char* extra = std::getenv("NORMJIT_NVRTC_EXTRA_OPTIONS"); extra && *extra) {
    std::istringstream words(extra);
    for (std::string w; words >> w;) options.push_back(w);
  }
  return options;
}

namespace {

struct NvrtcOutput {
  std::vector<char> image;
  std::string log;
};

NvrtcOutput run_nvrtc(const GeneratedSource& src, const std::vector<std::string>& options, bool ptx,
                      const std::string& ctx) {
  const auto& headers = device_headers();
  std::vector<const char*> header_text, header_names;
  for (const auto& [name, text] : headers) {
    header_names.push_back(name.c_str());
    header_text.push_back(text.c_str());
  }
  nvrtcProgram prog = nullptr;
  NORMJIT_NVRTC(nvrtcCreateProgram(&prog, src.source.c_str(), (src.kernel_name + ".cu").c_str(),
                                   static_cast<int>(headers.size()), header_text.data(), header_names.data()),
                ctx);
  struct Destroy {
    nvrtcProgram* p;
    ~Destroy() { nvrtcDestroyProgram(p); }
  } destroy{&prog};

  std::vector<const char*> opts;
  for (const auto& o : options) opts.push_back(o.c_str());
  const nvrtcResult res = nvrtcCompileProgram(prog, static_cast<int>(opts.size()), opts.data());
  NvrtcOutput out;
  size_t log_size = 0;
  if (nvrtcGetProgramLogSize(prog, &log_size) == NVRTC_SUCCESS && log_size > 1) {
    out.log.resize(log_size);
    nvrtcGetProgramLog(prog, out.log.data());
    out.log.resize(log_size - 1);
  }
  if (res != NVRTC_SUCCESS) {
    std::string joined;
    for (const auto& o : options) joined += " " + o;
    throw Error(Status::kCompileFailed, ctx + ": " + nvrtcGetErrorString(res) + "\n  options:" + joined +
                                            "\n  log:\n" + out.log);
  }
  size_t size = 0;
  if (ptx) {
    NORMJIT_NVRTC(nvrtcGetPTXSize(prog, &size), ctx);
    out.image.resize(size);
    NORMJIT_NVRTC(nvrtcGetPTX(prog, out.image.data()), ctx);
  } else {
    NORMJIT_NVRTC(nvrtcGetCUBINSize(prog, &size), ctx);
    out.image.resize(size);
    NORMJIT_NVRTC(nvrtcGetCUBIN(prog, out.image.data()), ctx);
  }
  return out;
}

// NVRTC compiles running in this process (compile() below).
std::atomic<int> compiles_in_flight{0};

// CTAs of `threads` each that the registers of the program's kernels let one SM hold (sm_80-sm_90:
// 64 K registers, allocated per warp in steps of 256; 64 warps; 32 CTAs); 0 without a report.
int ctas_by_registers(const NvrtcOutput& out, int threads) {
  int registers = 0;
  for (const KernelResources& k : parse_ptxas_report(out.log)) registers = std::max(registers, k.registers);
  if (registers == 0 || threads < 1) return 0;
  const int warps = (threads + 31) / 32;
  const int per_warp = (registers * 32 + 255) / 256 * 256;
  return std::min({65536 / (per_warp * warps), 64 / warps, 32});
}

// Bytes of stack frame (where spills go) over a cubin's functions: from the cubin's own records,
// else from the ptxas report.
long local_memory_bytes(const NvrtcOutput& out) {
  long bytes = 0;
  if (const auto frames = cubin_frame_bytes(out.image)) {
    for (const auto& [function, frame] : *frames) bytes += frame;
  } else {
    for (const KernelResources& k : parse_ptxas_report(out.log)) bytes += k.stack_frame_bytes + k.spill_store_bytes;
  }
  return bytes;
}

}  // namespace

CompileResult compile_ptx(const GeneratedSource& src, int virtual_arch) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::string> options{"-arch=compute_" + std::to_string(virtual_arch), "-std=c++17", "--minimal",
                                         "-DNORMJIT_JIT=1"};
  NvrtcOutput nvrtc = run_nvrtc(src, options, true, "compiling " + src.spec + " to PTX for compute_" +
                                                        std::to_string(virtual_arch));
  CompileResult out;
  out.log = std::move(nvrtc.log);
  out.binary.spec = src.spec;
  out.binary.kernel_name = src.kernel_name;
  out.binary.arch = "compute_" + std::to_string(virtual_arch);
  out.binary.is_ptx = true;
  out.binary.image = std::move(nvrtc.image);
  out.binary.threads_per_cta = src.threads_per_cta;
  out.binary.rows_per_cta = src.rows_per_cta;
  out.milliseconds = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return out;
}

CompileResult compile(const GeneratedSource& src, const Target& target, const std::vector<std::string>& extra_options) {
  const auto start = std::chrono::steady_clock::now();
  bool ptx = false;
  std::vector<std::string> options = compile_options(target, &ptx);
  for (const auto& o : extra_options)
    if (std::find(options.begin(), options.end(), o) == options.end()) options.push_back(o);
  const std::string ctx = "compiling " + src.spec + " for " + target.str();
  // A program of several kernels (the backward) compiles them on two threads where a core is idle:
  // 2.49 -> 2.05 s median for eight backward specs on a 2-core machine with one job, no gain with
  // both cores busy, 7 % slower for one-kernel programs. The SASS is the same (50 backward
  // programs compared); the cubin's tool note records the option. Not part of the cache key.
  struct InFlight {
    InFlight() { ++compiles_in_flight; }
    ~InFlight() { --compiles_in_flight; }
  } in_flight;
  // An NVRTC that does not know the option is told once (then never asked again).
  static std::atomic<bool> split_known{true};
  const bool split = !ptx && src.kernels > 1 && split_known.load() &&
                     compiles_in_flight.load() < static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (split) options.push_back("--split-compile=2");
  NvrtcOutput nvrtc;
  try {
    nvrtc = run_nvrtc(src, options, ptx, ctx);
  } catch (const Error& e) {
    if (!split || std::string_view(e.what()).find("NVRTC_ERROR_INVALID_OPTION") == std::string_view::npos) throw;
    split_known = false;
    options.pop_back();
    detail::log().debug("NVRTC {} rejects --split-compile; compiling on one thread", nvrtc_version());
    nvrtc = run_nvrtc(src, options, ptx, ctx);
  }
  // Only where holding y leaves fewer than 32 warps a SM is the second copy compiled at all.
  if (const int held = ctas_by_registers(nvrtc, src.threads_per_cta);
      src.row_y_renormalize_option && !ptx && held * src.threads_per_cta < 32 * 32) {
    std::vector<std::string> renormalize = options;
    renormalize.push_back("-DNORMJIT_RENORMALIZE_ROW_Y");
    NvrtcOutput again = run_nvrtc(src, renormalize, ptx, ctx);
    const int renormalized = ctas_by_registers(again, src.threads_per_cta);
    const bool take = renormalized > held && local_memory_bytes(again) <= local_memory_bytes(nvrtc);
    detail::log().debug("{}: {} CTAs per SM holding y, {} normalizing again{}", src.spec, held, renormalized,
                        take ? " (kept)" : "");
    if (take) {
      nvrtc = std::move(again);
      options = std::move(renormalize);
    }
  }

  // ptxas aims a kernel without a minimum CTA count at an occupancy step of its own choosing,
  // and spills a few bytes to reach it where the kernel needs a few registers more. Such a
  // kernel is compiled again asking for one CTA per SM (NORMJIT_LAUNCH_BOUNDS), and the copy
  // with less local memory is kept; so is a kernel that spills more than the generator allowed
  // for the CTAs it asked (NORMJIT_CAPPED_LAUNCH_BOUNDS). Deterministic for the key.
  long local_bytes = ptx ? 0 : local_memory_bytes(nvrtc);
  long first_local_bytes = 0;
  if (src.capped && local_bytes > src.spill_allowance_bytes) {
    // Past the allowance the kernel is compiled as if it had asked for nothing.
    first_local_bytes = local_bytes;
    options.push_back("-DNORMJIT_UNCAPPED");
    nvrtc = run_nvrtc(src, options, ptx, ctx);
    local_bytes = local_memory_bytes(nvrtc);
    detail::log().debug("{}: {} B of local memory, past its {} B spill allowance; uncapped: {} B", src.spec,
                        first_local_bytes, src.spill_allowance_bytes, local_bytes);
  } else if (local_bytes <= src.spill_allowance_bytes) {
    local_bytes = 0;  // within the allowance: kept
  }
  if (local_bytes > 0) {
    if (first_local_bytes == 0) first_local_bytes = local_bytes;
    std::vector<std::string> relaxed = options;
    relaxed.push_back("-DNORMJIT_NO_OCCUPANCY_SPILL");
    NvrtcOutput retry = run_nvrtc(src, relaxed, ptx, ctx);
    const long retry_bytes = local_memory_bytes(retry);
    detail::log().debug("{}: {} B of local memory; with one CTA per SM asked: {} B{}", src.spec, local_bytes,
                        retry_bytes, retry_bytes < local_bytes ? " (kept)" : "");
    if (retry_bytes < local_bytes) nvrtc = std::move(retry);
  }

  CompileResult out;
  out.log = std::move(nvrtc.log);
  out.first_local_bytes = static_cast<int>(first_local_bytes);
  Binary& b = out.binary;
  b.spec = src.spec;
  b.kernel_name = src.kernel_name;
  b.is_ptx = ptx;
  b.threads_per_cta = src.threads_per_cta;
  b.rows_per_cta = src.rows_per_cta;
  b.image = std::move(nvrtc.image);
  b.arch = ptx ? options[0].substr(6) : target.str();
  out.milliseconds = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  detail::log().debug("compiled {} for {} in {:.1f} ms{}", src.spec, b.arch, out.milliseconds,
                      out.log.empty() ? "" : "; log: " + out.log);
  return out;
}

namespace {

// One program of several specs' sources: their #include lines once, at the top, then each body in
// a namespace of its own (every body defines the same names in an anonymous namespace).
GeneratedSource combined_source(const std::vector<const GeneratedSource*>& members) {
  std::set<std::string> included;
  std::string includes, bodies;
  int kernels = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    std::istringstream lines(members[i]->source);
    bodies += "namespace normjit_batch_" + std::to_string(i) + " {\n";
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("#include", 0) == 0) {
        if (included.insert(line).second) includes += line + "\n";
      } else {
        bodies += line + "\n";
      }
    }
    bodies += "}  // namespace normjit_batch_" + std::to_string(i) + "\n";
    kernels += members[i]->kernels;
  }
  GeneratedSource g;
  g.spec = members.front()->spec + " and " + std::to_string(members.size() - 1) + " more (batch)";
  g.kernel_name = members.front()->kernel_name + "_batch";
  g.source = includes + bodies;
  g.kernels = kernels;
  return g;
}

}  // namespace

std::vector<CompileResult> compile_batch(const std::vector<GeneratedSource>& srcs, const Target& target, bool split) {
  std::vector<CompileResult> out(srcs.size());
  std::vector<bool> done(srcs.size(), false);
  bool ptx = false;
  std::vector<std::string> options = compile_options(target, &ptx);
  // Batched: batchable specs whose compile() takes a single NVRTC run unless they spill (seen
  // below, per kernel); a spec compiled twice by choice (row_y_renormalize_option) is compiled
  // alone.
  std::vector<const GeneratedSource*> members;
  std::vector<size_t> member_index;
  for (size_t i = 0; i < srcs.size(); ++i)
    if (!ptx && srcs[i].batchable && !srcs[i].row_y_renormalize_option) {
      members.push_back(&srcs[i]);
      member_index.push_back(i);
    }
  if (members.size() >= 2) {
    const auto start = std::chrono::steady_clock::now();
    const GeneratedSource combined = combined_source(members);
    // --split-compile (two threads where a core is idle) only when asked, for a batch of one-kernel
    // programs: with it a batch of backward programs came out with other registers than alone (3
    // of 12 kernels of six specs), and so did 3 of 90 tuning candidates (streamed-row forwards);
    // without it every kernel of the default manifest and of those candidates was the same.
    std::optional<NvrtcOutput> batch;
    {
      struct InFlight {
        InFlight() { ++compiles_in_flight; }
        ~InFlight() { --compiles_in_flight; }
      } in_flight;
      const bool one_kernel_each = std::all_of(members.begin(), members.end(),
                                               [](const GeneratedSource* m) { return m->kernels == 1; });
      if (split && one_kernel_each &&
          compiles_in_flight.load() < static_cast<int>(std::max(1u, std::thread::hardware_concurrency())))
        options.push_back("--split-compile=2");
      try {
        batch = run_nvrtc(combined, options, false, "compiling " + combined.spec + " for " + target.str());
      } catch (const Error& e) {
        // Each member compiled alone below: a failure then names its own spec.
        detail::log().debug("a batch of {} specs did not compile ({}); compiling them one at a time", members.size(),
                            e.what());
      }
    }
    const auto frames = batch ? cubin_frame_bytes(batch->image) : std::nullopt;
    if (frames) {
      const double each = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
                          static_cast<double>(members.size());
      for (size_t m = 0; m < members.size(); ++m) {
        const GeneratedSource& src = *members[m];
        // Local memory in any of its kernels: compile() alone would try other launch bounds for it.
        int found = 0;
        bool spills = false;
        for (const auto& [function, frame] : *frames) {
          if (!is_kernel_of(src, function)) continue;
          ++found;
          spills |= frame > 0;
        }
        if (found != src.kernels || spills) continue;
        CompileResult& r = out[member_index[m]];
        r.binary.image = batch->image;  // the batch's image: every member's kernel is in it
        r.binary.arch = target.str();
        r.binary.spec = src.spec;
        r.binary.kernel_name = src.kernel_name;
        r.binary.threads_per_cta = src.threads_per_cta;
        r.binary.rows_per_cta = src.rows_per_cta;
        r.log = batch->log;
        r.milliseconds = each;
        done[member_index[m]] = true;
      }
    }
  }
  for (size_t i = 0; i < srcs.size(); ++i)
    if (!done[i]) out[i] = compile(srcs[i], target);
  return out;
}

bool is_kernel_of(const GeneratedSource& src, std::string_view function) {
  if (function.substr(0, src.kernel_name.size()) != src.kernel_name) return false;
  const std::string_view suffix = function.substr(src.kernel_name.size());
  return suffix.empty() || suffix == "_fused" || suffix == "_rowsums" || suffix == "_tiles" || suffix == "_reduce";
}

std::vector<KernelResources> parse_ptxas_report(const std::string& log) {
  // ptxas -v prints, per function: "Compiling entry function '<name>' ...", then
  // "<a> bytes stack frame, <b> bytes spill stores, <c> bytes spill loads" and "Used <r> registers".
  std::vector<KernelResources> out;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (auto at = line.find("Compiling entry function '"); at != std::string::npos) {
      const size_t begin = at + 26;
      out.push_back({line.substr(begin, line.find('\'', begin) - begin)});
    } else if (out.empty()) {
      continue;
    } else if (line.find("bytes stack frame") != std::string::npos) {
      std::sscanf(line.substr(line.find_first_of("0123456789")).c_str(),
                  "%d bytes stack frame, %d bytes spill stores, %d bytes spill loads", &out.back().stack_frame_bytes,
                  &out.back().spill_store_bytes, &out.back().spill_load_bytes);
    } else if (auto used = line.find("Used "); used != std::string::npos) {
      std::sscanf(line.c_str() + used, "Used %d registers", &out.back().registers);
    }
  }
  return out;
}

}  // namespace normjit
