// W3C Trace Context (level 1) as the relay checks it: the one definition
// of a valid traceparent and tracestate on the relay's side, the same
// rules as the extension's emit and consume paths apply.
#pragma once

#include <string_view>

namespace pg_outbox {

// True when "value" is a traceparent of version 00: exactly 55 characters
// "00-<32 hex>-<16 hex>-<2 hex>", lowercase hex digits only, the trace id
// and the parent id not all zeros. Any other version (ff and future ones
// included) is not valid.
bool valid_traceparent(std::string_view value);

// True when "value" is a tracestate: at most 512 bytes of printable ASCII
// (0x20-0x7E), at most 32 comma-separated list members, each (spaces and
// tabs around it trimmed) empty or "key=value", the key
// [a-z0-9][_0-9a-z*/-]{0,255} or [a-z0-9][_0-9a-z*/-]{0,240}@[a-z][_0-9a-z*/-]{0,13},
// the value 1 to 256 characters of 0x20-0x7E but ',' and '=', not ending
// in a space. A tracestate is kept only beside a valid traceparent.
bool valid_tracestate(std::string_view value);

}  // namespace pg_outbox
