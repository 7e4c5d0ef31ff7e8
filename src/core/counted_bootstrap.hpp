// counted_bootstrap.hpp — a Bootstrap that counts the reads made through it, for the runtime's
// footprint (Runtime::footprint: the bootstrap reads start-up made). It forwards everything to
// the bootstrap it wraps, which must outlive it; like any Bootstrap, one thread at a time.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "bootstrap/bootstrap.hpp"

namespace ferry::detail {

class CountedBootstrap final : public bootstrap::Bootstrap {
 public:
  explicit CountedBootstrap(bootstrap::Bootstrap& inner) noexcept : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string_view kind() const override { return inner_.kind(); }
  void put(std::string_view key, std::string_view value) override { inner_.put(key, value); }
  void fence() override { inner_.fence(); }
  std::string get(int rank, std::string_view key) override {
    ++reads_;
    return inner_.get(rank, key);
  }
  void barrier() override { inner_.barrier(); }
  void abort(int code, std::string_view message) noexcept override { inner_.abort(code, message); }
  std::size_t reads() const noexcept { return reads_; }

 private:
  bootstrap::Bootstrap& inner_;
  std::size_t reads_ = 0;
};

}  // namespace ferry::detail
