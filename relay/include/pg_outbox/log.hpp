// Logging setup: spdlog to stderr, as text or as one JSON object a line.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <spdlog/formatter.h>

#include "pg_outbox/config.hpp"

namespace pg_outbox {

void setup_logging(const std::string& level, LogFormat format);

// Text with its control characters (C0, DEL, C1) written as escapes (\n,
// \r, \t, \x1b, \u0085), so that a name or a message from outside stays
// on its line. Other bytes, backslashes included, are kept.
std::string escape_control(std::string_view text);

// The pattern of text log lines, with the message escaped as above.
std::unique_ptr<spdlog::formatter> make_text_formatter();

// What the calling thread works for, named in each of its log lines: a
// text line's message starts with "[context] ", a JSON line has a "group"
// member. Empty (the default): nothing is added. A relay publishing several
// groups names each group's thread after its group (and the threads that
// thread starts, see LagProbe).
void set_log_context(std::string context);
const std::string& log_context();

}  // namespace pg_outbox
