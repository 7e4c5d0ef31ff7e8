// ferry-startup: what a job of N ranks costs to start and hold, one JSON line per rank.
//
// Each rank makes a ferry::Runtime (bootstrap, transports, connections), waits in one barrier,
// finalizes, and prints: init_s (Runtime's constructor, main's start to its return), barrier_s,
// finalize_s, maxrss_kib (the process's peak resident set, getrusage, read after finalize), and
// after the barrier the resident set by kind (rss_anon_kib, rss_file_kib, rss_shmem_kib) and
// the proportional set size (pss_kib; see rss_parts.hpp), and ferry's own account of it
// (Runtime::footprint: bootstrap_reads, address_reads, keepalive_links, and summed over the devices
// peers_connected, packets_made, packet_bytes, descriptor_bytes). The launcher's wall time around the whole job is the driver's (bench/scale.py),
// beside ferry-mpi-startup's numbers for MPICH and Open MPI.
//   build/bin/ferryrun -n 16 build/bin/ferry-startup
#include <sys/resource.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <exception>

#include <nlohmann/json.hpp>

#include "ferry/ferry.hpp"
#include "rss_parts.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

long maxrss_kib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;  // KiB on Linux
}

}  // namespace

int main() {
  try {
    const auto t0 = Clock::now();
    nlohmann::json j{{"bench", "startup"}};
    {
      ferry::Runtime rt;
      const auto t1 = Clock::now();
      rt.barrier();
      const auto t2 = Clock::now();
      j["rank"] = rt.rank();
      j["ranks"] = rt.size();
      j["transport"] = rt.transport();
      j["provider"] = rt.provider();
      j["init_s"] = seconds(t0, t1);
      j["barrier_s"] = seconds(t1, t2);
      const bench::RssParts parts = bench::rss_parts();
      j["rss_anon_kib"] = parts.anon_kib;
      j["rss_file_kib"] = parts.file_kib;
      j["rss_shmem_kib"] = parts.shmem_kib;
      j["pss_kib"] = parts.pss_kib;
      const ferry::Footprint f = rt.footprint();
      j["bootstrap_reads"] = f.bootstrap_reads;
      j["address_reads"] = f.address_reads;
      j["keepalive_links"] = f.keepalive_links;
      std::size_t peers = 0, packets = 0, packet_bytes = 0, descriptor_bytes = 0;
      for (const ferry::DeviceFootprint& d : f.devices) {
        peers += d.peers_connected;
        packets += d.packets_made;
        packet_bytes += d.packet_bytes;
        descriptor_bytes += d.descriptor_bytes;
      }
      j["peers_connected"] = peers;
      j["packets_made"] = packets;
      j["packet_bytes"] = packet_bytes;
      j["descriptor_bytes"] = descriptor_bytes;
      rt.finalize();
      j["finalize_s"] = seconds(t2, Clock::now());
    }
    j["maxrss_kib"] = maxrss_kib();
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-startup: %s\n", e.what());
    return 1;
  }
}
