// normjit-build-generic: compiles the generic kernels (generator/generic.cpp) when normjit is built
// and writes generic_images.cpp, which embeds the images (.incbin) in the library: one program per
// x dtype and program (norm: sm_80 and sm_90 cubins and compute_90 PTX; quant: sm_90 and
// compute_90). Build-time only; not installed.
//
// Each cubin is NVRTC's PTX for its arch assembled by the toolkit's ptxas (given as the third
// argument, of NVRTC's release): the same machine code as NVRTC's own cubin (every kernel's
// .text compared), in about half the time, since the compute_90 PTX that ships is compiled once
// and ptxas then runs once a program. NVRTC's compile() would run ptxas twice: two of the norm
// program's 258 kernels spill a few bytes, and it tries again with other launch bounds, which
// the generic kernels, whose bounds are fixed, ignore. Without a matching ptxas, NVRTC builds the cubins.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "normjit/compiler.hpp"
#include "normjit/error.hpp"
#include "normjit/generic.hpp"

namespace fs = std::filesystem;

namespace {

// One entry of the image table.
struct Image {
  normjit::DType x;
  normjit::GenericProgram program;
  int arch;  // sm_XY cubin, or compute_XY PTX
  bool ptx;
  fs::path file;
};

// A program's PTX for one arch, then its cubin for that arch: one thread's work.
struct Chain {
  normjit::DType x;
  normjit::GenericProgram program;
  int arch;
  fs::path ptx_file;  // written for arch 90 only: the compute_90 PTX that ships
  fs::path cubin_file;
};

std::string quoted(const fs::path& p) {
  std::string out = "'";
  for (char c : p.string()) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// ptxas's release ("13.0") from `ptxas --version`; empty where it does not run.
std::string ptxas_release(const fs::path& ptxas) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen((quoted(ptxas) + " --version 2>/dev/null").c_str(), "r"), pclose);
  if (!pipe) return {};
  std::string text;
  char buf[256];
  while (std::fgets(buf, sizeof buf, pipe.get())) text += buf;
  const size_t at = text.find("release ");
  return at == std::string::npos ? std::string() : text.substr(at + 8, text.find(',', at) - at - 8);
}

void write_file(const fs::path& file, const char* data, size_t size) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(data, static_cast<std::streamsize>(size));
  if (!out) throw std::runtime_error("cannot write " + file.string());
}

const char* dtype_enum(normjit::DType d) {
  switch (d) {
    case normjit::DType::kF32: return "kF32";
    case normjit::DType::kF16: return "kF16";
    case normjit::DType::kBF16: return "kBF16";
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: normjit-build-generic OUT_DIR OUT_CPP [PTXAS]\n");
    return 2;
  }
  const fs::path dir = fs::absolute(argv[1]), cpp = argv[2];
  fs::create_directories(dir);
  const fs::path ptxas = argc == 4 ? fs::path(argv[3]) : fs::path();
  const int nvrtc = normjit::nvrtc_version();
  const std::string nvrtc_release = std::to_string(nvrtc / 1000) + "." + std::to_string(nvrtc % 1000 / 10);
  const std::string release = ptxas.empty() ? std::string() : ptxas_release(ptxas);
  const bool use_ptxas = !release.empty() && release == nvrtc_release;
  if (!use_ptxas)
    std::printf("normjit-build-generic: %s; NVRTC %s builds the cubins\n",
                ptxas.empty() ? "no ptxas given"
                              : (release.empty() ? "ptxas " + ptxas.string() + " does not run"
                                                 : "ptxas " + ptxas.string() + " is release " + release)
                                    .c_str(),
                nvrtc_release.c_str());
  std::vector<Image> images;
  std::vector<Chain> chains;
  for (normjit::GenericProgram program : {normjit::GenericProgram::kQuant, normjit::GenericProgram::kNorm})
    for (normjit::DType x : normjit::generic_program_dtypes()) {
      const std::string stem = std::string("generic_") + normjit::to_string(x) + "_" + normjit::to_string(program);
      for (int arch : {80, 90}) {
        if (normjit::generic_program_min_arch(program) > arch) continue;
        const std::string a = std::to_string(arch);
        chains.push_back({x, program, arch, dir / (stem + ".compute_" + a + ".ptx"), dir / (stem + ".sm_" + a + ".cubin")});
        images.push_back({x, program, arch, false, chains.back().cubin_file});
      }
      images.push_back({x, program, 90, true, dir / (stem + ".compute_90.ptx")});
    }
  // The largest programs first, so that the threads finish together.
  std::stable_sort(chains.begin(), chains.end(), [](const Chain& a, const Chain& b) {
    return (a.program == normjit::GenericProgram::kNorm) > (b.program == normjit::GenericProgram::kNorm);
  });
  const auto start = std::chrono::steady_clock::now();
  std::atomic<size_t> next{0};
  std::mutex mutex;
  std::string failure;
  auto say = [&](const fs::path& file, int kernels, size_t bytes, double seconds) {
    std::lock_guard<std::mutex> lock(mutex);
    std::printf("normjit-build-generic: %s (%d kernels, %zu bytes) in %.1f s\n", file.filename().c_str(), kernels,
                bytes, seconds);
  };
  auto work = [&] {
    for (size_t i; (i = next++) < chains.size();) {
      const Chain& c = chains[i];
      try {
        const normjit::GeneratedSource src = normjit::generic_source(c.x, c.program);
        normjit::CompileResult ptx;
        if (c.arch == 90 || use_ptxas) ptx = normjit::compile_ptx(src, c.arch);
        if (c.arch == 90) {
          // Shipped NUL-terminated, as NVRTC gives it: the driver reads PTX as a C string.
          write_file(c.ptx_file, ptx.binary.image.data(), ptx.binary.image.size());
          say(c.ptx_file, src.kernels, ptx.binary.image.size(), ptx.milliseconds / 1000);
        }
        const auto t0 = std::chrono::steady_clock::now();
        if (use_ptxas) {
          // ptxas reads to the end of the file: the PTX without its terminating NUL.
          const std::string text(ptx.binary.image.data(), strnlen(ptx.binary.image.data(), ptx.binary.image.size()));
          const fs::path input = fs::path(c.cubin_file).replace_extension(".ptx");
          const fs::path log = fs::path(c.cubin_file).replace_extension(".ptxas.log");
          write_file(input, text.data(), text.size());
          fs::remove(c.cubin_file);  // a failed run then leaves no earlier build's cubin behind
          const std::string command = quoted(ptxas) + " -arch=sm_" + std::to_string(c.arch) + " -v " + quoted(input) +
                                      " -o " + quoted(c.cubin_file) + " >" + quoted(log) + " 2>&1";
          const int status = std::system(command.c_str());
          if (status != 0 || !fs::exists(c.cubin_file)) {
            std::ifstream in(log);
            std::stringstream text_log;
            text_log << in.rdbuf();
            throw std::runtime_error("ptxas failed (" + command + "):\n" + text_log.str());
          }
          fs::remove(input);
        } else {
          const normjit::CompileResult r = normjit::compile(src, normjit::Target{c.arch});
          write_file(c.cubin_file, r.binary.image.data(), r.binary.image.size());
        }
        say(c.cubin_file, src.kernels, fs::file_size(c.cubin_file),
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mutex);
        if (failure.empty()) failure = c.cubin_file.filename().string() + ": " + e.what();
      }
    }
  };
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < std::min<size_t>(threads, chains.size()); ++t) pool.emplace_back(work);
  for (std::thread& t : pool) t.join();
  if (!failure.empty()) {
    std::fprintf(stderr, "normjit-build-generic: %s\n", failure.c_str());
    return 1;
  }
  // The images as read-only data (each NUL-terminated: the driver reads PTX as a C string).
  std::string text =
      "// Generated by normjit-build-generic: the generic kernels' images, embedded.\n"
      "#include \"normjit/generic.hpp\"\n\n";
  for (size_t i = 0; i < images.size(); ++i) {
    const std::string sym = "normjit_generic_image_" + std::to_string(i);
    text += "asm(\".section .rodata\\n.balign 16\\n.globl " + sym + "\\n.hidden " + sym + "\\n" + sym +
            ":\\n.incbin \\\"" + images[i].file.string() + "\\\"\\n.byte 0\\n.globl " + sym + "_end\\n.hidden " + sym +
            "_end\\n" + sym + "_end:\\n.previous\\n\");\n";
    text += "extern \"C\" const char " + sym + "[], " + sym + "_end[];\n";
  }
  text += "\nnamespace normjit::detail {\nconst std::vector<GenericImage>& generic_image_table() {\n"
          "  static const std::vector<GenericImage> table = {\n";
  for (size_t i = 0; i < images.size(); ++i) {
    const std::string sym = "normjit_generic_image_" + std::to_string(i);
    const Image& j = images[i];
    text += std::string("      {DType::") + dtype_enum(j.x) + ", GenericProgram::" +
            (j.program == normjit::GenericProgram::kQuant ? "kQuant" : "kNorm") + ", \"" + (j.ptx ? "compute_" : "sm_") +
            std::to_string(j.arch) + "\", " + (j.ptx ? "true" : "false") + ", std::string_view(" + sym + ", " + sym +
            "_end - " + sym + " - 1)},\n";
  }
  text += "  };\n  return table;\n}\n}  // namespace normjit::detail\n";
  // Written every run: the .incbin'd files changed even where this text did not.
  std::ofstream out(cpp, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) {
    std::fprintf(stderr, "normjit-build-generic: cannot write %s\n", cpp.c_str());
    return 1;
  }
  std::printf("normjit-build-generic: %zu images in %.1f s on %u threads\n", images.size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), threads);
  return 0;
}
