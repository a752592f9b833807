// The test kit's servers, where the relay's tests have always included
// them from: tests written against this header keep building.
#pragma once

#include "pg_outbox/testkit/servers.hpp"
