// Finding pg_outbox in a database, and naming its schema in the relay's
// statements: a relay's calls resolve to the extension's functions
// wherever CREATE EXTENSION ... SCHEMA put them, and to nothing else.
#include "pg_outbox/extension.hpp"

#include "pg_outbox/errors.hpp"

namespace pg_outbox {

std::string Extension::sql(std::string_view statement) const {
    static constexpr std::string_view kPlaceholder = "@extschema@";
    std::string out;
    out.reserve(statement.size() + 4 * schema.size());
    for (std::size_t at = 0;;) {
        const auto next = statement.find(kPlaceholder, at);
        out.append(statement.substr(at, next == std::string_view::npos ? std::string_view::npos : next - at));
        if (next == std::string_view::npos) return out;
        out.append(schema);
        at = next + kPlaceholder.size();
    }
}

Extension use_extension(PgConnection& pg, SearchPath search_path) {
    // First, so that nothing after it resolves a name through a schema
    // that the role, the database or --pg put on the search_path.
    if (search_path == SearchPath::pin)
        pg.exec("SELECT pg_catalog.set_config('search_path'::pg_catalog.text, 'pg_catalog, pg_temp'::pg_catalog.text, "
                "false)");
    auto r = pg.exec(
        "SELECT pg_catalog.quote_ident(n.nspname::pg_catalog.text), e.extversion, "
        "       pg_catalog.current_database()::pg_catalog.text"
        "  FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n"
        "       ON n.oid OPERATOR(pg_catalog.=) e.extnamespace"
        " WHERE e.extname OPERATOR(pg_catalog.=) 'pg_outbox'::pg_catalog.name");
    if (r.rows() == 0)
        throw ConfigError("--pg: pg_outbox is not installed in database \"" +
                          std::string(pg.exec("SELECT pg_catalog.current_database()::pg_catalog.text").get(0, 0)) +
                          "\" (run CREATE EXTENSION pg_outbox there, or connect to the database that has it)");
    Extension out{std::string(r.get(0, 1)), std::string(r.get(0, 0))};
    const std::string& version = out.version;
    if (version != PG_OUTBOX_VERSION)
        throw ConfigError("--pg: database \"" + std::string(r.get(0, 2)) + "\" has pg_outbox " + version +
                          "; this relay is " PG_OUTBOX_VERSION " and works with the extension of its own version "
                          "(run ALTER EXTENSION pg_outbox UPDATE after installing " PG_OUTBOX_VERSION
                          ", or use a relay of version " + version + ")");
    return out;
}

}  // namespace pg_outbox
