// Checks that batched compiles keep every kernel's machine code: the specs of a manifest compiled
// by compile_batch in groups of eight (it batches the batchable ones), forwards and backwards
// apart as normjit-precompile --batch groups them, against compile() of each
// spec alone, compared by the cubins' .text sections. No GPU needed.
//   g++ -std=c++17 -O1 -Iinclude scripts/batch_compare.cpp -o /tmp/batch_compare -Lbuild -lnormjit \
//     -Wl,-rpath,$PWD/build && /tmp/batch_compare manifests/default.txt
// With --candidates after the manifest: each spec's tuning candidates (candidate_configs, eight)
// in one batch, as the tuner compiles them; --split: batches of forwards take --split-compile
// where a core is idle (compile_batch's split = true).
#include <algorithm>
#include <cstdio>
#include <elf.h>
#include <fstream>
#include <map>
#include <string>
#include "normjit/compiler.hpp"
#include "normjit/spec.hpp"
#include "normjit/tuning.hpp"
using namespace normjit;
std::map<std::string, std::string> texts(const std::vector<char>& img) {
  std::map<std::string, std::string> out;
  auto* eh = reinterpret_cast<const Elf64_Ehdr*>(img.data());
  auto* sh = reinterpret_cast<const Elf64_Shdr*>(img.data() + eh->e_shoff);
  const char* names = img.data() + sh[eh->e_shstrndx].sh_offset;
  for (int i = 0; i < eh->e_shnum; ++i) {
    std::string n = names + sh[i].sh_name;
    if (n.rfind(".text.", 0) == 0) out[n.substr(6)] = std::string(img.data() + sh[i].sh_offset, sh[i].sh_size);
  }
  return out;
}
int main(int argc, char** argv) {
  std::ifstream in(argv[1]);
  bool candidates = false, split = false;
  for (int i = 2; i < argc; ++i) {
    candidates |= std::string(argv[i]) == "--candidates";
    split |= std::string(argv[i]) == "--split";
  }
  std::vector<GeneratedSource> srcs;
  std::vector<std::vector<GeneratedSource>> groups;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    if (candidates) {
      std::vector<GeneratedSource> group;
      for (const BlockConfig& b : candidate_configs(Spec::parse(line), 90, 16, 8)) {
        Spec s = Spec::parse(line);
        s.block = b;
        group.push_back(generate(s));
      }
      groups.push_back(group);
      continue;
    }
    srcs.push_back(generate(resolve(Spec::parse(line), 16, 90)));
  }
  // As normjit-precompile --batch groups them: forwards, then backwards (one-kernel programs only
  // take --split-compile in a batch).
  std::stable_partition(srcs.begin(), srcs.end(), [](const GeneratedSource& g) { return g.kernels == 1; });
  int same = 0, diff = 0, batched = 0;
  for (size_t at = 0; at < srcs.size(); at += 8)
    groups.emplace_back(srcs.begin() + at, srcs.begin() + std::min(srcs.size(), at + 8));
  size_t specs = 0;
  for (const std::vector<GeneratedSource>& group : groups) {
    specs += group.size();
    auto b = compile_batch(group, Target{90}, split);
    for (size_t i = 0; i < group.size(); ++i) {
      auto want = texts(compile(group[i], Target{90}).binary.image);
      auto got = texts(b[i].binary.image);
      batched += got.size() > want.size();
      for (auto& [f, code] : want) { if (got.count(f) && got[f] == code) ++same; else { ++diff; std::printf("DIFF %s\n", f.c_str()); } }
    }
  }
  std::printf("%zu specs, %d batched; kernels identical %d, different %d\n", specs, batched, same, diff);
  return diff ? 1 : 0;
}
