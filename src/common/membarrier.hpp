// membarrier.hpp — the rare side of an asymmetric fence.
//
// A handshake between a frequent side and a rare one (BiasedLock's owner and the thread that
// takes the bias over, common/biased_lock.hpp) needs a full barrier on both sides. With
// expedited membarrier(2) the frequent side's barrier is a compiler fence, and the rare side
// makes every running thread of the process execute a full barrier for it (a descheduled
// thread's context switch is one), so the cost moves to the rare side.
#pragma once

namespace ferry::detail::membarrier {

// Whether expedited private membarrier is registered for this process; the first call
// registers it (an older kernel or a sandbox may refuse: then false for good). Always false
// under TSan, which does not model it.
bool expedited() noexcept;

// A full barrier in every running thread of the process. Call only when expedited(). Once
// registered the call cannot fail; if the kernel says otherwise the fences' argument is void,
// and the process stops with a message naming the error.
void barrier_all() noexcept;

}  // namespace ferry::detail::membarrier
