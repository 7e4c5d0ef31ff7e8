// segments.hpp — removes the shared-memory segments a job's ranks left behind.
#pragma once

#include <sys/types.h>

#include <ctime>
#include <string>
#include <vector>

namespace ferryrun {

struct EndedJob {
  std::vector<pid_t> ranks;  // the pids the ranks had (all of them reaped by now)
  std::time_t started = 0;   // when the first rank was started
  bool unclean = false;      // some rank ended by a signal or a non-zero exit
};

// Segments named by a rank's pid (ferry's shared-memory transport, libfabric's shm provider) go
// whatever the job's end. After an unclean end also UCX's: its POSIX segments
// ("ucx_shm_posix_<random>", named by no pid) that this user owns, that appeared after the job
// started and that no process has open or mapped; its System V segments that a rank created and
// nobody has attached. Returns the names of the UCX segments removed, for the launcher to say so.
std::vector<std::string> remove_left_segments(const EndedJob& job);

}  // namespace ferryrun
