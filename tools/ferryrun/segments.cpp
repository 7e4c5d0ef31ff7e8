// segments.cpp — the shared-memory segments a job's ranks left behind.
//
// ferry's own segments and libfabric's shm regions carry the creating rank's pid in their
// names, so they are found by name. UCX names its POSIX segments with a random number and, in
// its default mode (UCX_POSIX_USE_PROC_LINK=y), unlinks each soon after creating it (peers open
// it through /proc/<pid>/fd); its System V segments are marked for removal once attached. A rank
// killed in between leaves the segment for good (with UCX_POSIX_USE_PROC_LINK=n a POSIX segment
// stays linked for its whole life, so a killed rank leaves all of its own). The POSIX ones are
// recognised by what is left of them: a "ucx_shm_posix_" file of this user that appeared while
// the job ran and that no process has open or mapped (a segment in use is held by its creator:
// open, or mapped). The System V ones by their creator: a rank of this job, with nothing attached.
#include "segments.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>
#include <unordered_set>

namespace ferryrun {
namespace {

constexpr std::string_view kUcxPosixPrefix = "ucx_shm_posix_";
constexpr std::string_view kShmDir = "/dev/shm/";

bool all_digits(const char* s) {
  if (*s == '\0') return false;
  for (; *s != '\0'; ++s)
    if (*s < '0' || *s > '9') return false;
  return true;
}

// Whether /proc/<pid>/status names `uid` among the process's user ids (readable for every
// process, also one whose other /proc files are closed to us).
bool runs_as(const std::string& base, uid_t uid) {
  FILE* f = std::fopen((base + "/status").c_str(), "re");
  if (f == nullptr) return false;
  char line[256];
  bool found = false;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long ids[4] = {};
    if (std::sscanf(line, "Uid: %lu %lu %lu %lu", &ids[0], &ids[1], &ids[2], &ids[3]) == 4) {
      found = std::find(std::begin(ids), std::end(ids), static_cast<unsigned long>(uid)) != std::end(ids);
      break;
    }
  }
  std::fclose(f);
  return found;
}

// Inodes on device `dev` that some process has open or mapped; nullopt when a process that
// could hold this user's files cannot be seen (/proc unreadable, or a process of this user
// whose descriptors are closed to us, as a non-dumpable one's are).
std::optional<std::unordered_set<ino_t>> held_inodes(dev_t dev) {
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return std::nullopt;
  const uid_t me = ::geteuid();
  std::unordered_set<ino_t> held;
  bool blind = false;
  char* line = nullptr;
  std::size_t cap = 0;
  char target[4096];
  while (const dirent* p = ::readdir(proc)) {
    if (!all_digits(p->d_name)) continue;
    const std::string base = std::string("/proc/") + p->d_name;
    DIR* fds = ::opendir((base + "/fd").c_str());
    if (fds == nullptr) {
      if (errno == ENOENT) continue;  // it ended meanwhile
      if (runs_as(base, me)) {
        blind = true;
        break;
      }
      continue;
    }
    while (const dirent* f = ::readdir(fds)) {
      if (f->d_name[0] == '.') continue;
      // Only descriptors that name a file under /dev/shm are stat'ed (a tmpfs: the stat cannot
      // block on a network file system or a stuck device).
      const ssize_t n = ::readlinkat(::dirfd(fds), f->d_name, target, sizeof target - 1);
      if (n <= 0 || std::string_view(target, static_cast<std::size_t>(n)).substr(0, kShmDir.size()) != kShmDir) continue;
      struct stat st {};
      if (::fstatat(::dirfd(fds), f->d_name, &st, 0) == 0 && st.st_dev == dev) held.insert(st.st_ino);
    }
    ::closedir(fds);
    // maps: "start-end perms offset major:minor inode path"; a segment mapped after its
    // descriptor was closed is held only here. A process that shows its descriptors but not its
    // mappings (one more privileged than ferryrun, such as a container's init) is taken at its
    // descriptors: a non-dumpable process of this user, the case that matters, hides both.
    FILE* maps = std::fopen((base + "/maps").c_str(), "re");
    if (maps == nullptr) continue;
    while (::getline(&line, &cap, maps) > 0) {
      unsigned major = 0, minor = 0;
      unsigned long long ino = 0;
      if (std::sscanf(line, "%*s %*s %*s %x:%x %llu", &major, &minor, &ino) == 3 && ino != 0 &&
          ::makedev(major, minor) == dev) {
        held.insert(static_cast<ino_t>(ino));
      }
    }
    std::fclose(maps);
  }
  std::free(line);
  ::closedir(proc);
  if (blind) return std::nullopt;
  return held;
}

void remove_ucx_posix(const EndedJob& job, std::time_t last_end, std::vector<std::string>& removed) {
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return;
  struct stat shm {};
  if (::fstat(::dirfd(dir), &shm) != 0) {
    ::closedir(dir);
    return;
  }
  std::vector<std::pair<std::string, ino_t>> candidates;
  while (const dirent* e = ::readdir(dir)) {
    if (std::string_view(e->d_name).substr(0, kUcxPosixPrefix.size()) != kUcxPosixPrefix) continue;
    struct stat st {};
    if (::fstatat(::dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || st.st_ctime < job.started || st.st_ctime > last_end) continue;
    candidates.emplace_back(e->d_name, st.st_ino);
  }
  if (!candidates.empty()) {
    if (const auto held = held_inodes(shm.st_dev)) {
      for (const auto& [name, ino] : candidates) {
        if (held->count(ino) != 0) continue;
        if (::unlinkat(::dirfd(dir), name.c_str(), 0) == 0) {
          removed.push_back("removed /dev/shm/" + name + ": a segment of UCX's that no process held, made while the job ran");
        }
      }
    } else {
      removed.push_back("kept " + std::to_string(candidates.size()) +
                        " /dev/shm/ucx_shm_posix_* file(s) made while the job ran: a process of this user "
                        "(or /proc itself) could not be read to tell whether they are in use");
    }
  }
  ::closedir(dir);
}

void remove_ucx_sysv(const EndedJob& job, std::vector<std::string>& removed) {
  struct shm_info info {};
  const int last = ::shmctl(0, SHM_INFO, reinterpret_cast<struct shmid_ds*>(&info));
  for (int index = 0; index <= last; ++index) {
    struct shmid_ds ds {};
    const int id = ::shmctl(index, SHM_STAT, &ds);
    if (id < 0) continue;
    if (ds.shm_perm.__key != IPC_PRIVATE || ds.shm_nattch != 0 || (ds.shm_perm.mode & SHM_DEST) != 0 ||
        ds.shm_perm.cuid != ::geteuid() || ds.shm_ctime < job.started) {
      continue;
    }
    // Made by a rank while it lived: a pid reused after the rank ended is not the rank.
    const auto rank = std::find_if(job.ranks.begin(), job.ranks.end(),
                                   [&](const EndedRank& r) { return r.pid == ds.shm_cpid && r.ended != 0; });
    if (rank == job.ranks.end() || ds.shm_ctime > rank->ended) continue;
    if (::shmctl(id, IPC_RMID, nullptr) == 0) {
      removed.push_back("removed System V segment " + std::to_string(id) + ": rank pid " + std::to_string(ds.shm_cpid) +
                        " made it and nothing had it attached");
    }
  }
}

}  // namespace

std::vector<std::string> remove_left_segments(const EndedJob& job) {
  // libfabric's shm provider names its segments "<pid>:<domain>:<endpoint>", ferry's own
  // shared-memory transport "ferry-<pid>-<device>-<random>". ferry's are unlinked as soon as
  // every peer has mapped them, libfabric's only by a rank that exits cleanly; a rank killed
  // before either would leave them in /dev/shm.
  std::vector<std::string> prefixes;
  std::time_t last_end = 0;
  bool all_reaped = true;
  for (const EndedRank& r : job.ranks) {
    if (r.pid <= 0) continue;
    prefixes.push_back(std::to_string(r.pid) + ":");
    prefixes.push_back("ferry-" + std::to_string(r.pid) + "-");
    if (r.ended == 0) all_reaped = false;
    last_end = std::max(last_end, r.ended);
  }
  if (!prefixes.empty()) {
    if (DIR* dir = ::opendir("/dev/shm")) {
      while (const dirent* e = ::readdir(dir)) {
        const std::string_view name(e->d_name);
        for (const std::string& p : prefixes)
          if (name.substr(0, p.size()) == p) {
            ::unlinkat(::dirfd(dir), e->d_name, 0);
            break;
          }
      }
      ::closedir(dir);
    }
  }
  std::vector<std::string> removed;
  // A rank that survived SIGKILL (stuck in the kernel) may still be creating segments, and
  // reading its /proc files could block ferryrun: no UCX sweep then.
  if (!job.unclean || !job.sweep_ucx || !all_reaped || prefixes.empty()) return removed;
  remove_ucx_posix(job, last_end, removed);
  remove_ucx_sysv(job, removed);
  return removed;
}

}  // namespace ferryrun
