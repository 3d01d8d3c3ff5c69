// The tuning database: measured winners per (device, software versions, spec), as JSON.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>

#include <unistd.h>

#include "normjit/error.hpp"
#include "normjit/tuning.hpp"

namespace normjit {
namespace {

constexpr const char* kFormat = "normjit-tuning-db";
constexpr int kVersion = 1;

auto tie(const TuningKey& k) { return std::tie(k.device, k.sm, k.sm_count, k.driver, k.nvrtc, k.normjit, k.spec); }

std::string config_string(const std::string& spec, const BlockConfig& b) {
  Spec s = Spec::parse(spec);
  s.block = b;
  const std::string full = s.str();
  return full.substr(full.find(".cfg_") + 5);
}

// Whether `a` beats `b`: faster, or as fast with the smaller config string (a total order, so
// merges agree whatever order the databases come in).
bool better(const std::string& spec, const TuningEntry& a, const TuningEntry& b) {
  if (a.us != b.us) return a.us < b.us;
  return config_string(spec, a.config) < config_string(spec, b.config);
}

}  // namespace

bool TuningKey::operator<(const TuningKey& o) const { return tie(*this) < tie(o); }
bool TuningKey::operator==(const TuningKey& o) const { return tie(*this) == tie(o); }

void TuningDb::record(const TuningKey& key, const TuningEntry& entry) {
  auto it = entries_.find(key);
  if (it == entries_.end() || better(key.spec, entry, it->second)) entries_[key] = entry;
}

void TuningDb::merge(const TuningDb& other) {
  for (const auto& [key, entry] : other.entries_) record(key, entry);
}

std::optional<TuningEntry> TuningDb::lookup(const TuningKey& key) const {
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

std::string TuningDb::dump() const {
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& [k, e] : entries_)  // std::map order: the same bytes for the same contents
    entries.push_back({{"device", k.device}, {"sm", k.sm}, {"sm_count", k.sm_count}, {"driver", k.driver},
                       {"nvrtc", k.nvrtc}, {"normjit", k.normjit}, {"spec", k.spec},
                       {"config", config_string(k.spec, e.config)}, {"us", e.us}, {"heuristic_us", e.heuristic_us},
                       {"rows", e.rows}});
  return nlohmann::json{{"format", kFormat}, {"version", kVersion}, {"entries", entries}}.dump(1) + "\n";
}

TuningDb TuningDb::parse(const std::string& text, const std::string& name) {
  auto bad = [&](const std::string& why) -> Error {
    return Error(Status::kInvalidArgument, "tuning database '" + name + "': " + why);
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("not JSON (") + e.what() + ")");
  }
  const bool format_ok = j.is_object() && j.contains("format") && j["format"].is_string() &&
                         j["format"].get<std::string>() == kFormat;
  if (!format_ok) throw bad(std::string("no \"format\": \"") + kFormat + "\" at the top level");
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"].get<int64_t>() != kVersion)
    throw bad("\"version\" must be " + std::to_string(kVersion));
  if (!j.contains("entries") || !j["entries"].is_array()) throw bad("\"entries\" must be an array");
  TuningDb db;
  size_t index = 0;
  for (const auto& e : j["entries"]) {
    const std::string where = "entry " + std::to_string(index++) + ": ";
    try {
      if (!e.is_object()) throw bad(where + "not an object");
      // nlohmann converts a float such as 9e47 to int with undefined behaviour (found by
      // fuzz_tuning_db): integers are checked for type and range first.
      auto integer = [&](const char* name, int64_t lo, int64_t hi, bool required) -> int64_t {
        if (!e.contains(name)) {
          if (required) throw bad(where + "\"" + name + "\" is missing");
          return 0;
        }
        const auto& v = e[name];
        if (!v.is_number_integer()) throw bad(where + "\"" + name + "\" must be an integer");
        const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(hi)
                                                 : v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
        if (!fits) throw bad(where + "\"" + name + "\"=" + v.dump() + " is out of range");
        return v.get<int64_t>();
      };
      constexpr int64_t kIntMax = std::numeric_limits<int>::max();
      TuningKey k;
      k.device = e.at("device").get<std::string>();
      k.sm = static_cast<int>(integer("sm", 0, kIntMax, true));
      k.sm_count = static_cast<int>(integer("sm_count", 0, kIntMax, true));
      k.driver = static_cast<int>(integer("driver", 0, kIntMax, true));
      k.nvrtc = static_cast<int>(integer("nvrtc", 0, kIntMax, true));
      k.normjit = e.at("normjit").get<std::string>();
      const Spec spec = Spec::parse(e.at("spec").get<std::string>());
      if (spec.block) throw bad(where + "\"spec\" carries a block config; it goes in \"config\"");
      k.spec = spec.str();
      // The config must be valid for the spec: parse the spec with it.
      const Spec tuned = Spec::parse(k.spec + ".cfg_" + e.at("config").get<std::string>());
      TuningEntry entry;
      entry.config = *tuned.block;
      entry.us = e.at("us").get<double>();
      entry.heuristic_us = e.value("heuristic_us", 0.0);
      entry.rows = integer("rows", 0, std::numeric_limits<int64_t>::max(), false);
      if (!(entry.us > 0)) throw bad(where + "\"us\" must be a positive time");
      db.record(k, entry);
    } catch (const nlohmann::json::exception& x) {
      throw bad(where + x.what());
    } catch (const Error& x) {
      if (x.status() == Status::kInvalidArgument) throw;
      throw bad(where + x.what());
    }
  }
  return db;
}

TuningDb TuningDb::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(Status::kInvalidArgument, "tuning database '" + path + "' cannot be opened");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path);
}

void TuningDb::save(const std::string& path) const {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << dump();
    out.close();  // a full disk shows only when the buffer is written out
    if (!out) {
      const std::string why = std::strerror(errno);
      std::remove(tmp.c_str());
      throw Error(Status::kInvalidArgument, "cannot write tuning database '" + path + "' (temp file '" + tmp + "'): " + why);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw Error(Status::kInvalidArgument, "cannot write tuning database '" + path + "': " + why);
  }
}

TuningMode tuning_mode_from_env(bool database_exists) {
  const char* v = std::getenv("NORMJIT_TUNING");
  if (!v || !*v) return database_exists ? TuningMode::kDatabase : TuningMode::kHeuristic;
  const std::string s = v;
  if (s == "heuristic") return TuningMode::kHeuristic;
  if (s == "db") return TuningMode::kDatabase;
  if (s == "tune") return TuningMode::kTuneOnMiss;
  throw Error(Status::kInvalidArgument, "NORMJIT_TUNING='" + s + "' is not one of heuristic, db, tune");
}

}  // namespace normjit
