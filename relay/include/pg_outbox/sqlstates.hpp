// The SQLSTATEs of pg_outbox's own, class OB, as the relay tells the
// extension's refusals apart: the relay's one definition of them. The
// extension defines the same codes in extension/sqlstates.h (C) and in the
// comment table of sql/install/00_schema_roles.sql (SQL); test/layout.sh
// checks that the three agree and that no other relay file writes a code.
#pragma once

#include <string_view>

namespace pg_outbox::sqlstate {

// An event id applied before with another payload (the inbox).
inline constexpr std::string_view kIdentityConflict = "OB001";
// The leader's group's cursor was moved by outbox_rewind() or outbox_skip().
inline constexpr std::string_view kRewound = "OB002";
// This session does not lead the group (any more).
inline constexpr std::string_view kNotLeader = "OB003";
// The group's next event is too large to publish.
inline constexpr std::string_view kEventTooLarge = "OB004";
// A consumer's parked entries reached its park_limit (outbox.config).
inline constexpr std::string_view kParkLimitReached = "OB005";
// outbox_emit() dropped a trace context that is not valid (a warning).
inline constexpr std::string_view kTraceContextDropped = "OB006";

}  // namespace pg_outbox::sqlstate
