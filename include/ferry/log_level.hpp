// ferry/log_level.hpp — the levels of ferry's diagnostics on stderr (FERRY_LOG).
#pragma once

namespace ferry {

// Most severe first; a line is written when its level is at or above the one in force.
// `off` silences everything. The order is that of FERRY_LOG's names in the option table.
enum class LogLevel : int { off = 0, error = 1, warn = 2, info = 3, debug = 4 };

}  // namespace ferry
