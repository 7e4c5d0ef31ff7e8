// fatal_signals.cpp — foreign handlers of fatal signals found by the library they live in.
#include "net/fatal_signals.hpp"

#include <dlfcn.h>

#include <csignal>
#include <cstring>
#include <mutex>

#include "common/log.hpp"

namespace ferry::net {

namespace {

// Libraries below libfabric known to take over fatal signals as they load.
bool foreign(const char* path) noexcept {
  return std::strstr(path, "libinfinipath") != nullptr || std::strstr(path, "libpsm") != nullptr;
}

}  // namespace

void restore_fatal_signals() noexcept {
  static std::mutex serial;
  std::lock_guard<std::mutex> guard(serial);
  for (const int sig : {SIGINT, SIGILL, SIGABRT, SIGBUS, SIGFPE, SIGSEGV, SIGTERM}) {
    struct sigaction now {};
    if (::sigaction(sig, nullptr, &now) != 0) continue;
    void* const handler = (now.sa_flags & SA_SIGINFO) != 0 ? reinterpret_cast<void*>(now.sa_sigaction)
                                                           : reinterpret_cast<void*>(now.sa_handler);
    if (now.sa_handler == SIG_DFL || now.sa_handler == SIG_IGN) continue;
    Dl_info where{};
    if (::dladdr(handler, &where) == 0 || where.dli_fname == nullptr || !foreign(where.dli_fname)) continue;
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    if (::sigaction(sig, &dfl, nullptr) == 0) {
      FERRY_LOG(debug, "signal %d: the handler %s installed is replaced by the default action", sig, where.dli_fname);
    }
  }
}

}  // namespace ferry::net
