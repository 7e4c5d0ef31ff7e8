// factory.cpp — choosing a bootstrap by name or from the launch environment.
#include <cstdlib>
#include <string>
#include <string_view>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/kinds.hpp"
#include "ferry/error.hpp"

namespace ferry::bootstrap {

std::string_view detect_bootstrap_kind() {
  // If a launcher sets both, PMIx is preferred: it is the richer interface of the two.
  const bool pmix_env = std::getenv("PMIX_RANK") != nullptr;
#ifdef FERRY_HAVE_PMIX
  if (pmix_env) return "pmix";
#endif
  if (std::getenv("PMI_FD") != nullptr) return "pmi1";
  // Under a PMIx-only launcher a build without PMIx must not quietly become N jobs of one
  // rank each; "pmix" makes make_bootstrap() say why it cannot run.
  if (pmix_env) return "pmix";
  return "single";
}

std::unique_ptr<Bootstrap> make_bootstrap(std::string_view kind) {
  const std::string_view resolved = kind == "auto" ? detect_bootstrap_kind() : kind;
  if (resolved == "single") return detail::make_single();
  if (resolved == "pmi1") return detail::make_pmi1();
  if (resolved == "pmix") {
#ifdef FERRY_HAVE_PMIX
    return detail::make_pmix();
#else
    throw ferry::Error(std::string("bootstrap pmix: this build of ferry has no PMIx support (configured without "
                                   "libpmix or with FERRY_WITH_PMIX=OFF)") +
                       (kind == "auto" ? "; it was chosen because PMIX_RANK is set, so the launcher speaks PMIx: "
                                         "rebuild with libpmix-dev, or launch with ferryrun or mpiexec.hydra"
                                       : ""));
#endif
  }
  throw ferry::Error("FERRY_BOOTSTRAP='" + std::string(kind) +
                     "' is not a bootstrap; valid: auto, single, pmi1, pmix");
}

}  // namespace ferry::bootstrap
