// registry.cpp — the generated list of backends, and dlopen of the modules among them.
#include "net/registry.hpp"

#include <dlfcn.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "ferry/error.hpp"
#include "net/fatal_signals.hpp"

namespace ferry::net {

// The built-in backends' registrations and every backend's option rows, defined in their
// folders (the rows' file is linked into libferry even for a module: backend.hpp).
#define FERRY_BACKEND_BUILTIN(n) const BackendInfo* builtin_backend_##n() noexcept;
#define FERRY_BACKEND_LOADABLE(n)
#define FERRY_BACKEND_ABSENT(n, why)
#define FERRY_BACKEND_REACH(n, bits)
#define FERRY_BACKEND_OPTIONS(n) const BackendOptionTable& backend_options_##n();
#include "backends.inc"
#undef FERRY_BACKEND_BUILTIN
#undef FERRY_BACKEND_LOADABLE
#undef FERRY_BACKEND_ABSENT
#undef FERRY_BACKEND_REACH
#undef FERRY_BACKEND_OPTIONS

namespace {

enum class Kind : std::uint8_t { builtin, module, absent };

struct Slot {
  const char* name;
  Kind kind;
  const BackendInfo* (*builtin)() noexcept;  // Kind::builtin
  const char* why;                           // Kind::absent
};

#define FERRY_BACKEND_BUILTIN(n) Slot{#n, Kind::builtin, &builtin_backend_##n, nullptr},
#define FERRY_BACKEND_LOADABLE(n) Slot{#n, Kind::module, nullptr, nullptr},
#define FERRY_BACKEND_ABSENT(n, why) Slot{#n, Kind::absent, nullptr, why},
#define FERRY_BACKEND_REACH(n, bits)
#define FERRY_BACKEND_OPTIONS(n)
constexpr Slot kSlots[] = {
#include "backends.inc"
};
#undef FERRY_BACKEND_BUILTIN
#undef FERRY_BACKEND_LOADABLE
#undef FERRY_BACKEND_ABSENT
#undef FERRY_BACKEND_REACH
#undef FERRY_BACKEND_OPTIONS
constexpr std::size_t kCount = sizeof(kSlots) / sizeof(kSlots[0]);

// The declared reach and option rows, by name (lines of their own in the list).
struct Declared {
  const char* name;
  unsigned reach;
};
#define FERRY_BACKEND_BUILTIN(n)
#define FERRY_BACKEND_LOADABLE(n)
#define FERRY_BACKEND_ABSENT(n, why)
#define FERRY_BACKEND_REACH(n, bits) Declared{#n, bits},
#define FERRY_BACKEND_OPTIONS(n)
constexpr Declared kReach[] = {
#include "backends.inc"
};
#undef FERRY_BACKEND_REACH
#undef FERRY_BACKEND_OPTIONS
using OptionsOf = const BackendOptionTable& (*)();
#define FERRY_BACKEND_REACH(n, bits)
#define FERRY_BACKEND_OPTIONS(n) &backend_options_##n,
constexpr OptionsOf kOptions[] = {
#include "backends.inc"
    nullptr,  // a build whose backends declare no options
};
#undef FERRY_BACKEND_BUILTIN
#undef FERRY_BACKEND_LOADABLE
#undef FERRY_BACKEND_ABSENT
#undef FERRY_BACKEND_REACH
#undef FERRY_BACKEND_OPTIONS

// Loaded modules' registrations, by slot; written once under the mutex, read under it too
// (backend() is a set-up call, so the lock costs nothing that matters).
std::mutex load_mutex;
std::array<const BackendInfo*, kCount> loaded{};

const Slot* find(std::string_view name) noexcept {
  for (const Slot& s : kSlots) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

std::string module_path(const Slot& s) { return module_dir() + "/libferry-" + s.name + ".so"; }

std::string known_names() {
  std::string out;
  for (const Slot& s : kSlots) out += (out.empty() ? "" : ", ") + std::string(s.name);
  return out;
}

}  // namespace

const BackendInfo& load_module(std::string_view name, const std::string& path, std::string_view setting) {
  // Never closed (see the header): the handle is dropped on purpose.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* e = dlerror();
    throw Error(std::string(setting) + ": cannot load ferry's " + std::string(name) + " backend module " + path + ": " +
                (e != nullptr ? e : "dlopen failed"));
  }
  using Entry = const BackendInfo* (*)();
  void* sym = dlsym(handle, "ferry_backend_v1");
  const BackendInfo* info = sym != nullptr ? reinterpret_cast<Entry>(sym)() : nullptr;
  if (info == nullptr || info->name == nullptr || name != info->name) {
    throw Error(std::string(setting) + ": " + path + " is not ferry's " + std::string(name) + " backend module (" +
                (sym == nullptr    ? std::string("no ferry_backend_v1")
                 : info == nullptr ? std::string("no registration")
                                   : "it registers '" + std::string(info->name != nullptr ? info->name : "") + "'") +
                ")");
  }
  return *info;
}

std::vector<std::string> backend_names() {
  std::vector<std::string> out;
  for (const Slot& s : kSlots) out.emplace_back(s.name);
  return out;
}

std::string module_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&module_dir), &info) == 0 || info.dli_fname == nullptr) return "ferry";
  std::string lib = info.dli_fname;
  const auto slash = lib.rfind('/');
  std::string dir = slash == std::string::npos ? std::string(".") : lib.substr(0, slash);
  // The loader's path may pass through the program's RPATH ("bin/../lib"): name it plainly.
  if (char* real = ::realpath(dir.c_str(), nullptr)) {
    dir = real;
    std::free(real);
  }
  return dir + "/ferry";
}

unsigned backend_reach(std::string_view name) noexcept {
  for (const Declared& d : kReach) {
    if (name == d.name) return d.reach;
  }
  return 0;
}

const std::vector<BackendOptionTable>& backend_options() {
  static const std::vector<BackendOptionTable> tables = [] {
    std::vector<BackendOptionTable> out;
    for (OptionsOf f : kOptions) {
      if (f != nullptr) out.push_back(f());
    }
    return out;
  }();
  return tables;
}

std::string backend_origin(std::string_view name) {
  const Slot* s = find(name);
  if (s == nullptr) return "unknown";
  switch (s->kind) {
    case Kind::builtin: return "built in";
    case Kind::module: return "module " + module_path(*s);
    case Kind::absent: return std::string("not built: ") + s->why;
  }
  return "unknown";
}

bool backend_loaded(std::string_view name) noexcept {
  const Slot* s = find(name);
  if (s == nullptr || s->kind == Kind::absent) return false;
  if (s->kind == Kind::builtin) return true;
  std::lock_guard<std::mutex> lock(load_mutex);
  return loaded[static_cast<std::size_t>(s - kSlots)] != nullptr;
}

const BackendInfo& backend(std::string_view name, std::string_view setting) {
  const Slot* s = find(name);
  if (s == nullptr) {
    throw Error(std::string(setting) + ": '" + std::string(name) + "' is not a backend of ferry; this build knows " +
                known_names());
  }
  switch (s->kind) {
    case Kind::builtin: return *s->builtin();
    case Kind::absent:
      throw Error(std::string(setting) + ": this ferry was built without its " + s->name + " backend (" + s->why + ")");
    case Kind::module: break;
  }
  std::lock_guard<std::mutex> lock(load_mutex);
  const BackendInfo*& slot = loaded[static_cast<std::size_t>(s - kSlots)];
  if (slot != nullptr) return *slot;
  const BackendInfo& info = load_module(s->name, module_path(*s), setting);
  // The core planned with the declared reach; a module that reaches otherwise is not this build's.
  if (info.reach != backend_reach(s->name)) {
    throw Error(std::string(setting) + ": " + module_path(*s) + " reaches other peers than ferry's " + s->name +
                " backend declares (reach " + std::to_string(info.reach) + ", declared " +
                std::to_string(backend_reach(s->name)) + "): a module of another build?");
  }
  // The module's library may have brought libraries that take over fatal signals as they load.
  restore_fatal_signals();
  slot = &info;
  return info;
}

}  // namespace ferry::net
