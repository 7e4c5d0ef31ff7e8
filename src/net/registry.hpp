// registry.hpp — the backends this build of ferry knows, and the loading of their modules.
//
// The list is generated at configure time from the ferry_backend() calls under src/net/
// (backends.inc): built-in backends, loadable modules (libferry-<name>.so in the folder
// `ferry/` beside libferry, found from libferry's own path, so an installed tree can move),
// and backends this build lacks, with the reason (UCX not found at configure time, say).
//
// A module is loaded with dlopen(RTLD_NOW | RTLD_LOCAL) the first time anything asks for it
// and stays loaded until the process ends: its library (UCX, libfabric) may keep threads and
// handlers that must not outlive their code.
//
// Concurrency: every function may be called by any thread; loading takes a mutex (a set-up
// path: nothing on a message path asks the registry).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ferry/options.hpp"
#include "net/backend.hpp"

namespace ferry::net {

// Every backend of this build, in registration order, built or not.
std::vector<std::string> backend_names();

// The backend `name`, its module loaded on first use. `setting` names what asked for it
// ("FERRY_NETWORK=ucx"), for the error. Throws ferry::Error for a name this build does not
// know (listing those it does), one it was built without (saying why), or a module that fails
// to load (its path and dlerror()).
const BackendInfo& backend(std::string_view name, std::string_view setting);

// Which peers `name`'s transports reach (Reach bits), as its ferry_backend() call declares it:
// known without loading a module, also for a backend this build lacks; 0 for an unknown name.
unsigned backend_reach(std::string_view name) noexcept;

// Every backend's option rows, for those that declare some, in registration order: compiled
// into libferry, so no module is loaded to list or check them.
const std::vector<BackendOptionTable>& backend_options();

// How `name` comes with this build: "built in", "module <path>", or "not built: <why>".
std::string backend_origin(std::string_view name);

// Whether `name` is in this process now: built in, or its module loaded.
bool backend_loaded(std::string_view name) noexcept;

// Loads the module at `path` and returns the registration it exports, which must be `name`'s
// (the registry's own step, open to tests). Throws ferry::Error naming `setting`, the path and
// dlerror(), or what the file lacks.
const BackendInfo& load_module(std::string_view name, const std::string& path, std::string_view setting);

// The folder modules are loaded from: `ferry/` beside the libferry this process mapped.
std::string module_dir();

}  // namespace ferry::net
