// Every call after Runtime::finalize() throws ferry::Error saying so; exit 0 if all did.
#include <cstdio>
#include <string>

#include "ferry/ferry.hpp"

int main() {
  ferry::Runtime rt;
  ferry::Device& dev = rt.device();
  ferry::CompletionQueue cq;
  char byte = 0;
  rt.finalize();
  int missing = 0;
  auto expect = [&](const char* what, auto&& f) {
    try {
      (void)f();
      std::fprintf(stderr, "rank %d: %s after finalize did not throw\n", rt.rank(), what);
      ++missing;
    } catch (const ferry::Error& e) {
      if (std::string(e.what()).find("after the runtime was finalized") == std::string::npos) {
        std::fprintf(stderr, "rank %d: %s: unexpected message: %s\n", rt.rank(), what, e.what());
        ++missing;
      }
    }
  };
  expect("post_am", [&] { return dev.post_am({.rank = 0, .buffer = &byte, .size = 1}); });
  expect("post_send", [&] { return dev.post_send({.rank = 0, .buffer = &byte, .size = 1}); });
  expect("post_recv", [&] { return dev.post_recv({.rank = 0, .buffer = &byte, .size = 1}); });
  expect("post_put", [&] { return dev.post_put({.rank = 0, .buffer = &byte, .size = 1}); });
  expect("post_get", [&] { return dev.post_get({.rank = 0, .buffer = &byte, .size = 1}); });
  expect("register_memory", [&] { return dev.register_memory(&byte, 1); });
  expect("device", [&] { return &rt.device(0); });
  expect("expose", [&] { return rt.expose(cq, 1); });
  expect("barrier", [&] { rt.barrier(); return 0; });
  if (missing == 0) std::printf("rank %d: every call after finalize was refused\n", rt.rank());
  return missing == 0 ? 0 : 1;
}
