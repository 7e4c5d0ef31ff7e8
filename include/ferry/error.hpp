// ferry/error.hpp — the exception type for setup errors and invalid arguments.
//
// Fast-path calls report back-pressure as Status::retry (see status.hpp); they throw
// ferry::Error only for arguments that can never succeed (a rank out of range, a null
// buffer with a non-zero size, ...). The message always names the argument and its value.
#pragma once

#include <stdexcept>
#include <string>

namespace ferry {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error("ferry: " + what) {}
};

// A collective (Runtime::barrier, Runtime::finalize) or a wait that cannot finish because a
// peer failed; rank() is the first failed rank this process learned of.
class PeerFailed : public Error {
 public:
  PeerFailed(int rank, const std::string& what) : Error(what), rank_(rank) {}
  int rank() const noexcept { return rank_; }

 private:
  int rank_;
};

}  // namespace ferry
