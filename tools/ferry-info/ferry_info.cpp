// ferry-info: ferry's version, its backends (how each comes and what it finds here), and every layer's
// options (core, parcel layer, AMT runtime) with the value in force and where it came
// from (environment or default). Exits 1 when a value in the environment is invalid.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "ferry/amt.hpp"
#include "ferry/ferry.hpp"
#include "ferry/parcel.hpp"

namespace {

std::string valid_values(const ferry::OptionInfo& info) {
  if (info.type == ferry::OptionType::choice) {
    std::string list;
    for (const char* n : info.names) list += (list.empty() ? "" : ", ") + std::string(n);
    if (list.find(":N") != std::string::npos) list += " (N: " + std::to_string(info.min) + " to " + std::to_string(info.max) + ")";
    return list;
  }
  if (info.type == ferry::OptionType::size || info.type == ferry::OptionType::count) {
    std::string range = std::to_string(info.min) + " to ";
    range += info.max == UINT64_MAX ? std::string("any") : std::to_string(info.max);
    if (info.max_option != nullptr) range += std::string(", at most ") + info.max_option;
    return range;
  }
  return "";
}

// `indent`: the rows' own indent (a backend's rows sit under its entry).
void print_rows(const std::vector<ferry::ResolvedOption>& rows, const char* indent) {
  for (const ferry::ResolvedOption& o : rows) {
    const ferry::OptionInfo& i = *o.info;
    std::printf("%s%-22s = %-10s (%s)\n%s    %s\n%s    %s", indent, i.env, o.value.c_str(), ferry::to_string(o.source),
                indent, i.help, indent, ferry::to_string(i.type));
    const std::string valid = valid_values(i);
    if (!valid.empty()) std::printf(": %s", valid.c_str());
    std::printf("; default %s", i.default_value);
    if (i.deprecated_env != nullptr) std::printf("; deprecated name %s", i.deprecated_env);
    std::printf("\n");
  }
}

template <class Table>
void print_table(const Table& table, std::vector<std::string>& errors) {
  std::printf("\n%s options (value in force; set the environment variable to change it):\n", table.layer());
  print_rows(table.inspect(errors), "  ");
}

// A one-rank runtime made with the environment's options, and what it holds when fresh.
int print_footprint() {
  try {
    ferry::Runtime rt;
    const ferry::Footprint f = rt.footprint();
    std::printf("footprint of a fresh one-rank runtime (transport %s):\n", rt.options().value("transport").c_str());
    std::printf("  bootstrap reads %zu (peers' addresses %zu), keepalive links %zu\n", f.bootstrap_reads, f.address_reads,
                f.keepalive_links);
    for (std::size_t d = 0; d < f.devices.size(); ++d) {
      const ferry::DeviceFootprint& x = f.devices[d];
      std::printf("  device %zu: packets %zu of %zu made (%zu bytes), receive descriptors %zu made (%zu bytes), "
                  "peers connected %zu, pages given back %zu times (%zu bytes)\n",
                  d, x.packets_made, x.packets_max, x.packet_bytes, x.descriptors_made, x.descriptor_bytes,
                  x.peers_connected, x.trims, x.trimmed_bytes);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-info: --footprint: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ferry-info: version, providers and options of this ferry installation"};
  bool probe = false;
  app.add_flag("--probe", probe, "also open each libfabric provider and print its limits (inject size, mr mode...)");
  bool footprint = false;
  app.add_flag("--footprint", footprint,
               "start a one-rank runtime with the environment's options and print what it holds (packets, peers)");
  CLI11_PARSE(app, argc, argv);
  if (footprint) return print_footprint();
  std::vector<std::string> errors;  // invalid values in the environment, reported at the end

  std::printf("ferry %s\n\n", ferry::version());
  std::printf("backends (FERRY_TRANSPORT names one for every peer; auto: to this rank alone and within a host "
              "the first built-in one that reaches the peer, FERRY_NETWORK across hosts):\n");
  for (const ferry::BackendReport& b : ferry::describe_backends(probe)) {
    std::printf("  %s: %s\n    %s\n", b.name.c_str(), b.usable ? b.summary.c_str() : "unavailable", b.origin.c_str());
    if (!b.usable && b.origin.rfind("not built", 0) != 0) std::printf("    %s\n", b.error.c_str());
    for (const auto& [label, value] : b.facts) std::printf("    %s: %s\n", label.c_str(), value.c_str());
    // Its own options, also when it is not built here (its variables are still checked).
    for (const ferry::BackendOptionTable& t : ferry::backend_option_tables()) {
      if (t.backend != b.name) continue;
      std::printf("    options:\n");
      print_rows(t.inspect(errors), "      ");
    }
  }
  // Check the settings now, so a typo shows here rather than at the first run.
  print_table(ferry::runtime_option_table(), errors);
  print_table(ferry::parcel::option_table(), errors);
  print_table(ferry::amt::option_table(), errors);
  for (const std::string& e : errors) std::fprintf(stderr, "\nferry-info: %s\n", e.c_str());
  return errors.empty() ? 0 : 1;
}
