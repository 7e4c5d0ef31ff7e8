// One idle turn of a bare UCP polling loop: ucp_worker_progress on a worker with one endpoint
// (to itself) and nothing to deliver (run by run.sh).
#include <ucp/api/ucp.h>
#include <chrono>
#include <cstdio>
int main() {
  ucp_params_t p{}; p.field_mask = UCP_PARAM_FIELD_FEATURES; p.features = UCP_FEATURE_AM | UCP_FEATURE_RMA;
  ucp_config_t* cfg; ucp_config_read(nullptr, nullptr, &cfg);
  ucp_context_h ctx; ucp_init(&p, cfg, &ctx); ucp_config_release(cfg);
  ucp_worker_params_t wp{}; wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE; wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h w; ucp_worker_create(ctx, &wp, &w);
  ucp_address_t* a; size_t al; ucp_worker_get_address(w, &a, &al);
  ucp_ep_params_t ep{}; ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS; ep.address = a; ucp_ep_h e; ucp_ep_create(w, &ep, &e);
  for (int k = 0; k < 5; ++k) {
    const int n = 5000000;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) ucp_worker_progress(w);
    std::printf("ucp_worker_progress idle: %.1f ns\n", std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n);
  }
}
