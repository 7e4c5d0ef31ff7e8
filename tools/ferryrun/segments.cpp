// segments.cpp — the shared-memory segments a job's ranks left behind.
//
// ferry's own segments and libfabric's shm regions carry the creating rank's pid in their
// names, so they are found by name. UCX names its POSIX segments with a random number and
// unlinks each right after creating it (peers open it through /proc/<pid>/fd); its System V
// segments are marked for removal right after they are attached. A rank killed inside either
// window leaves one behind for good. The POSIX ones are recognised by what is left of them: a
// "ucx_shm_posix_" file of this user that appeared during the job and that no process has open
// or mapped (a segment in use is held by its creator: open for the /proc link, or mapped). The
// System V ones by their creator: a rank of this job, with nothing attached.
#include "segments.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <unordered_set>

namespace ferryrun {
namespace {

constexpr std::string_view kUcxPosixPrefix = "ucx_shm_posix_";

bool all_digits(const char* s) {
  if (*s == '\0') return false;
  for (; *s != '\0'; ++s)
    if (*s < '0' || *s > '9') return false;
  return true;
}

// Inodes on device `dev` that some process has open or mapped (the processes whose /proc
// entries this user may read: all of its own).
std::unordered_set<ino_t> held_inodes(dev_t dev) {
  std::unordered_set<ino_t> held;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return held;
  char* line = nullptr;
  std::size_t cap = 0;
  while (const dirent* p = ::readdir(proc)) {
    if (!all_digits(p->d_name)) continue;
    const std::string base = std::string("/proc/") + p->d_name;
    if (DIR* fds = ::opendir((base + "/fd").c_str())) {
      while (const dirent* f = ::readdir(fds)) {
        struct stat st {};
        if (f->d_name[0] != '.' && ::fstatat(::dirfd(fds), f->d_name, &st, 0) == 0 && st.st_dev == dev) held.insert(st.st_ino);
      }
      ::closedir(fds);
    }
    // maps: "start-end perms offset major:minor inode path"; a segment mapped after its fd was
    // closed is held only here.
    if (FILE* maps = std::fopen((base + "/maps").c_str(), "re")) {
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
  }
  std::free(line);
  ::closedir(proc);
  return held;
}

void remove_ucx_posix(const EndedJob& job, std::vector<std::string>& removed) {
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
    if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || st.st_ctime < job.started) continue;
    candidates.emplace_back(e->d_name, st.st_ino);
  }
  if (!candidates.empty()) {
    const std::unordered_set<ino_t> held = held_inodes(shm.st_dev);
    for (const auto& [name, ino] : candidates) {
      if (held.count(ino) != 0) continue;
      if (::unlinkat(::dirfd(dir), name.c_str(), 0) == 0) removed.push_back("/dev/shm/" + name);
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
    if (ds.shm_nattch != 0 || (ds.shm_perm.mode & SHM_DEST) != 0 || ds.shm_perm.cuid != ::geteuid() ||
        ds.shm_ctime < job.started) {
      continue;
    }
    if (std::find(job.ranks.begin(), job.ranks.end(), ds.shm_cpid) == job.ranks.end()) continue;
    if (::shmctl(id, IPC_RMID, nullptr) == 0) removed.push_back("System V segment " + std::to_string(id));
  }
}

}  // namespace

std::vector<std::string> remove_left_segments(const EndedJob& job) {
  // libfabric's shm provider names its segments "<pid>:<domain>:<endpoint>", ferry's own
  // shared-memory transport "ferry-<pid>-<device>-<random>". ferry's are unlinked as soon as
  // every peer has mapped them, libfabric's only by a rank that exits cleanly; a rank killed
  // before either would leave them in /dev/shm.
  std::vector<std::string> prefixes;
  for (pid_t pid : job.ranks) {
    if (pid <= 0) continue;
    prefixes.push_back(std::to_string(pid) + ":");
    prefixes.push_back("ferry-" + std::to_string(pid) + "-");
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
  if (!job.unclean) return removed;
  remove_ucx_posix(job, removed);
  remove_ucx_sysv(job, removed);
  return removed;
}

}  // namespace ferryrun
