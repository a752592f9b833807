// Logging setup: spdlog to stderr, as text or as one JSON object a line.
#pragma once

#include <string>

#include "pg_outbox/config.hpp"

namespace pg_outbox {

void setup_logging(const std::string& level, LogFormat format);

}  // namespace pg_outbox
