// ferry_parcelport_get.cpp — one-sided reads for the layer above: a region exposed on every
// device (its key one RemoteKey per device), a get checked and posted on the calling thread's
// device (deferred on retry), and the completions of gets drained from their own queue.
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ferry/error.hpp"
#include "parcel/ferry_parcelport_impl.hpp"

namespace ferry::parcel::detail {

namespace {

// A region registered on every device (a get goes through the reading thread's device, and a
// key is checked against the device it is used on); the key is one RemoteKey per device.
class FerryExposedMemory final : public ExposedMemory {
 public:
  explicit FerryExposedMemory(std::vector<MemoryRegion> regions) : regions_(std::move(regions)) {
    key_.resize(regions_.size() * sizeof(RemoteKey));
    for (std::size_t d = 0; d < regions_.size(); ++d) {
      const RemoteKey k = regions_[d].remote_key();
      std::memcpy(key_.data() + d * sizeof k, &k, sizeof k);
    }
  }
  const std::vector<std::byte>& key() const noexcept override { return key_; }

 private:
  std::vector<MemoryRegion> regions_;
  std::vector<std::byte> key_;
};

}  // namespace

std::unique_ptr<ExposedMemory> FerryParcelport::expose_memory(void* data, std::size_t size) {
  std::vector<MemoryRegion> regions;
  for (Device* d : devs_) regions.push_back(d->register_memory(data, size));
  return std::make_unique<FerryExposedMemory>(std::move(regions));
}

void FerryParcelport::get(int rank, const std::vector<std::byte>& key, std::size_t offset, void* dst, std::size_t bytes,
                          GetCallback done) {
  if (rank < 0 || rank >= size()) {
    throw Error("parcel get: rank=" + std::to_string(rank) + " is out of range; the job has " + std::to_string(size()) +
                " ranks");
  }
  if (key.size() != devs_.size() * sizeof(RemoteKey)) {
    throw Error("parcel get: a key of " + std::to_string(key.size()) + " bytes; this parcelport's keys have " +
                std::to_string(devs_.size() * sizeof(RemoteKey)) + " (one per device: is FERRY_DEVICES the same on every rank?)");
  }
  const int d = thread_index() % static_cast<int>(devs_.size());
  RemoteKey k;
  std::memcpy(&k, key.data() + static_cast<std::size_t>(d) * sizeof k, sizeof k);
  if (k.rank != rank || k.device != d) {
    throw Error("parcel get: the key is rank " + std::to_string(k.rank) + "'s (device " + std::to_string(k.device) +
                "), not rank=" + std::to_string(rank) + "'s (device " + std::to_string(d) + ")");
  }
  if (offset > k.size || bytes > k.size - offset) {
    throw Error("parcel get: offset=" + std::to_string(offset) + " + size=" + std::to_string(bytes) +
                " is outside rank " + std::to_string(rank) + "'s region of " + std::to_string(k.size) + " bytes");
  }
  if (bytes == 0) {
    done(0);
    return;
  }
  auto* op = new GetOp{std::move(done)};
  gets_in_flight_.fetch_add(1, std::memory_order_relaxed);
  auto post = [this, d, rank, dst, bytes, k, offset, op]() -> bool {
    const Status s = devs_[static_cast<std::size_t>(d)]->post_get(
        GetArgs{.rank = rank, .buffer = dst, .size = bytes, .remote = k, .offset = offset, .local = &gets_cq_, .context = op});
    if (s.is_retry()) return false;
    if (!s.is_posted()) finish_get(op, s.is_done() ? 0 : peer_failed_error);
    return true;
  };
  if (!post()) defer(std::move(post));
}

// A get of the layer above is done: its record goes, then its callback runs.
void FerryParcelport::finish_get(GetOp* op, int error) {
  GetCallback done = std::move(op->done);
  delete op;
  gets_in_flight_.fetch_sub(1, std::memory_order_relaxed);
  done(error);
}

bool FerryParcelport::drain_gets() {
  bool any = false;
  for (int i = 0; i < 16; ++i) {
    auto c = gets_cq_.pop();
    if (!c) break;
    any = true;
    finish_get(static_cast<GetOp*>(c->context), c->error);
  }
  return any;
}

}  // namespace ferry::parcel::detail
