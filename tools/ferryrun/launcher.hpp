// launcher.hpp — runs a job of N local ranks to completion and decides ferryrun's exit code.
#pragma once

#include <string>
#include <vector>

namespace ferryrun {

struct Options {
  int size = 0;
  double timeout_s = 0;        // 0: no limit
  std::string timeout_text;    // as the user wrote it, for the timeout message
  bool prefix_output = true;
  // A rank that exits non-zero or is killed is reported (and decides the exit code) but the
  // others run on to their own end: for programs that survive a peer's failure.
  bool keep_going = false;
  // After a failed job, remove UCX's shared-memory segments that no process holds (segments.hpp).
  bool sweep_ucx = true;
  std::vector<std::string> argv;  // program and its arguments
};

// Exit codes beyond the ranks' own.
inline constexpr int kExitUsage = 2;
inline constexpr int kExitLaunchFailed = 1;
inline constexpr int kExitCannotExecute = 126;
inline constexpr int kExitNotFound = 127;
inline constexpr int kExitTimeout = 124;

// Starts the ranks, serves PMI and forwards output until every rank has exited, then
// cleans up. Returns 0 if all ranks exited 0, else the first failure's code (128+signal for
// a rank killed by a signal or for a signal sent to ferryrun, 124 on timeout).
int run_job(const Options& opts);

}  // namespace ferryrun
