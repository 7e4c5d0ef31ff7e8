// app_main.hpp — what every proxy application's main() does before its runtime starts: parse
// the command line, check it, and check the parcelport's name. Header-only: each program
// compiles it with its own FERRY_HAVE_PARCEL_MPI.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>

#include "ferry/parcel.hpp"
#ifdef FERRY_HAVE_PARCEL_MPI
#include "ferry/parcel_mpi.hpp"
#endif

namespace apps {

constexpr int exit_usage = 2;  // a command line that can never work (a failed run is 1)

// Before the runtime exists the rank is unknown; every launcher ferry supports sets one of these.
inline bool is_rank_zero_by_env() {
  for (const char* name : {"PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return std::strcmp(v, "0") == 0;
  }
  return true;
}

inline void check_range(const char* option, std::int64_t v, std::int64_t lo, std::int64_t hi) {
  if (v < lo || v > hi) {
    throw std::invalid_argument(std::string(option) + " " + std::to_string(v) + " is out of range (allowed: " +
                                std::to_string(lo) + " to " + std::to_string(hi) + ")");
  }
}

// Parses the command line and runs `check` (which throws std::invalid_argument naming the
// option and value). Returns -1 to go on, else the exit code. Every rank reports a bad command
// line (a launcher may end the job on the first rank's exit); help comes from rank 0 only.
template <class Check>
int parse(CLI::App& app, int argc, char** argv, const char* program, Check check) {
  try {
    app.parse(argc, argv);
    check();
  } catch (const CLI::CallForHelp& e) {
    return is_rank_zero_by_env() ? app.exit(e) : 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: error: %s\nRun with --help for usage.\n", program, e.what());
    return exit_usage;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return exit_usage;
  }
  return -1;
}

// Registers the MPI parcelports when the program has them; -1 when `parcelport` names one this
// build has, else exit_usage after a message listing those it has.
inline int check_parcelport(const char* program, const std::string& parcelport) {
#ifdef FERRY_HAVE_PARCEL_MPI
  ferry::parcel::register_mpi_parcelports();
#endif
  const auto kinds = ferry::parcel::parcelport_kinds();
  if (std::find(kinds.begin(), kinds.end(), parcelport) != kinds.end()) return -1;
  std::string list;
  for (const auto& k : kinds) list += (list.empty() ? "" : ", ") + k;
  std::fprintf(stderr, "%s: error: --parcelport '%s' is not one this build supports (%s)\n", program, parcelport.c_str(),
               list.c_str());
  return exit_usage;
}

}  // namespace apps
