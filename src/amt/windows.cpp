// windows.cpp — the AMT runtime's windows: expose (collective: every rank's part and key
// learnt), get by the parcelport's one-sided read or, without one, as a call the owner answers
// with the bytes (on_get_request), and the ids of the runtime's own two actions.
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "amt/runtime_impl.hpp"
#include "common/log.hpp"

namespace ferry::amt {

// A window's id is its creation number; expose is collective and in the same order on every
// rank, and returns only with every rank's part, so a part that arrives early names at most
// the next window this rank will create (next_window_): a larger id is not from a peer.
Window Runtime::Impl::expose(void* data, std::size_t bytes) {
  if (data == nullptr && bytes != 0) {
    throw Error("expose: data is null with size=" + std::to_string(bytes));
  }
  std::unique_ptr<parcel::ExposedMemory> exposed;
  std::vector<std::byte> key;
  if (parcelport_->has_get() && bytes != 0) {
    exposed = parcelport_->expose_memory(data, bytes);
    key = exposed->key();
  }
  std::uint32_t id = 0;
  {
    std::lock_guard<std::mutex> g(windows_mutex_);
    id = next_window_++;
    WindowState& w = windows_[id];
    if (w.parts.empty()) w.parts.resize(static_cast<std::size_t>(size()));
    w.data = static_cast<std::byte*>(data);
    w.exposed_here = true;
    w.exposed = std::move(exposed);
    w.parts[static_cast<std::size_t>(rank())] = WindowPart{bytes, key, true};
    ++w.known;
  }
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    detail::Writer m;
    m.pod(id);
    m.pod(static_cast<std::uint64_t>(bytes));
    m.arg(key);
    send(r, Kind::call, window_part_action(), 0, std::move(m), true);
  }
  for (;;) {
    {
      std::lock_guard<std::mutex> g(windows_mutex_);
      if (windows_[id].known == size()) break;
    }
    if (!help()) std::this_thread::yield();
    throw_if_failed("expose");
  }
  return Window{id};
}

void Runtime::Impl::on_window_part(int source, detail::Reader& r) {
  const auto id = r.pod<std::uint32_t>();
  const auto bytes = r.pod<std::uint64_t>();
  auto key = r.arg<std::vector<std::byte>>();
  std::lock_guard<std::mutex> g(windows_mutex_);
  if (id == 0 || id > next_window_ || source < 0 || source >= size() || source == rank()) {
    FERRY_LOG_AT(warn, rank(), -1, "amt: dropped a window part from rank %d for window %u (this rank has created %u)",
                 source, id, next_window_ - 1);
    errors_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  WindowState& w = windows_[id];
  if (w.parts.empty()) w.parts.resize(static_cast<std::size_t>(size()));
  WindowPart& part = w.parts[static_cast<std::size_t>(source)];
  if (part.known) {
    FERRY_LOG_AT(warn, rank(), -1, "amt: dropped a second part of window %u from rank %d", id, source);
    errors_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  part = WindowPart{bytes, std::move(key), true};
  ++w.known;
}

Future<void> Runtime::Impl::get(int from, Window win, std::size_t offset, void* dst, std::size_t bytes) {
  if (from < 0 || from >= size()) {
    throw Error("get: rank=" + std::to_string(from) + " is out of range; the job has " + std::to_string(size()) + " ranks");
  }
  if (dst == nullptr && bytes != 0) throw Error("get: dst is null with size=" + std::to_string(bytes));
  std::vector<std::byte> key;
  std::byte* local = nullptr;
  {
    std::lock_guard<std::mutex> g(windows_mutex_);
    auto it = windows_.find(win.id);
    if (it == windows_.end() || !it->second.exposed_here) {
      throw Error("get: window " + std::to_string(win.id) + " is not one this runtime exposed");
    }
    if (it->second.known != size()) {
      throw Error("get: window " + std::to_string(win.id) + " is still being exposed (call get after expose returns)");
    }
    const WindowPart& part = it->second.parts[static_cast<std::size_t>(from)];
    if (offset > part.size || bytes > part.size - offset) {
      throw Error("get: offset=" + std::to_string(offset) + " + size=" + std::to_string(bytes) + " is outside rank " +
                  std::to_string(from) + "'s part of window " + std::to_string(win.id) + " (" + std::to_string(part.size) +
                  " bytes)");
    }
    if (from == rank()) local = it->second.data;
    else if (parcelport_->has_get()) key = part.key;
  }
  auto state = std::make_shared<Future<void>::State>();
  Future<void> f(&self_, state);
  if (bytes == 0 || from == rank()) {
    if (bytes != 0) std::memcpy(dst, local + offset, bytes);
    state->set_ready();
    return f;
  }
  if (parcelport_->has_get()) {
    parcelport_->get(from, key, offset, dst, bytes, [state, from](int error) {
      if (error != 0) {
        state->error = error == peer_failed_error
                           ? std::make_exception_ptr(PeerFailed(from, "amt: get: rank " + std::to_string(from) + " failed"))
                           : std::make_exception_ptr(Error("amt: get from rank " + std::to_string(from) + " failed (error " +
                                                           std::to_string(error) + ")"));
      }
      state->set_ready();
    });
    return f;
  }
  // Two-sided: the owner answers with the bytes (on_get_request).
  const std::uint64_t token = register_pending(
      from, state,
      [state, dst, bytes, from](detail::Reader& r) {
        try {
          if (r.pod<std::uint8_t>() == 0) throw Error("rank " + std::to_string(from) + " refused: " + r.arg<std::string>());
          Blob b = r.arg<Blob>();
          if (b.size() != bytes) {
            throw Error("rank " + std::to_string(from) + " sent " + std::to_string(b.size()) + " bytes for a get of " +
                        std::to_string(bytes));
          }
          std::memcpy(dst, b.data(), bytes);
        } catch (const std::exception& e) {
          state->error = std::make_exception_ptr(Error(std::string("amt: get: ") + e.what()));
        }
        state->set_ready();
      },
      [state](std::exception_ptr e) {
        state->error = std::move(e);
        state->set_ready();
      });
  detail::Writer m;
  m.pod(win.id);
  m.pod(static_cast<std::uint64_t>(offset));
  m.pod(static_cast<std::uint64_t>(bytes));
  send(from, Kind::call, get_action(), token, std::move(m), true);
  return f;
}

// The owner's side of a two-sided get. The request's numbers are checked against this
// rank's part before any byte is read.
void Runtime::Impl::on_get_request(int source, detail::Reader& r, std::uint64_t reply_to) {
  const auto id = r.pod<std::uint32_t>();
  const auto offset = r.pod<std::uint64_t>();
  const auto bytes = r.pod<std::uint64_t>();
  const std::byte* from = nullptr;
  std::string refused;
  {
    std::lock_guard<std::mutex> g(windows_mutex_);
    auto it = windows_.find(id);
    if (it == windows_.end() || !it->second.exposed_here) {
      refused = "window " + std::to_string(id) + " is not exposed here";
    } else {
      const std::uint64_t have = it->second.parts[static_cast<std::size_t>(rank())].size;
      if (offset > have || bytes > have - offset) {
        refused = "offset " + std::to_string(offset) + " + size " + std::to_string(bytes) + " is outside this part (" +
                  std::to_string(have) + " bytes)";
      } else {
        from = it->second.data + offset;
      }
    }
  }
  if (reply_to == 0) return;
  detail::Writer w;
  w.zc_threshold = options_.zc_threshold;
  if (from == nullptr) {
    FERRY_LOG_AT(warn, rank(), -1, "amt: refused a get from rank %d: %s", source, refused.c_str());
    w.pod<std::uint8_t>(0);
    w.arg(refused);
  } else {
    Blob b(bytes);
    if (bytes != 0) std::memcpy(b.data(), from, bytes);
    w.pod<std::uint8_t>(1);
    w.arg(std::move(b));
  }
  self_.send_reply(source, reply_to, std::move(w));
}

std::uint64_t Runtime::Impl::window_part_action() noexcept {
  static const std::uint64_t id = detail::hash_name("ferry.amt.window_part");
  return id;
}
std::uint64_t Runtime::Impl::get_action() noexcept {
  static const std::uint64_t id = detail::hash_name("ferry.amt.get");
  return id;
}

}  // namespace ferry::amt
