// fatal_signals.hpp — keeps a fatal signal fatal in a ferry process.
//
// libfabric (the ofi module's library) links the PSM providers' libraries; one of them (libinfinipath) installs, when it
// is loaded, handlers for SIGINT, SIGILL, SIGABRT, SIGBUS, SIGSEGV and SIGTERM that print a
// backtrace and call exit(1). exit() runs the program's static destructors from inside the
// signal: a ferry Runtime held in a static then finalizes and waits for peers that wait for
// it, so a rank that crashed, or that its launcher told to stop, hangs instead of ending, and
// the launcher sees neither the signal nor the rank's end until its own timeout.
#pragma once

namespace ferry::net {

// Sets every such handler that lives in those libraries back to the default action: the
// runtime calls it as it starts (for a program that links libfabric itself) and the registry
// after it loads a module. Handlers the application installed are kept. Any thread; calls
// are serialised.
void restore_fatal_signals() noexcept;

}  // namespace ferry::net
