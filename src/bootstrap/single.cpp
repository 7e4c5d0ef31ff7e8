// single.cpp — the bootstrap of a job that is one process: nothing to exchange with.
#include <map>
#include <string>
#include <string_view>

#include "bootstrap/kinds.hpp"
#include "ferry/error.hpp"

namespace ferry::bootstrap::detail {
namespace {

class Single final : public Bootstrap {
 public:
  [[nodiscard]] int rank() const override { return 0; }
  [[nodiscard]] int size() const override { return 1; }
  [[nodiscard]] std::string_view kind() const override { return "single"; }

  void put(std::string_view key, std::string_view value) override {
    store_.insert_or_assign(std::string(key), std::string(value));
  }

  void fence() override {}
  void barrier() override {}

  [[nodiscard]] std::string get(int rank, std::string_view key) override {
    if (rank != 0) {
      throw ferry::Error("bootstrap single: get(rank " + std::to_string(rank) + ", key '" + std::string(key) +
                         "'): rank is out of range [0, 1)");
    }
    auto it = store_.find(key);
    if (it == store_.end()) {
      throw ferry::Error("bootstrap single: get(rank 0, key '" + std::string(key) + "'): not found");
    }
    return it->second;
  }

  void abort(int, std::string_view) noexcept override {
    // No launcher to tell; the caller exits with its code.
  }

 private:
  std::map<std::string, std::string, std::less<>> store_;
};

}  // namespace

std::unique_ptr<Bootstrap> make_single() { return std::make_unique<Single>(); }

}  // namespace ferry::bootstrap::detail
