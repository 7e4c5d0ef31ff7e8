// put: every rank writes its rank into rank 0's window and notifies rank 0's queue.
//   build/bin/ferryrun -n 4 build/bin/ferry-example-put
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"

int main() {
  ferry::Runtime rt;
  ferry::Device& dev = rt.device();
  std::vector<int> window(static_cast<std::size_t>(rt.size()), -1);
  ferry::MemoryRegion region = dev.register_memory(window.data(), window.size() * sizeof(int));
  ferry::CompletionQueue notes;
  ferry::Exposure ex = rt.expose(notes, 2);

  // Rank 0 publishes its key; RemoteKey is trivially copyable, so it travels as bytes.
  if (rt.rank() == 0) {
    const ferry::RemoteKey key = region.remote_key();
    rt.kv_put("window", std::string(reinterpret_cast<const char*>(&key), sizeof key));
  }
  rt.kv_fence();
  ferry::RemoteKey key;
  const std::string bytes = rt.kv_get(0, "window");
  std::memcpy(&key, bytes.data(), sizeof key);

  const int me = rt.rank();
  ferry::Synchronizer done(1);
  ferry::Status s;
  while ((s = dev.post_put({.rank = 0, .buffer = &me, .size = sizeof me, .remote = key,
                            .offset = static_cast<std::size_t>(me) * sizeof(int), .local = &done, .notify = true,
                            .notify_target = {2}, .notify_tag = static_cast<ferry::Tag>(me)})).is_retry()) {
    dev.progress();
  }
  while (s.is_posted() && !done.test()) dev.progress();
  if (me == 0) {
    for (int seen = 0; seen < rt.size();) {
      dev.progress();
      if (auto c = notes.pop()) {
        std::printf("rank %d wrote window[%u] = %d\n", c->rank, c->tag, window[c->tag]);
        ++seen;
      }
    }
  }
  rt.finalize();
}
