// spawn.hpp — starting one rank: its environment, its pipes, its process group.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace ferryrun {

// ferryrun's environment minus anything that would let a rank believe it was started by a
// different launcher (an outer mpiexec or prterun): PMIX_*, PMI_PORT and the PMI_* values
// ferryrun sets itself.
std::vector<std::string> inherited_environment();

struct SpawnRequest {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH like execvp does
  const std::vector<std::string>* env = nullptr;
  int rank = 0;
  int size = 1;
  bool capture_output = true;  // false: the rank writes straight to ferryrun's stdout/stderr
  int stdin_fd = -1;           // dup'ed onto the rank's stdin; -1 keeps ferryrun's
};

struct SpawnedRank {
  pid_t pid = -1;
  int pmi_fd = -1;  // ferryrun's end of the PMI socketpair
  int out_fd = -1;  // read ends of the stdout/stderr pipes, when captured
  int err_fd = -1;
  int exec_errno = 0;  // non-zero: the program could not be executed (the child is reaped)
  std::string error;   // non-empty: ferryrun itself failed to set the rank up
};

// Forks and execs one rank. Blocks until the exec has succeeded or failed, so a missing
// program is reported once, before more ranks are started.
SpawnedRank spawn_rank(const SpawnRequest& req);

}  // namespace ferryrun
