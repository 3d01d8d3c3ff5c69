// Stack-frame sizes read from a cubin's .nv.info sections. The ptxas report in the NVRTC log says
// the same, but a compile can come back without one (tests/main.cpp); the cubin always has them.
#include <cstdint>
#include <cstring>

#include "normjit/compiler.hpp"

namespace normjit {
namespace {

template <class T>
bool read_at(const std::vector<char>& bytes, uint64_t offset, T* out) {
  if (offset > bytes.size() || bytes.size() - offset < sizeof(T)) return false;
  std::memcpy(out, bytes.data() + offset, sizeof(T));
  return true;
}

// A NUL-terminated name inside [table, table + size) of the image, or nullopt.
std::optional<std::string> name_at(const std::vector<char>& bytes, uint64_t table, uint64_t size, uint32_t offset) {
  if (table > bytes.size() || size > bytes.size() - table || offset >= size) return std::nullopt;
  const char* begin = bytes.data() + table + offset;
  const void* end = std::memchr(begin, '\0', size - offset);
  if (!end) return std::nullopt;
  return std::string(begin, static_cast<const char*>(end));
}

struct Section {
  uint32_t name, type, link;
  uint64_t offset, size;
};

constexpr uint8_t kFormatSized = 0x04;  // EIFMT_SVAL: a 16-bit size, then that many bytes
constexpr uint8_t kFrameSize = 0x11;    // EIATTR_FRAME_SIZE: {symbol index, bytes}
constexpr uint32_t kSymbolTable = 2;    // SHT_SYMTAB

}  // namespace

std::optional<std::map<std::string, int>> cubin_frame_bytes(const std::vector<char>& cubin) {
  // ELF64, little-endian; section headers at e_shoff.
  if (cubin.size() < 64 || std::memcmp(cubin.data(), "\x7f" "ELF", 4) != 0 || cubin[4] != 2 || cubin[5] != 1)
    return std::nullopt;
  uint64_t header_offset = 0;
  uint16_t header_size = 0, count = 0, names_index = 0;
  if (!read_at(cubin, 0x28, &header_offset) || !read_at(cubin, 0x3A, &header_size) || !read_at(cubin, 0x3C, &count) ||
      !read_at(cubin, 0x3E, &names_index) || header_size < 64 || names_index >= count)
    return std::nullopt;
  std::vector<Section> sections(count);
  for (uint16_t i = 0; i < count; ++i) {
    const uint64_t at = header_offset + uint64_t{i} * header_size;
    Section& s = sections[i];
    if (!read_at(cubin, at, &s.name) || !read_at(cubin, at + 4, &s.type) || !read_at(cubin, at + 24, &s.offset) ||
        !read_at(cubin, at + 32, &s.size) || !read_at(cubin, at + 40, &s.link))
      return std::nullopt;
  }
  const Section& names = sections[names_index];

  // Symbol index -> name, from the one symbol table.
  std::map<uint32_t, std::string> symbols;
  for (const Section& s : sections) {
    if (s.type != kSymbolTable || s.link >= count) continue;
    const Section& strings = sections[s.link];
    for (uint64_t at = 0; at + 24 <= s.size; at += 24) {
      uint32_t name = 0;
      if (!read_at(cubin, s.offset + at, &name)) return std::nullopt;
      if (auto text = name_at(cubin, strings.offset, strings.size, name)) symbols[static_cast<uint32_t>(at / 24)] = *text;
    }
  }

  std::map<std::string, int> frames;
  for (const Section& s : sections) {
    const auto name = name_at(cubin, names.offset, names.size, s.name);
    if (!name || name->rfind(".nv.info", 0) != 0) continue;
    if (s.offset > cubin.size() || s.size > cubin.size() - s.offset) return std::nullopt;
    // Records: format byte, attribute byte, 16-bit value or size; sized records carry a payload.
    for (uint64_t at = 0; at + 4 <= s.size;) {
      const uint8_t format = static_cast<uint8_t>(cubin[s.offset + at]);
      const uint8_t attribute = static_cast<uint8_t>(cubin[s.offset + at + 1]);
      uint16_t value = 0;
      read_at(cubin, s.offset + at + 2, &value);
      at += 4;
      if (format != kFormatSized) continue;
      if (value > s.size - at) return std::nullopt;
      if (attribute == kFrameSize && value >= 8) {
        uint32_t symbol = 0, bytes = 0;
        read_at(cubin, s.offset + at, &symbol);
        read_at(cubin, s.offset + at + 4, &bytes);
        const auto sym = symbols.find(symbol);
        if (sym == symbols.end()) return std::nullopt;
        frames[sym->second] = static_cast<int>(bytes);
      }
      at += value;
    }
  }
  return frames;
}

}  // namespace normjit
