// runtime.cpp — the AMT runtime's construction and teardown (options resolved, the parcelport
// made, the workers started; the workers joined, queued tasks freed), Runtime's public members,
// which forward to Runtime::Impl (runtime_impl.hpp), action-name hashing and the option table.
#include <atomic>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "amt/runtime_impl.hpp"
#include "common/log.hpp"
#include "ferry/amt.hpp"

namespace ferry::amt {

namespace detail {

std::uint64_t hash_name(const std::string& name) noexcept {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h == 0 ? 1 : h;
}

}  // namespace detail

const AmtOptionTable& option_table() {
  using T = OptionType;
  static const AmtOptionTable table(
      "amt", "amt::Options",
      {
          // Text, not a choice: a program may register parcelports of its own, and make_parcelport
          // names the registered ones (and how to register the MPI baselines) for a wrong name.
          option({"parcelport", "FERRY_PARCELPORT", T::text, "ferry", {}, 0, 0, nullptr,
                  "ferry::amt's parcelport: ferry, mpi, mpi_a, mpix (any registered name)"},
                 &Options::parcelport, &Settings::parcelport),
          option({"threads", "FERRY_AMT_THREADS", T::count, "1", {}, 1, 4096, nullptr,
                  "ferry::amt worker threads per rank"},
                 &Options::threads, &Settings::threads),
      });
  return table;
}

Runtime::Impl::Impl(Runtime& self, Options options) : self_(self), options_(std::move(options)), tasks_(1u << 16) {
  const Settings resolved = option_table().resolve(options_).settings;
  options_.parcelport = resolved.parcelport;
  options_.threads = resolved.threads;
  parcel::ParcelportOptions t;
  t.kind = options_.parcelport;
  t.devices = options_.devices;
  t.iovec = options_.iovec;
  parcelport_ = parcel::make_parcelport(t, *this);
  failed_ = std::make_unique<std::atomic<bool>[]>(static_cast<std::size_t>(parcelport_->size()));
  for (int r = 0; r < parcelport_->size(); ++r) failed_[static_cast<std::size_t>(r)].store(false, std::memory_order_relaxed);
  workers_count_ = static_cast<std::size_t>(options_.threads);
  progress_calls_ = std::make_unique<CallCount[]>(workers_count_ + 1);
  for (int i = 0; i < options_.threads; ++i) workers_.emplace_back([this, i] { work(i); });
}

Runtime::Impl::~Impl() {
  stop_.store(true, std::memory_order_release);
  for (auto& w : workers_) w.join();
  std::function<void()>* t = nullptr;
  while (tasks_.try_pop(t)) delete t;
}

Runtime::Runtime(Options options) : impl_(std::make_unique<Impl>(*this, std::move(options))) {
  // The runtime's own actions (windows); calls that arrived earlier were held until now.
  register_invoker(Impl::window_part_action(), "ferry.amt.window_part",
                   [](Runtime& rt, int source, detail::Reader& r, std::uint64_t) { rt.impl_->on_window_part(source, r); });
  register_invoker(Impl::get_action(), "ferry.amt.get", [](Runtime& rt, int source, detail::Reader& r, std::uint64_t reply_to) {
    rt.impl_->on_get_request(source, r, reply_to);
  });
  register_invoker(Impl::coll_up_action(), "ferry.amt.coll_up",
                   [](Runtime& rt, int source, detail::Reader& r, std::uint64_t) { rt.impl_->on_coll_up(source, r); });
  register_invoker(Impl::coll_down_action(), "ferry.amt.coll_down",
                   [](Runtime& rt, int source, detail::Reader& r, std::uint64_t) { rt.impl_->on_coll_down(source, r); });
  register_invoker(Impl::counter_action(), "ferry.amt.counter",
                   [](Runtime& rt, int source, detail::Reader& r, std::uint64_t reply_to) {
                     rt.impl_->on_counter_request(source, r, reply_to);
                   });
}
void Runtime::start_collective(int kind, int root, std::vector<std::byte> mine,
                               std::function<void(std::vector<std::vector<std::byte>>&&)> done,
                               std::function<void(std::exception_ptr)> failed, std::size_t part_size) {
  impl_->start_collective(kind, root, std::move(mine), std::move(done), std::move(failed), part_size);
}
Future<void> Runtime::barrier() {
  auto state = std::make_shared<Future<void>::State>();
  start_collective(
      0, 0, {}, [state](std::vector<std::vector<std::byte>>&&) { state->set_ready(); }, fail_into(state), 0);
  return Future<void>(this, std::move(state));
}
Counter Runtime::counter(std::int64_t initial) { return impl_->counter(initial); }
Future<std::int64_t> Runtime::fetch_add(int rank, Counter c, std::int64_t value) { return impl_->counter_op(rank, c, 0, value, 0); }
Future<std::int64_t> Runtime::compare_swap(int rank, Counter c, std::int64_t expected, std::int64_t desired) {
  return impl_->counter_op(rank, c, 1, expected, desired);
}
std::int64_t Runtime::value(Counter c) const { return impl_->counter_value(c); }
Window Runtime::expose(void* data, std::size_t size) { return impl_->expose(data, size); }
Future<void> Runtime::get(int rank, Window w, std::size_t offset, void* dst, std::size_t size) {
  return impl_->get(rank, w, offset, dst, size);
}
bool Runtime::has_one_sided_get() const noexcept { return impl_->parcelport_->has_get(); }
Runtime::~Runtime() {
  try {
    impl_->finalize();
  } catch (const std::exception& e) {
    FERRY_LOG(error, "amt: finalize: %s", e.what());
  }
}
int Runtime::rank() const noexcept { return impl_->rank(); }
int Runtime::size() const noexcept { return impl_->size(); }
int Runtime::threads() const noexcept { return static_cast<int>(impl_->workers_.size()); }
std::string Runtime::parcelport() const { return impl_->parcelport_->name(); }
std::string Runtime::transport() const { return impl_->parcelport_->transport(); }
void Runtime::spawn(std::function<void()> f) { impl_->spawn(std::move(f)); }
bool Runtime::help() { return impl_->help(); }
void Runtime::finalize() { impl_->finalize(); }
std::uint64_t Runtime::parcels_sent() const noexcept { return impl_->sent_.load(std::memory_order_relaxed); }
std::uint64_t Runtime::parcels_received() const noexcept { return impl_->received_.load(std::memory_order_relaxed); }
std::uint64_t Runtime::progress_calls() const noexcept { return impl_->progress_calls(); }
void Runtime::register_invoker(std::uint64_t id, const std::string& name, detail::Invoker invoker) {
  impl_->register_invoker(id, name, std::move(invoker));
}
std::uint64_t Runtime::register_pending(int rank, std::shared_ptr<void> keep, std::function<void(detail::Reader&)> on_reply,
                                        std::function<void(std::exception_ptr)> on_error) {
  return impl_->register_pending(rank, std::move(keep), std::move(on_reply), std::move(on_error));
}
void Runtime::send_call(int rank, std::uint64_t action, std::uint64_t reply_to, detail::Writer&& w) {
  impl_->send(rank, Kind::call, action, reply_to, std::move(w), true);
}
void Runtime::send_reply(int rank, std::uint64_t token, detail::Writer&& w) {
  impl_->send(rank, Kind::reply, token, 0, std::move(w), true);
}
std::size_t Runtime::zc_threshold() const noexcept { return impl_->options_.zc_threshold; }
std::uint64_t Runtime::errors() const noexcept {
  return impl_->errors_.load(std::memory_order_relaxed) + impl_->unknown_.load(std::memory_order_relaxed);
}

}  // namespace ferry::amt
