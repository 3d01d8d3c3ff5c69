#pragma once
#include <stdexcept>
#include <string>

namespace normjit {

enum class Status {
  kInvalidArgument,   // a launch argument or API argument is wrong; the message names it and its value
  kInvalidSpec,       // a spec string or value that cannot name a kernel
  kNotSupported,      // a valid spec that this version cannot generate yet
  kCompileFailed,     // NVRTC rejected the source; the message has the spec, options and log
  kDriverUnavailable, // libcuda could not be loaded or has no GPU
  kCudaError,         // a Driver API call failed; the message has the call and the error name
  kCacheError,        // the disk cache could not be read or written
};

const char* to_string(Status s);

// Every error normjit throws. The library never calls exit().
class Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& message)
      : std::runtime_error(std::string(to_string(status)) + ": " + message), status_(status) {}
  Status status() const { return status_; }

 private:
  Status status_;
};

}  // namespace normjit
