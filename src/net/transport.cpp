#include "net/transport.hpp"

#include <cstring>

namespace ferry::net {

std::string error_text(const char* call, int rc) {
  const int e = rc < 0 ? -rc : rc;
  return std::string(call) + ": " + std::strerror(e) + " (" + std::to_string(rc) + ")";
}

}  // namespace ferry::net
