// cma.hpp — cross-memory attach: one copy straight between two processes' address spaces
// (process_vm_readv / process_vm_writev). The kernel allows it where the caller may ptrace
// the peer (same user, and Yama's ptrace_scope or a container's seccomp profile permitting).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace ferry::net {

// Copies len bytes from local to the peer's address remote (write) or from remote to local
// (read), looping over partial transfers and the kernel's per-call limits. Returns 0 or a
// negative errno value (-EFAULT: the range is not mapped in the peer; -EPERM: not allowed;
// -ESRCH: the peer is gone). Thread-safe; one or more system calls.
int cma_write(pid_t pid, const void* local, std::size_t len, std::uint64_t remote) noexcept;
int cma_read(pid_t pid, void* local, std::size_t len, std::uint64_t remote) noexcept;

// Whether this process can read the peer's memory: reads the 8-byte word at remote and
// compares it with `expect` (the same word seen through shared memory). Returns 0 when it
// matches, a negative errno value when the kernel refuses, -EIO when the word differs.
int cma_probe(pid_t pid, std::uint64_t remote, std::uint64_t expect) noexcept;

// This process reading itself through process_vm_readv: "cma", or "copy (<reason>)"; with
// Yama's ptrace_scope when it restricts which peers may be read.
std::string describe_cma();

}  // namespace ferry::net
