// mpi_parcelport_progress.cpp — the MPI parcelports' progress: which communicator a thread works
// on, one round of work on it (the header request, then one sender and one receiver connection
// from the deques, as HPX's background_work does), and a barrier that keeps progressing.
#include <mpi.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "parcel/mpi_parcelport_impl.hpp"

namespace ferry::parcel::detail {

// mpix polling choice: a thread first works on its own communicator (thread_index() % N), as
// HPX's "local" strategy does; only when that found nothing to do does it visit one other
// communicator, round-robin. Without that fallback a communicator whose threads are busy — or
// that no thread maps to, as when fewer threads than communicators poll, or a single thread
// sits in barrier() — would never advance (the attentiveness problem, taken to a hang); the
// fallback costs nothing on the busy path, which stays on the thread's own communicator.
bool MpiParcelport::background_work() {
  const std::size_t n = devices_.size();
  if (n == 1) return work(*devices_[0]);
  const std::size_t mine = my_device_index();
  if (work(*devices_[mine])) return true;
  thread_local std::size_t cursor = 0;
  const std::size_t other = (mine + 1 + (cursor++ % (n - 1))) % n;
  return work(*devices_[other]);
}

// One thread per rank at a time: concurrent collectives on one communicator are erroneous.
void MpiParcelport::barrier() {
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Ibarrier(devices_[0]->comm, &request), "MPI_Ibarrier");
  for (;;) {
    int done = 0;
    check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test(barrier)");
    if (done) return;
    if (!background_work()) std::this_thread::yield();
  }
}

// --- progress ------------------------------------------------------------------------------

bool MpiParcelport::work(Device& dev) {
  bool progressed = false;
  std::unique_ptr<ReceiverConnection> incoming = accept(dev);
  if (incoming) progressed = true;

  std::unique_ptr<SenderConnection> sender;
  if (dev.senders_lock.try_lock()) {
    if (!dev.senders.empty()) {
      sender = std::move(dev.senders.front());
      dev.senders.pop_front();
    }
    dev.senders_lock.unlock();
  }
  if (sender) {
    const Step step = advance(*sender);
    if (step != Step::idle) progressed = true;
    if (step == Step::finished) {
      // Out of the connection first: a callback may free the chunks or send again.
      std::vector<SentCallback> callbacks = std::move(sender->on_sent);
      sender.reset();
      for (auto& cb : callbacks) {
        if (cb) cb();
      }
    } else {
      std::lock_guard<Spinlock> lock(dev.senders_lock);
      dev.senders.push_back(std::move(sender));
    }
  }

  // As in HPX, a freshly accepted connection is this call's receiver; otherwise the next one.
  std::unique_ptr<ReceiverConnection> receiver = std::move(incoming);
  if (!receiver && dev.receivers_lock.try_lock()) {
    if (!dev.receivers.empty()) {
      receiver = std::move(dev.receivers.front());
      dev.receivers.pop_front();
    }
    dev.receivers_lock.unlock();
  }
  if (receiver) {
    const Step step = advance(*receiver);
    if (step != Step::idle) progressed = true;
    if (step != Step::finished) {
      std::lock_guard<Spinlock> lock(dev.receivers_lock);
      dev.receivers.push_back(std::move(receiver));
    }
  }
  return progressed;
}

}  // namespace ferry::parcel::detail
