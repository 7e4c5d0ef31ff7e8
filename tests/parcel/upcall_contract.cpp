// An Upcalls::allocate_zc_chunks that returns the wrong number of chunks breaks its contract:
// the receiving rank's background_work() throws ferry::Error naming both counts (the parcel
// is lost; nothing is written through a chunk that was not returned), and the job still
// reaches its barrier and ends. Two ranks: rank 0 sends one parcel with two zero-copy chunks,
// rank 1's upcall returns one. Exit 0 when both ranks saw what they should.
//   ferryrun -n 2 ferry-parcel-upcall-contract --parcelport ferry
//   mpiexec.hydra -n 2 ferry-parcel-upcall-contract --parcelport mpi_a
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ferry/error.hpp"
#include "ferry/parcel.hpp"
#include "test_support.hpp"
#ifdef FERRY_HAVE_PARCEL_MPI
#include "ferry/parcel_mpi.hpp"
#endif

using namespace ferry::parcel;

namespace {

class ShortUpcalls final : public Upcalls {
 public:
  std::vector<Chunk> allocate_zc_chunks(int, const Chunk&, const std::vector<std::size_t>& sizes) override {
    ++calls;
    std::vector<Chunk> out;
    for (std::size_t i = 0; i + 1 < sizes.size(); ++i) out.push_back({storage + 64 * i, sizes[i]});
    return out;
  }
  void handle_parcel(int, Parcel&&) override { ++delivered; }
  std::byte storage[256]{};
  int calls = 0, delivered = 0;
};

}  // namespace

int main(int argc, char** argv) {
  ParcelportOptions opt;
  if (!test::parse_parcelport_argument("upcall_contract", argc, argv, opt)) return 2;
#ifdef FERRY_HAVE_PARCEL_MPI
  register_mpi_parcelports();
#endif
  ShortUpcalls up;
  auto pp = make_parcelport(opt, up);
  const int me = pp->rank();
  if (pp->size() != 2) {
    std::fprintf(stderr, "upcall_contract: needs 2 ranks, got %d\n", pp->size());
    return 2;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool ok = false;
  if (me == 0) {
    std::byte nzc[16]{}, a[8]{}, b[8]{};
    Parcel p;
    p.nzc = {nzc, sizeof nzc};
    p.zc = {Chunk{a, sizeof a}, Chunk{b, sizeof b}};
    bool sent = false;
    pp->send(1, std::move(p), [&sent] { sent = true; });
    while (!sent && std::chrono::steady_clock::now() < deadline) pp->background_work();
    ok = sent;
    if (!sent) std::fprintf(stderr, "rank 0: the parcel's on_sent never ran\n");
  } else {
    std::string what;
    while (what.empty() && std::chrono::steady_clock::now() < deadline) {
      try {
        pp->background_work();
      } catch (const ferry::Error& e) {
        what = e.what();
      }
    }
    ok = what.find("allocate_zc_chunks returned 1 chunks for 2") != std::string::npos && up.calls == 1 &&
         up.delivered == 0;
    std::fprintf(stderr, "rank 1 (%s): %s (upcall calls %d, delivered %d)\n", pp->name().c_str(),
                 what.empty() ? "no error within 30 s" : what.c_str(), up.calls, up.delivered);
  }
  pp->barrier();
  pp.reset();
  std::printf("rank %d: %s\n", me, ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
