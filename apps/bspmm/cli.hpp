// cli.hpp — the command-line options both BSPMM programs share (the two stages' sizes).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "matrix.hpp"

namespace bspmm {

// Stage 1 compute-heavy (large blocks), stage 2 communication-heavy (small blocks, many tasks).
inline void default_stages(Stage st[2]) {
  st[0] = Stage{8, 256, 0.6};
  st[1] = Stage{40, 32, 0.5};
}

inline void add_stage_options(CLI::App& app, Stage st[2]) {
  for (int s = 0; s < 2; ++s) {
    const std::string p = "--stage" + std::to_string(s + 1);
    const std::string which = " of stage " + std::to_string(s + 1);
    app.add_option(p + "-blocks", st[s].blocks, "blocks per dimension" + which);
    app.add_option(p + "-block-size", st[s].block_size, "doubles per block edge" + which);
    app.add_option(p + "-density", st[s].density, "fraction of nonzero blocks" + which);
  }
}

inline void check_stages(const Stage st[2]) {
  check(st[0], "stage1");
  check(st[1], "stage2");
}

}  // namespace bspmm
