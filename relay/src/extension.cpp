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

namespace {

// Whether the API's fixed schema is there and usable, and outbox.engine()
// in it: to_regprocedure() says NULL rather than failing when there is no
// such function, but it fails on a schema the role may not use, so it is
// asked only after has_schema_privilege() said yes (a CASE evaluates its
// branch only when its condition holds; neither function is immutable, so
// none is folded beforehand).
constexpr const char* kProbeSql =
    "SELECT pg_catalog.current_database()::pg_catalog.text, CURRENT_USER::pg_catalog.text,"
    "       n.oid IS NOT NULL, pg_catalog.has_schema_privilege(n.oid, 'USAGE'::pg_catalog.text),"
    "       CASE WHEN pg_catalog.has_schema_privilege(n.oid, 'USAGE'::pg_catalog.text)"
    "            THEN pg_catalog.to_regprocedure('outbox.engine()'::pg_catalog.text) IS NOT NULL END"
    "  FROM (SELECT) AS one"
    "  LEFT JOIN pg_catalog.pg_namespace n ON n.nspname OPERATOR(pg_catalog.=) 'outbox'::pg_catalog.name";

// The engine, its version, the API's schema (quoted), and the extension
// the function belongs to: pg_outbox, pg_outbox_sql, or none (the SQL
// engine installed from its script with psql -f).
constexpr const char* kEngineSql =
    "SELECT e.engine, e.version, pg_catalog.quote_ident(e.api_schema::pg_catalog.text),"
    "       (SELECT x.extname::pg_catalog.text"
    "          FROM pg_catalog.pg_depend d"
    "          JOIN pg_catalog.pg_extension x ON x.oid OPERATOR(pg_catalog.=) d.refobjid"
    "         WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass::pg_catalog.oid"
    "           AND d.objid OPERATOR(pg_catalog.=) 'outbox.engine()'::pg_catalog.regprocedure::pg_catalog.oid"
    "           AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass::pg_catalog.oid"
    "           AND d.deptype OPERATOR(pg_catalog.=) 'e')"
    "  FROM outbox.engine() e";

// A version of pg_outbox from before outbox.engine() (0.1.0), found as
// its extension.
constexpr const char* kOldExtensionSql =
    "SELECT e.extname::pg_catalog.text, e.extversion FROM pg_catalog.pg_extension e"
    " WHERE e.extname OPERATOR(pg_catalog.=) ANY ('{pg_outbox,pg_outbox_sql}'::pg_catalog.name[])"
    " ORDER BY 1 LIMIT 1";

// How to bring a database's pg_outbox to this relay's version: the
// update of the extension it was installed as, or, for the SQL engine
// installed without CREATE EXTENSION, its script of this version.
std::string update_hint(const std::string& engine, const std::string& extname) {
    if (extname.empty() && engine == "sql")
        return "run the SQL engine's script of " PG_OUTBOX_VERSION " there with psql -f, as it was installed";
    return "run ALTER EXTENSION " + (extname.empty() ? std::string("pg_outbox") : extname) +
           " UPDATE after installing " PG_OUTBOX_VERSION;
}

ConfigError other_version(const std::string& database, const std::string& engine, const std::string& version,
                          const std::string& extname) {
    return ConfigError("--pg: database \"" + database + "\" has pg_outbox " + version +
                       (engine == "sql" ? " (the SQL engine)" : "") + "; this relay is " PG_OUTBOX_VERSION
                       " and works with the extension of its own version (" + update_hint(engine, extname) +
                       ", or use a relay of version " + version + ")");
}

}  // namespace

Extension use_extension(PgConnection& pg, SearchPath search_path) {
    // First, so that nothing after it resolves a name through a schema
    // that the role, the database or --pg put on the search_path.
    if (search_path == SearchPath::pin)
        pg.exec("SELECT pg_catalog.set_config('search_path'::pg_catalog.text, 'pg_catalog, pg_temp'::pg_catalog.text, "
                "false)");
    const auto probe = pg.exec(kProbeSql);
    const std::string database(probe.get(0, 0));
    const std::string role(probe.get(0, 1));
    const bool has_schema = probe.get(0, 2) == "t";
    if (has_schema && probe.get(0, 3) != "t")
        throw ConfigError("--pg: role \"" + role + "\" may not use schema \"outbox\" of database \"" + database +
                          "\", where pg_outbox keeps what every engine has (outbox.engine()); grant the role the "
                          "pg_outbox role of its work (GRANT outbox_relay TO " + role + " to publish, GRANT "
                          "outbox_consumer TO " + role + " to consume)");
    if (!has_schema || probe.get(0, 4) != "t") {
        // Version 0.1.0 has no outbox.engine(): say which version it is.
        const auto old = pg.exec(kOldExtensionSql);
        if (old.rows() > 0) {
            const std::string extname(old.get(0, 0));
            throw other_version(database, extname == "pg_outbox_sql" ? "sql" : "c", std::string(old.get(0, 1)),
                                extname);
        }
        throw ConfigError("--pg: pg_outbox is not installed in database \"" + database +
                          "\" (run CREATE EXTENSION pg_outbox there, or for the SQL engine CREATE EXTENSION "
                          "pg_outbox_sql or its script with psql -f; or connect to the database that has it)");
    }
    const auto r = pg.exec(kEngineSql);
    Extension out;
    out.database = database;
    out.engine = std::string(r.get(0, 0));
    out.version = std::string(r.get(0, 1));
    out.schema = std::string(r.get_optional(0, 2).value_or(std::string_view()));
    const std::string extname(r.get_optional(0, 3).value_or(std::string_view()));
    if (out.version != PG_OUTBOX_VERSION)
        throw other_version(database, out.engine, out.version, extname);
    if (out.schema.empty())
        throw ConfigError("--pg: database \"" + database + "\" has pg_outbox " + out.version +
                          ", whose API's schema (outbox.engine() names it) does not exist (was it renamed? "
                          "SELECT * FROM outbox.engine() names it)");
    if (out.engine != "c" && out.engine != "sql")
        throw ConfigError("--pg: database \"" + database + "\" has pg_outbox " + out.version + " with engine \"" +
                          out.engine + "\", which this relay does not know (it knows c and sql); "
                          "SELECT * FROM outbox.engine() names it");
    return out;
}

}  // namespace pg_outbox
