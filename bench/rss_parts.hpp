// rss_parts.hpp — this process's resident set now, by kind (/proc/self/status): anonymous
// memory, mapped files (libraries) and shared memory (/dev/shm segments, SysV); and its
// proportional set size (/proc/self/smaps_rollup: each shared page divided among the processes
// that map it). A page of a peer's segment counts whole in the RSS of every rank that maps it,
// and the kernel maps up to 16 pages around one a process reads from a file mapping, so with
// shared memory PSS is the fairer share. Shared by ferry-startup and ferry-mpi-startup, so both
// split their memory the same way.
#pragma once

#include <cstdio>
#include <cstring>

namespace bench {

struct RssParts {
  long anon_kib = -1;
  long file_kib = -1;
  long shmem_kib = -1;
  long pss_kib = -1;
};

inline RssParts rss_parts() {
  RssParts r;
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return r;
  char line[256];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    long v = 0;
    if (std::sscanf(line, "RssAnon: %ld", &v) == 1) r.anon_kib = v;
    if (std::sscanf(line, "RssFile: %ld", &v) == 1) r.file_kib = v;
    if (std::sscanf(line, "RssShmem: %ld", &v) == 1) r.shmem_kib = v;
  }
  std::fclose(f);
  if ((f = std::fopen("/proc/self/smaps_rollup", "r")) == nullptr) return r;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    long v = 0;
    if (std::sscanf(line, "Pss: %ld", &v) == 1) r.pss_kib = v;
  }
  std::fclose(f);
  return r;
}

}  // namespace bench
