// segments.hpp — removes the shared-memory segments a job's ranks left behind.
#pragma once

#include <sys/types.h>

#include <ctime>
#include <string>
#include <vector>

namespace ferryrun {

struct EndedRank {
  pid_t pid = -1;         // -1: never started
  std::time_t ended = 0;  // when it was reaped; 0: it was not
};

struct EndedJob {
  std::vector<EndedRank> ranks;
  std::time_t started = 0;  // just before the first rank was started
  bool unclean = false;     // some rank failed (a signal, a non-zero exit, PMI abort) or the job timed out
  bool sweep_ucx = true;    // false: --keep-ucx-segments
};

// Segments named by a rank's pid (ferry's shared-memory transport, libfabric's shm provider) go
// whatever the job's end. After an unclean end in which every rank was reaped, also UCX's,
// which carry no pid in their names:
//  - POSIX segments ("/dev/shm/ucx_shm_posix_<random>") of this user whose change time lies
//    between the job's start and its last rank's end and that no process has open or mapped.
//    Skipped altogether when that cannot be known: /proc unreadable, or a process of this user
//    whose descriptors cannot be read;
//  - System V segments with no key (IPC_PRIVATE, as UCX makes them) that a rank of the job
//    created while it ran and that nothing has attached.
// Returns one line per UCX segment removed, for the launcher to print.
std::vector<std::string> remove_left_segments(const EndedJob& job);

}  // namespace ferryrun
