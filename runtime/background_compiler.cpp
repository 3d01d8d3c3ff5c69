// Background compiles for async mode (include/normjit/generic.hpp).
#include <algorithm>
#include <cstdlib>
#include <string>

#include "normjit/error.hpp"
#include "normjit/generic.hpp"
#include "runtime/log.hpp"

namespace normjit {

const char* to_string(BackgroundCompiler::State s) {
  switch (s) {
    case BackgroundCompiler::State::kUnknown: return "unknown";
    case BackgroundCompiler::State::kQueued: return "queued";
    case BackgroundCompiler::State::kCompiling: return "compiling";
    case BackgroundCompiler::State::kReady: return "ready";
    case BackgroundCompiler::State::kFailed: return "failed";
  }
  return "?";
}

int BackgroundCompiler::default_threads() {
  if (const char* env = std::getenv("NORMJIT_COMPILE_THREADS"); env && *env) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end != '\0' || v < 1 || v > 256)
      throw Error(Status::kInvalidArgument,
                  std::string("NORMJIT_COMPILE_THREADS='") + env + "' is not a thread count from 1 to 256");
    return static_cast<int>(v);
  }
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 2u));
}

BackgroundCompiler::BackgroundCompiler(CompileFn compile, int threads) : compile_(std::move(compile)) {
  if (threads < 1)
    throw Error(Status::kInvalidArgument, "BackgroundCompiler: threads=" + std::to_string(threads) + " must be >= 1");
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
}

BackgroundCompiler::~BackgroundCompiler() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    const size_t dropped = queue_.size();
    queue_.clear();
    if (dropped > 0 || busy_ > 0)
      detail::log().debug("background compiler stopping: {} queued compile(s) dropped, waiting for {} in flight",
                          dropped, busy_);
  }
  changed_.notify_all();
  for (std::thread& t : workers_) t.join();
}

BackgroundCompiler::State BackgroundCompiler::request(uint64_t key, const Spec& resolved) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = jobs_.find(key); it != jobs_.end()) return it->second.state;
  if (stopping_) return State::kUnknown;
  Job& job = jobs_[key];
  job.spec = resolved;
  queue_.push_back(key);
  changed_.notify_all();
  return State::kQueued;
}

BackgroundCompiler::State BackgroundCompiler::state(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = jobs_.find(key);
  return it == jobs_.end() ? State::kUnknown : it->second.state;
}

std::optional<Binary> BackgroundCompiler::take(uint64_t key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = jobs_.find(key);
  if (it == jobs_.end() || it->second.state != State::kReady) return std::nullopt;
  return std::exchange(it->second.binary, std::nullopt);
}

std::string BackgroundCompiler::error(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = jobs_.find(key);
  return it == jobs_.end() ? std::string() : it->second.error;
}

void BackgroundCompiler::wait_idle() const {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return queue_.empty() && busy_ == 0; });
}

void BackgroundCompiler::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    const uint64_t key = queue_.front();
    queue_.pop_front();
    Job& job = jobs_[key];  // std::map: references stay valid while other jobs are added
    job.state = State::kCompiling;
    const Spec spec = job.spec;
    ++busy_;
    lock.unlock();
    std::optional<Binary> binary;
    std::string error;
    try {
      binary = compile_(spec);
    } catch (const std::exception& e) {
      error = e.what();
    }
    lock.lock();
    --busy_;
    if (binary) {
      job.binary = std::move(binary);
      job.state = State::kReady;
      detail::log().debug("background compile of {} ready", spec.str());
    } else {
      job.error = error;
      job.state = State::kFailed;
      detail::log().warn("background compile of {} failed; its generic kernel keeps running: {}", spec.str(), error);
    }
    changed_.notify_all();
  }
}

}  // namespace normjit
