// info.cpp — the shared-memory transport's facts for tools (ferry-info).
#include "ferry/runtime.hpp"
#include "net/shm/cma.hpp"

namespace ferry {

std::string shm_large_data_path() { return net::shm::describe_cma(); }

}  // namespace ferry
