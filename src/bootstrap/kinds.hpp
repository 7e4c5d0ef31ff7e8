// kinds.hpp — constructors of the concrete bootstraps, for factory.cpp and the tests.
#pragma once

#include <memory>

#include "bootstrap/bootstrap.hpp"

namespace ferry::bootstrap::detail {

std::unique_ptr<Bootstrap> make_single();
std::unique_ptr<Bootstrap> make_pmi1();
#ifdef FERRY_HAVE_PMIX
std::unique_ptr<Bootstrap> make_pmix();
#endif

}  // namespace ferry::bootstrap::detail
