// Malformed parcel headers sent to a live parcelport through its real transport. Two ranks:
// rank 0 runs the parcelport under test; rank 1 plays a hostile peer that speaks the wire
// format by hand (a ferry::Runtime for the ferry parcelport, MPI with the parcelport's own
// communicators for the MPI baselines), sends every header below, then one good parcel.
// Rank 0 must survive, count each bad header (parcels_malformed), and deliver the good parcel
// intact and exactly once. Rank 1 mirrors each collective step of the parcelport's set-up and
// teardown, so both ranks end normally. Exit 0 when rank 0 saw exactly that.
//   ferryrun -n 2 ferry-parcel-hostile-header --parcelport ferry
//   mpiexec.hydra -n 2 ferry-parcel-hostile-header --parcelport mpix
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/limits.hpp"
#include "ferry/error.hpp"
#include "ferry/ferry.hpp"
#include "ferry/parcel.hpp"
#include "test_support.hpp"
#include "parcel/header.hpp"
#ifdef FERRY_HAVE_PARCEL_MPI
#include <mpi.h>

#include "ferry/parcel_mpi.hpp"
#include "parcel/mpi_header.hpp"
#endif

using namespace ferry::parcel;
using Bytes = std::vector<std::byte>;

namespace {

constexpr std::size_t kGoodSize = 32;

std::byte good_byte(std::size_t i) { return static_cast<std::byte>(0xA0 ^ (i * 7)); }

template <class Header>
Bytes with(const Header& h, std::size_t extra, const std::vector<std::uint64_t>& sizes = {}) {
  Bytes b(sizeof h + extra);
  std::memcpy(b.data(), &h, sizeof h);
  for (std::size_t i = 0; i < sizes.size() && sizeof h + 8 * (i + 1) <= b.size(); ++i) {
    std::memcpy(b.data() + sizeof h + 8 * i, &sizes[i], 8);
  }
  return b;
}

void fill_good(Bytes& b, std::size_t at) {
  for (std::size_t i = 0; i < kGoodSize; ++i) b[at + i] = good_byte(i);
}

// The ferry parcelport's header (parcel/header.hpp): bad ones, then the good one last.
std::vector<Bytes> ferry_headers() {
  using detail::ParcelHeader;
  const std::uint64_t no_allocation = ferry::detail::kNoAllocation;
  std::vector<Bytes> out;
  out.push_back(Bytes(5));                                                      // shorter than the fixed part
  out.push_back(with(ParcelHeader{0, 0, 1000, 1, 0, 0}, 16));                   // 1000 sizes, room for 2
  out.push_back(with(ParcelHeader{0, 4000, 0, 1, 0, 0}, 10));                   // nzc past the bytes
  out.push_back(with(ParcelHeader{ferry::max_tag, 0, 1, 1, 0, 0}, 8, {8}));     // follow-up on the header tag
  out.push_back(with(ParcelHeader{7, 0, 1, 1, 0, 0}, 8, {no_allocation}));      // a size no allocation meets
  Bytes good = with(ParcelHeader{0, kGoodSize, 0, 1, 0, 0}, kGoodSize);
  fill_good(good, sizeof(ParcelHeader));
  out.push_back(std::move(good));
  return out;
}

class Keep final : public Upcalls {
 public:
  std::vector<Chunk> allocate_zc_chunks(int, const Chunk&, const std::vector<std::size_t>& sizes) override {
    ++allocations;
    return std::vector<Chunk>(sizes.size());  // never reached by a header this test sends
  }
  void handle_parcel(int source, Parcel&& p) override {
    ++delivered;
    bool ok = source == 1 && p.zc.empty() && p.nzc.size == kGoodSize;
    for (std::size_t i = 0; ok && i < kGoodSize; ++i) ok = p.nzc.data[i] == good_byte(i);
    intact = intact || ok;
  }
  int allocations = 0, delivered = 0;
  bool intact = false;
};

// Rank 0: the parcelport under test.
int victim(const ParcelportOptions& opt, std::uint64_t expect_malformed) {
  Keep up;
  auto pp = make_parcelport(opt, up);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while ((up.delivered < 1 || pp->parcels_malformed() < expect_malformed) && std::chrono::steady_clock::now() < deadline) {
    pp->background_work();
  }
  pp->barrier();  // rank 1 has sent everything it will send
  for (int i = 0; i < 1000; ++i) pp->background_work();
  const bool ok = up.delivered == 1 && up.intact && up.allocations == 0 && pp->parcels_malformed() == expect_malformed;
  std::printf("rank 0 (%s): %s: malformed %llu (expected %llu), delivered %d (intact %d), allocation upcalls %d\n",
              pp->name().c_str(), ok ? "ok" : "FAILED", static_cast<unsigned long long>(pp->parcels_malformed()),
              static_cast<unsigned long long>(expect_malformed), up.delivered, up.intact ? 1 : 0, up.allocations);
  pp.reset();
  return ok ? 0 : 1;
}

// Rank 1 against the ferry parcelport: its runtime's set-up, one barrier (the parcelport's
// "every rank listens"), the headers as active messages to its header target, the test's
// barrier, and finalize.
int hostile_ferry() {
  ferry::Runtime rt;
  rt.barrier();
  ferry::Device& dev = rt.device();
  for (const Bytes& b : ferry_headers()) {
    for (;;) {
      const ferry::Status s = dev.post_am({.rank = 0, .buffer = b.data(), .size = b.size(), .target = {1}});
      if (!s.is_retry()) break;
      dev.progress();
    }
  }
  rt.barrier();
  rt.finalize();
  return 0;
}

#ifdef FERRY_HAVE_PARCEL_MPI
// The MPI parcelports' header (parcel/mpi_header.hpp): bad ones, then the good one last.
std::vector<Bytes> mpi_headers() {
  using detail::MpiParcelHeader;
  const std::uint32_t sig = detail::kMpiSignature, piggy = detail::kFlagPiggyback, agg = detail::kFlagAggregate;
  const std::uint64_t no_allocation = ferry::detail::kNoAllocation;
  std::vector<Bytes> out;
  out.push_back(Bytes(10));                                                     // shorter than the fixed part
  out.push_back(with(MpiParcelHeader{0x12345678u, 1, piggy, 0, 0}, 0));         // wrong signature
  out.push_back(with(MpiParcelHeader{sig, 1, 4, 0, 0}, 0));                     // unknown flag
  out.push_back(with(MpiParcelHeader{sig, 1, piggy, 2, 0}, 8));                 // 2 sizes, room for 1
  out.push_back(with(MpiParcelHeader{sig, 1, piggy, 0, 100}, 10));              // nzc not the bytes left
  out.push_back(with(MpiParcelHeader{sig, 0, 0, 0, 16}, 0));                    // follow-up on the header tag
  out.push_back(with(MpiParcelHeader{sig, 3, piggy, 1, 0}, 8, {no_allocation}));  // a size no allocation meets
  Bytes index = with(MpiParcelHeader{sig, 3, piggy | agg, 0, 24}, 24);          // an aggregate of 5 in 24 bytes
  const std::uint64_t five = 5;
  std::memcpy(index.data() + sizeof(MpiParcelHeader), &five, 8);
  out.push_back(std::move(index));
  Bytes good = with(MpiParcelHeader{sig, 2, piggy, 0, kGoodSize}, kGoodSize);
  fill_good(good, sizeof(MpiParcelHeader));
  out.push_back(std::move(good));
  return out;
}

// Rank 1 against an MPI parcelport: MPI set up as the parcelport sets it up (one duplicate of
// MPI_COMM_WORLD per device, in order, so each matches the parcelport's), the headers on the
// header tag (0) of the first, the barrier on it, and teardown.
int hostile_mpi(const std::string& kind) {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  std::vector<MPI_Comm> comms(kind == "mpix" ? 2 : 1);
  for (MPI_Comm& c : comms) MPI_Comm_dup(MPI_COMM_WORLD, &c);
  for (const Bytes& b : mpi_headers()) {
    MPI_Send(b.data(), static_cast<int>(b.size()), MPI_BYTE, 0, 0, comms[0]);
  }
  // Nonblocking, as the parcelport's: a blocking and a nonblocking collective never match.
  MPI_Request barrier = MPI_REQUEST_NULL;
  MPI_Ibarrier(comms[0], &barrier);
  MPI_Wait(&barrier, MPI_STATUS_IGNORE);
  for (MPI_Comm& c : comms) MPI_Comm_free(&c);
  MPI_Finalize();
  return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  ParcelportOptions opt;
  if (!test::parse_parcelport_argument("hostile_header", argc, argv, opt)) return 2;
  const bool mpi = opt.kind != "ferry";
#ifdef FERRY_HAVE_PARCEL_MPI
  register_mpi_parcelports();
#else
  if (mpi) {
    std::fprintf(stderr, "hostile_header: --parcelport %s: built without the MPI parcelports\n", opt.kind.c_str());
    return 2;
  }
#endif
  // The launcher's rank, before anything is set up: PMI_RANK under both ferryrun and hydra.
  const char* r = std::getenv("PMI_RANK");
  const int rank = r != nullptr ? std::atoi(r) : -1;
  if (rank != 0 && rank != 1) {
    std::fprintf(stderr, "hostile_header: needs 2 ranks under ferryrun or mpiexec.hydra (PMI_RANK=%s)\n", r ? r : "unset");
    return 2;
  }
  try {
    if (!mpi) return rank == 0 ? victim(opt, ferry_headers().size() - 1) : hostile_ferry();
#ifdef FERRY_HAVE_PARCEL_MPI
    return rank == 0 ? victim(opt, mpi_headers().size() - 1) : hostile_mpi(opt.kind);
#endif
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
  }
  return 1;
}
