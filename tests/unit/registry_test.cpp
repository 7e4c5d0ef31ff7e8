// The backend registry (net/registry.hpp): names it does not know, modules that cannot load or
// are not ferry's, and where each backend comes from — each an error that names the setting,
// the file and why.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "ferry/error.hpp"
#include "net/registry.hpp"

namespace {

std::string error_of(auto&& call) {
  try {
    call();
  } catch (const ferry::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Registry, AnUnknownNameIsAnErrorListingTheBackends) {
  const std::string e = error_of([] { ferry::net::backend("nope", "FERRY_TRANSPORT=nope"); });
  EXPECT_NE(e.find("FERRY_TRANSPORT=nope: 'nope' is not a backend of ferry"), std::string::npos) << e;
  for (const std::string& name : ferry::net::backend_names()) EXPECT_NE(e.find(name), std::string::npos) << e;
  EXPECT_EQ(ferry::net::backend_origin("nope"), "unknown");
}

TEST(Registry, BuiltInBackendsNeedNoModule) {
  EXPECT_EQ(ferry::net::backend_origin("shm"), "built in");
  EXPECT_EQ(ferry::net::backend_origin("self"), "built in");
  EXPECT_TRUE(ferry::net::backend_loaded("shm"));
  EXPECT_STREQ(ferry::net::backend("self", "test").name, "self");
}

// What the core plans with and the resolver checks comes from the list compiled into
// libferry, so asking never loads a module.
TEST(Registry, ReachAndOptionRowsAreKnownWithoutLoadingAModule) {
  using ferry::net::Reach;
  const bool ofi = ferry::net::backend_loaded("ofi"), ucx = ferry::net::backend_loaded("ucx");
  EXPECT_EQ(ferry::net::backend_reach("self"), unsigned(Reach::self));
  EXPECT_EQ(ferry::net::backend_reach("shm"), Reach::self | Reach::host);
  EXPECT_EQ(ferry::net::backend_reach("ofi"), Reach::self | Reach::host | Reach::network);
  EXPECT_EQ(ferry::net::backend_reach("ucx"), Reach::self | Reach::host | Reach::network);
  EXPECT_EQ(ferry::net::backend_reach("nope"), 0u);
  std::string with_rows;
  for (const ferry::BackendOptionTable& t : ferry::net::backend_options()) with_rows += std::string(t.backend) + ' ';
  EXPECT_EQ(with_rows, "shm ofi ");
  EXPECT_EQ(ferry::net::backend_loaded("ofi"), ofi);
  EXPECT_EQ(ferry::net::backend_loaded("ucx"), ucx);
  // A built-in backend's registration agrees with its declaration.
  for (const char* name : {"self", "shm"}) EXPECT_EQ(ferry::net::backend(name, "test").reach, ferry::net::backend_reach(name));
}

TEST(Registry, ModulesLieBesideLibferry) {
  for (const char* name : {"ofi", "ucx"}) {
    const std::string origin = ferry::net::backend_origin(name);
    if (origin.rfind("not built", 0) == 0) continue;
    EXPECT_EQ(origin, "module " + ferry::net::module_dir() + "/libferry-" + name + ".so");
  }
}

TEST(Registry, AModuleThatCannotLoadNamesItsPathAndDlerror) {
  const std::string path = ferry::net::module_dir() + "/libferry-missing.so";
  const std::string e = error_of([&] { ferry::net::load_module("missing", path, "FERRY_NETWORK=missing"); });
  EXPECT_NE(e.find("FERRY_NETWORK=missing: cannot load ferry's missing backend module " + path), std::string::npos) << e;
  EXPECT_NE(e.find("No such file"), std::string::npos) << e;  // dlerror's words
}

TEST(Registry, AFileThatIsNotAModuleIsAnError) {
  // Not a shared object at all.
  const std::string text = testing::TempDir() + "ferry-not-a-module.so";
  std::ofstream(text) << "not an ELF file\n";
  std::string e = error_of([&] { ferry::net::load_module("ofi", text, "test"); });
  EXPECT_NE(e.find("cannot load ferry's ofi backend module " + text), std::string::npos) << e;
  std::remove(text.c_str());
  // A shared object that is not ferry's: no registration to find.
  e = error_of([] { ferry::net::load_module("ofi", "libm.so.6", "test"); });
  EXPECT_NE(e.find("libm.so.6 is not ferry's ofi backend module (no ferry_backend_v1)"), std::string::npos) << e;
}

TEST(Registry, AModuleMustRegisterTheNameItIsLoadedFor) {
  const std::string origin = ferry::net::backend_origin("ucx");
  if (origin.rfind("module ", 0) != 0) GTEST_SKIP() << "the ucx backend is " << origin;
  const std::string path = origin.substr(7);
  const std::string e = error_of([&] { ferry::net::load_module("ofi", path, "test"); });
  EXPECT_NE(e.find(path + " is not ferry's ofi backend module (it registers 'ucx')"), std::string::npos) << e;
}

}  // namespace
