// ferry-info: ferry's version, the libfabric providers it can use here, and every option
// with the value in force (from the environment or the default).
#include <rdma/fabric.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ferry/ferry.hpp"
#include "core/config.hpp"
#include "net/fabric.hpp"

int main(int argc, char** argv) {
  CLI::App app{"ferry-info: version, providers and options of this ferry installation"};
  bool probe = false;
  app.add_flag("--probe", probe, "also open each provider and print its limits (inject size, mr mode...)");
  CLI11_PARSE(app, argc, argv);

  std::printf("ferry %s (libfabric %u.%u)\n\n", ferry::version(), FI_MAJOR(fi_version()), FI_MINOR(fi_version()));
  std::printf("providers (FI_EP_RDM with messages and RMA):\n");
  for (const auto& p : ferry::net::available_providers()) {
    std::printf("  %s\n", p.c_str());
    if (!probe) continue;
    try {
      ferry::net::Fabric f(p);
      const auto& c = f.caps();
      std::printf("    inject %zu B, max message %zu B, cq data %zu B, tx depth %zu, mr:%s%s%s%s%s\n", c.inject_size,
                  c.max_msg_size, c.cq_data_size, c.tx_size, c.mr_local ? " local" : "",
                  c.mr_virt_addr ? " virt_addr" : " offset", c.mr_prov_key ? " prov_key" : "",
                  c.mr_endpoint ? " endpoint" : "", c.rx_cq_data ? " rx_cq_data" : "");
    } catch (const std::exception& e) {
      std::printf("    (cannot open: %s)\n", e.what());
    }
  }
  std::printf("\noptions (value in force; set the environment variable to change it):\n");
  int status = 0;
  for (const auto& [info, value] : ferry::resolved_options()) {
    const char* env = std::getenv(info.env);
    std::printf("  %-20s = %-10s %s\n      %s\n", info.env, value.c_str(),
                (env != nullptr && *env != '\0') ? "(environment)" : "(default)", info.help);
  }
  // Check the settings now, so a typo shows here rather than at the first run.
  try {
    (void)ferry::detail::resolve_config({});
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "\nferry-info: %s\n", e.what());
    status = 1;
  }
  return status;
}
