// pg_outbox as the relay finds it in a database: its engine, its version,
// and the schema that every call of its API names.
#pragma once

#include <string>
#include <string_view>

#include "pg_outbox/pg.hpp"

namespace pg_outbox {

// pg_outbox as use_extension() found it in the connection's database.
struct Extension {
    // The connection's database (current_database()).
    std::string database;
    std::string version;
    // "c" (pg_outbox.so behind the functions) or "sql" (SQL and PL/pgSQL
    // only): both have the same API, so the relay's statements are the
    // same; only what the engine can do differs (the SQL engine has no
    // sleepers, and outbox_relay_waiting() says so).
    std::string engine;
    // The schema of the extension's API functions, quoted as an identifier
    // (pg_catalog.quote_ident).
    std::string schema;

    // A statement of the relay's with each "@extschema@" replaced by the
    // quoted schema: every call of the extension's API names its schema,
    // so that no function of another schema on the search_path (an
    // overload someone with CREATE on "public" planted) can be chosen
    // instead (DESIGN.md, I-17).
    std::string sql(std::string_view statement) const;
};

// What use_extension() does with the session's search_path.
enum class SearchPath {
    // Pinned to "pg_catalog, pg_temp": the relay's own sessions (publish,
    // lag, group lookup), which run nothing of the user's.
    pin,
    // Left as the role, the database and --pg's options set it: a consume
    // session, whose handler resolves its names there.
    keep,
};

// Finds pg_outbox in the connection's database through outbox.engine(),
// which every engine and every way of installing one (CREATE EXTENSION
// pg_outbox, CREATE EXTENSION pg_outbox_sql, the SQL engine's script run
// with psql -f) puts in the fixed schema "outbox", called with its schema
// so that it depends on no search_path; and pins the search_path or
// leaves it (see SearchPath). The relay's statements name every function,
// operator and type with its schema either way: the search_path only
// decides how the handler's names resolve. Throws ConfigError when the
// database has no pg_outbox, when the role may not use its schema, or
// when it has another version than this relay's.
Extension use_extension(PgConnection& pg, SearchPath search_path);

}  // namespace pg_outbox
