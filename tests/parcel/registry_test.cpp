// The parcelport registry (ferry/parcel.hpp): names, factories, and the errors a program gets
// for a kind it did not register. No runtime is created: the factories here make a stub.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "ferry/error.hpp"
#include "ferry/parcel.hpp"
#include "test_support.hpp"

using namespace ferry::parcel;

namespace {

class Stub final : public Parcelport {
 public:
  explicit Stub(std::string kind) : kind_(std::move(kind)) {}
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  std::string name() const override { return kind_; }
  std::string transport() const override { return "none"; }
  void send(int, Parcel&&, SentCallback) override {}
  bool background_work() override { return false; }
  void barrier() override {}
  std::uint64_t parcels_sent() const noexcept override { return 0; }
  std::uint64_t parcels_delivered() const noexcept override { return 0; }

 private:
  std::string kind_;
};

std::unique_ptr<Parcelport> make_stub(const ParcelportOptions& o, Upcalls&) { return std::make_unique<Stub>(o.kind); }
std::unique_ptr<Parcelport> make_other_stub(const ParcelportOptions& o, Upcalls&) {
  return std::make_unique<Stub>(o.kind + "-other");
}

using test::NoUpcalls;
using test::error_of;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(ParcelportRegistry, FerryIsAlwaysThereAndFirst) {
  const auto kinds = parcelport_kinds();
  ASSERT_FALSE(kinds.empty());
  EXPECT_EQ(kinds.front(), "ferry");
}

TEST(ParcelportRegistry, ARegisteredKindIsMadeByItsFactory) {
  register_parcelport("stub", &make_stub);
  register_parcelport("stub", &make_stub);  // the same pair again: nothing happens
  const auto kinds = parcelport_kinds();
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), "stub"), 1);
  NoUpcalls up;
  ParcelportOptions o;
  o.kind = "stub";
  auto p = make_parcelport(o, up);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->name(), "stub");
}

TEST(ParcelportRegistry, BadRegistrationsNameTheArgument) {
  register_parcelport("stub2", &make_stub);
  try {
    register_parcelport("stub2", &make_other_stub);
    FAIL() << "a second factory under one name was accepted";
  } catch (const ferry::Error& e) {
    EXPECT_TRUE(has(e.what(), "name='stub2'")) << e.what();
  }
  EXPECT_THROW(register_parcelport("", &make_stub), ferry::Error);
  EXPECT_THROW(register_parcelport("ferry", &make_stub), ferry::Error);
  try {
    register_parcelport("null", nullptr);
    FAIL() << "a null factory was accepted";
  } catch (const ferry::Error& e) {
    EXPECT_TRUE(has(e.what(), "name='null'") && has(e.what(), "null")) << e.what();
  }
}

TEST(ParcelportRegistry, AnUnknownKindNamesTheSettingAndListsTheValidOnes) {
  ParcelportOptions o;
  o.kind = "carrier_pigeon";
  const std::string what = error_of(o);
  EXPECT_TRUE(has(what, "FERRY_PARCELPORT=carrier_pigeon")) << what;
  EXPECT_TRUE(has(what, "ferry")) << what;
}

// This program does not register the MPI baselines: asking for one says how to get it (or,
// in a build without MPICH, that it was not built).
TEST(ParcelportRegistry, AnUnregisteredMpiKindSaysHowToGetIt) {
  for (const char* kind : {"mpi", "mpi_a", "mpix"}) {
    ParcelportOptions o;
    o.kind = kind;
    const std::string what = error_of(o);
    EXPECT_TRUE(has(what, std::string("FERRY_PARCELPORT=") + kind)) << what;
    EXPECT_TRUE(has(what, "register_mpi_parcelports") || has(what, "MPICH")) << what;
  }
}

}  // namespace
