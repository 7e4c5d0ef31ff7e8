// parcel_ring: the parcel layer on its own (ferry/parcel.hpp), in C++17. Every rank sends one
// parcel to every rank — a small nonzero-copy chunk and one 64 KiB zero-copy chunk — and
// checks what arrives. Built with FERRY_HAVE_PARCEL_MPI it also registers the MPI baselines,
// so FERRY_PARCELPORT=mpi works under mpiexec.hydra.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ferry/error.hpp"
#include "ferry/parcel.hpp"
#ifdef FERRY_HAVE_PARCEL_MPI
#include "ferry/parcel_mpi.hpp"
#endif

namespace parcel = ferry::parcel;

namespace {

constexpr std::size_t kZcBytes = 64 * 1024;

std::byte pattern(int source, std::size_t i) { return static_cast<std::byte>((i * 7 + static_cast<std::size_t>(source)) & 0xFF); }

struct Receiver final : parcel::Upcalls {
  std::vector<parcel::Chunk> allocate_zc_chunks(int, const parcel::Chunk&, const std::vector<std::size_t>& sizes) override {
    std::vector<parcel::Chunk> out;
    for (std::size_t s : sizes) out.push_back({static_cast<std::byte*>(std::malloc(s != 0 ? s : 1)), s});
    return out;
  }
  void handle_parcel(int source, parcel::Parcel&& p) override {
    int claimed = -1;
    if (p.nzc.size == sizeof claimed) std::memcpy(&claimed, p.nzc.data, sizeof claimed);
    bool ok = claimed == source && p.zc.size() == 1 && p.zc[0].size == kZcBytes;
    for (std::size_t i = 0; ok && i < kZcBytes; ++i) ok = p.zc[0].data[i] == pattern(source, i);
    if (!ok) bad.fetch_add(1);
    if (p.zc_storage.empty()) {
      for (auto& c : p.zc) std::free(c.data);
    }
    received.fetch_add(1);
  }
  std::atomic<int> received{0}, bad{0};
};

}  // namespace

int main() {
#ifdef FERRY_HAVE_PARCEL_MPI
  parcel::register_mpi_parcelports();
#endif
  parcel::ParcelportOptions options;
  if (const char* kind = std::getenv("FERRY_PARCELPORT"); kind != nullptr && *kind != '\0') options.kind = kind;
  Receiver receiver;
  try {
    std::unique_ptr<parcel::Parcelport> pp = parcel::make_parcelport(options, receiver);
    const int me = pp->rank(), n = pp->size();
    std::vector<std::byte> zc(kZcBytes);
    for (std::size_t i = 0; i < kZcBytes; ++i) zc[i] = pattern(me, i);
    int stamp = me;
    std::atomic<int> sent{0};
    for (int dest = 0; dest < n; ++dest) {
      parcel::Parcel p;
      p.nzc = {reinterpret_cast<std::byte*>(&stamp), sizeof stamp};
      p.zc.push_back({zc.data(), zc.size()});
      pp->send(dest, std::move(p), [&sent] { sent.fetch_add(1); });
    }
    while (receiver.received.load() < n || sent.load() < n) {
      if (!pp->background_work()) std::this_thread::yield();
    }
    pp->barrier();  // nobody tears down while a peer may still need it
    std::printf("parcel_ring: rank %d of %d: %d parcels received over %s, %d bad\n", me, n, receiver.received.load(),
                pp->name().c_str(), receiver.bad.load());
    return receiver.bad.load() == 0 ? 0 : 1;
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "parcel_ring: %s\n", e.what());
    return 2;
  }
}
