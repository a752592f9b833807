// The relay's and the consumer's statements run the extension's functions
// and PostgreSQL's own, never an overload that a less privileged role
// planted in a schema on the search_path (DESIGN.md, I-17).
//
// The database's owner, a role without superuser who owns "public" (where
// the extension is installed, its default), plants traps there: for every
// function of the extension's schema (the list from the catalog), and for
// every function and operator of pg_catalog that the relay's statements
// name (the list from the statements the server logged in a first run),
// overloads with text in place of any other argument type, in every
// combination, at every arity the function's defaults allow; each trap
// records that it ran. Then publish (two relays: a leader and a standby,
// two groups, the lag probe, maintenance) and consume (an entry
// dead-lettered) run end to end, and no trap runs. (--pool adds no SQL:
// its holds are in Redis.)
#include <gtest/gtest.h>

#include <signal.h>

#include <cstdio>
#include <regex>
#include <thread>
#include <set>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "pg_outbox/errors.hpp"

using namespace pg_outbox;
using namespace pg_outbox::testing;
using namespace std::chrono_literals;

namespace {

// Every statement of the server's log sent by a relay (application_name
// "pg_outbox_relay ..."), from log_statement = all with the application
// name first on each line; each once.
std::set<std::string> relay_statements(const std::string& log) {
    std::set<std::string> out;
    std::size_t at = 0;
    while (at < log.size()) {
        auto end = log.find('\n', at);
        if (end == std::string::npos) end = log.size();
        const std::string line = log.substr(at, end - at);
        at = end + 1;
        if (line.rfind("pg_outbox_relay", 0) != 0) continue;
        for (const char* marker : {"statement: ", "execute "})
            if (const auto m = line.find(marker); m != std::string::npos) out.insert(line.substr(m));
    }
    return out;
}

// What the traps overload: functions (of the extension, and those of
// pg_catalog the statements call) and operators (of pg_catalog).
struct Targets {
    std::set<std::string> functions;  // pg_catalog functions by name
    std::set<std::string> operators;  // pg_catalog operators by name
};

Targets named_by(const std::set<std::string>& statements) {
    Targets t;
    const std::regex call(R"(pg_catalog\.([a-z_0-9]+)\s*\()");
    const std::regex op(R"(OPERATOR\(pg_catalog\.([^)]+)\))");
    for (const auto& s : statements) {
        for (auto it = std::sregex_iterator(s.begin(), s.end(), call); it != std::sregex_iterator(); ++it)
            t.functions.insert((*it)[1]);
        for (auto it = std::sregex_iterator(s.begin(), s.end(), op); it != std::sregex_iterator(); ++it)
            t.operators.insert((*it)[1]);
    }
    return t;
}

// The traps, made by the database's owner: a function "public.<name>" for
// each signature of the candidates with text in place of some of its
// other argument types (every combination, at every arity its defaults
// allow), except the signatures that exist; and for each operator
// signature the same with text on either side or both. A trap records its
// signature in public.trap_fired and raises a WARNING, then returns
// nothing. Returns how many traps were made.
int plant_traps(PgConnection& owner, const Targets& targets) {
    owner.exec("CREATE TABLE public.trap_fired (trap text, at timestamptz DEFAULT now())");
    owner.exec("GRANT INSERT ON public.trap_fired TO PUBLIC");
    // The trap's body: a procedural function, so that the planner cannot
    // inline it away.
    owner.exec(R"(CREATE FUNCTION public.make_trap(name text, args text[], result text, retset boolean)
        RETURNS integer LANGUAGE plpgsql AS $f$
        DECLARE
            signature text := format('%s(%s)', name, array_to_string(args, ', '));
        BEGIN
            IF to_regprocedure(format('public.%I(%s)', name, array_to_string(args, ', '))) IS NOT NULL THEN
                RETURN 0;
            END IF;
            EXECUTE format($b$CREATE FUNCTION public.%I(%s) RETURNS %s LANGUAGE plpgsql AS $t$
                BEGIN
                    INSERT INTO public.trap_fired (trap) VALUES (%L);
                    RAISE WARNING 'pg_outbox trap fired: %%', %L;
                    RETURN%s;
                END $t$$b$, name, array_to_string(args, ', '), result, signature, signature,
                CASE WHEN retset OR result = 'void' THEN '' ELSE ' NULL' END);
            RETURN 1;
        END $f$)");
    // Every candidate signature: the extension's functions, and pg_catalog's
    // of the names the relay calls (only their plain, non-polymorphic
    // signatures: a trap needs a concrete result type).
    std::string names = "ARRAY[";
    for (const auto& f : targets.functions) names += (names.size() > 6 ? ", " : "") + std::string("'" + f + "'");
    names += "]::text[]";
    auto r = owner.exec(
        "WITH candidates AS ("
        "  SELECT p.oid FROM pg_proc p"
        "    JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'"
        "    JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = '" + extension_name() + "'"
        "   WHERE p.pronamespace = e.extnamespace AND p.prokind = 'f'"
        "  UNION"
        "  SELECT p.oid FROM pg_proc p"
        "   WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.prokind IN ('f', 'a') AND p.proname = ANY (" +
        names +
        ")"
        "     AND NOT EXISTS (SELECT 1 FROM unnest(p.proargtypes::oid[] || p.prorettype) t(oid)"
        "                      JOIN pg_type ty ON ty.oid = t.oid WHERE ty.typtype = 'p' AND ty.typname <> 'void'))"
        ", shapes AS ("
        "  SELECT p.proname::text AS name, p.proretset,"
        "         CASE WHEN p.proallargtypes IS NULL AND NOT p.proretset OR p.prorettype = 'void'::regtype"
        "              THEN format_type(p.prorettype, NULL)"
        "              ELSE pg_get_function_result(p.oid) END AS result,"
        "         array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY a(t, i)"
        "               ORDER BY i) AS args,"
        "         p.pronargs - p.pronargdefaults AS least"
        "    FROM pg_proc p JOIN candidates c ON c.oid = p.oid)"
        ", arities AS ("
        "  SELECT s.name, s.proretset, s.result, s.args[1:k] AS args"
        "    FROM shapes s, generate_series(s.least, cardinality(s.args)) k)"
        ", variants AS ("
        "  SELECT DISTINCT a.name, a.proretset, a.result,"
        "         array(SELECT CASE WHEN (m >> (i - 1)::int) & 1 = 1 THEN 'text' ELSE t END"
        "                 FROM unnest(a.args) WITH ORDINALITY x(t, i) ORDER BY i) AS args"
        "    FROM arities a, generate_series(0, (1 << coalesce(cardinality(a.args), 0)) - 1) m)"
        "SELECT coalesce(sum(public.make_trap(name, args, result, proretset)), 0) FROM variants");
    int made = std::stoi(std::string(r.get(0, 0)));
    // Operators: each pg_catalog signature of the names, with text on
    // either side or both.
    for (const auto& op : targets.operators) {
        auto sigs = owner.exec(
            "SELECT DISTINCT format_type(l, NULL), format_type(rt, NULL), format_type(o.oprresult, NULL)"
            "  FROM pg_operator o, LATERAL (VALUES (o.oprleft, o.oprright), ('text'::regtype, o.oprright),"
            "                                     (o.oprleft, 'text'::regtype), ('text'::regtype, 'text'::regtype)) v(l, rt)"
            " WHERE o.oprname = $1 AND o.oprnamespace = 'pg_catalog'::regnamespace AND o.oprleft <> 0"
            "   AND NOT EXISTS (SELECT 1 FROM pg_type ty WHERE ty.oid IN (l, rt, o.oprresult) AND ty.typtype = 'p')"
            "   AND NOT EXISTS (SELECT 1 FROM pg_operator x WHERE x.oprname = o.oprname AND x.oprleft = v.l"
            "                    AND x.oprright = v.rt AND x.oprnamespace = 'pg_catalog'::regnamespace)",
            {op});
        for (int i = 0; i < sigs.rows(); ++i) {
            const std::string fn = "trap_operator_" + std::to_string(made);
            const std::string left(sigs.get(i, 0)), right(sigs.get(i, 1)), result(sigs.get(i, 2));
            owner.exec("SELECT public.make_trap($1, ARRAY[$2, $3], $4, false)", {fn, left, right, result});
            try {
                owner.exec("CREATE OPERATOR public." + op + " (FUNCTION = public." + fn + ", LEFTARG = " + left +
                           ", RIGHTARG = " + right + ")");
                ++made;
            } catch (const PgError&) {
                // The same left and right types from two of pg_catalog's
                // signatures: one trap is enough.
            }
        }
    }
    return made;
}

class OverloadTest : public RelayTest {
protected:
    void SetUp() override {
        dir_ = make_temp_dir("pg_outbox_overload_");
        pg_ = std::make_unique<PgServer>(
            std::vector<std::string>{"log_statement = 'all'", "log_line_prefix = '%a|'"});
        redis_ = std::make_unique<RedisServer>(false);
        conninfo_ = pg_->create_database("app");
        PgConnection admin(conninfo_, "tests");
        // The database's owner owns "public" (PostgreSQL 15's
        // pg_database_owner) and nothing else.
        admin.exec("CREATE ROLE app_owner LOGIN");
        admin.exec("ALTER DATABASE app OWNER TO app_owner");
        admin.exec("CREATE ROLE relay_user LOGIN IN ROLE outbox_relay");
        admin.exec("CREATE ROLE consumer_user LOGIN IN ROLE outbox_consumer");
        admin.exec("SELECT public.outbox_group_create('g'::text, start_at => 'beginning'::text)");
        admin.exec("SELECT public.outbox_group_create('h'::text, start_at => 'beginning'::text)");
        admin.exec("SELECT public.inbox_consumer_create('c'::text, 'consumer_user'::regrole)");
        admin.exec("CREATE TABLE public.seen (topic text, key text, event_id uuid)");
        admin.exec("GRANT INSERT ON public.seen TO consumer_user");
    }

    // n events on topic "orders", keys k<from>..., exact calls.
    void emit_orders(int n, int from) {
        auto db = connect();
        for (int i = from; i < from + n; ++i)
            db.exec("SELECT public.outbox_emit($1::text, $2::text, $3::jsonb, NULL::jsonb, NULL::uuid)",
                    {"orders", "k" + std::to_string(i), "{\"n\": " + std::to_string(i) + "}"});
    }

    long long count(const std::string& sql) { return std::stoll(query_column(*admin_, sql)[0]); }

    // Publishes and consumes until every event emitted is applied once or
    // dead-lettered; the processes are stopped with SIGTERM after.
    void run_end_to_end(int applied, int dead_letters) {
        const std::vector<std::string> publish{PG_OUTBOX_RELAY_BINARY, "publish", "--group", "g,h",
                                               "--pg", pg_->conninfo("app", "relay_user"),
                                               "--redis", redis_->address(), "--poll-interval", "50ms",
                                               "--stream", "{group}:{topic}", "--stats-interval", "100ms",
                                               "--maintain-interval", "200ms", "--retry-max", "300ms",
                                               "--log-level", "debug"};
        auto& leader = start_process(publish);
        auto& standby = start_process(publish);
        auto& consumer = start_process({PG_OUTBOX_RELAY_BINARY, "consume", "--consumer", "c", "--pg",
                                        pg_->conninfo("app", "consumer_user"), "--redis", redis_->address(),
                                        "--stream", "g:orders", "--stream", "outbox:junk",
                                        "--handler",
                                        "INSERT INTO public.seen VALUES ($1, $2, $5)", "--block", "100ms",
                                        "--max-deliveries", "1", "--retry-max", "300ms", "--log-level", "debug"});
        const bool done = eventually(
            [&] {
                return count("SELECT count(*) FROM public.seen") >= applied &&
                       count("SELECT count(*) FROM outbox.dead_letters") >= dead_letters;
            },
            60s, 100ms);
        EXPECT_TRUE(done) << leader.log() << standby.log() << consumer.log();
        // Long enough for the lag probe, maintenance and the standby's look
        // at the leader.
        std::this_thread::sleep_for(1s);
        for (Process* p : {&leader, &standby, &consumer}) {
            EXPECT_TRUE(p->running()) << p->log();
            p->signal(SIGTERM);
            EXPECT_EQ(p->wait(20s), 0) << p->log();
        }
    }

    std::unique_ptr<PgConnection> admin_;
};

TEST_F(OverloadTest, NoPlantedOverloadRuns) {
    admin_ = std::make_unique<PgConnection>(conninfo_, "tests");
    // A malformed entry, dead-lettered by inbox_dead_letter.
    {
        auto redis = redis_->connect();
        auto r = redis.command({"XADD", "outbox:junk", "1-1", "event_id", "not a uuid", "payload", "{}"});
        ASSERT_NE(r->type, REDIS_REPLY_ERROR) << reply_text(r.get());
    }
    // A first run, without traps: the statements the relay sends.
    emit_orders(5, 0);
    run_end_to_end(5, 1);
    const auto statements = relay_statements(pg_->log());
    const auto targets = named_by(statements);
    ASSERT_FALSE(statements.empty()) << pg_->log();

    // The traps, by the database's owner, who is no superuser.
    {
        PgConnection owner(pg_->conninfo("app", "app_owner"), "tests");
        ASSERT_EQ(query_column(owner, "SELECT rolsuper::text FROM pg_roles WHERE rolname = current_user")[0], "false");
        const int made = plant_traps(owner, targets);
        EXPECT_GT(made, 100);
        std::string names;
        for (const auto& f : targets.functions) names += " " + f;
        for (const auto& o : targets.operators) names += " " + o;
        std::printf("planted %d traps; pg_catalog functions and operators the relay names:%s\n", made,
                    names.c_str());
    }
    // And a run with them, on a new entry to dead-letter.
    {
        auto redis = redis_->connect();
        auto r = redis.command({"XADD", "outbox:junk", "2-1", "event_id", "not a uuid either", "payload", "{}"});
        ASSERT_NE(r->type, REDIS_REPLY_ERROR) << reply_text(r.get());
    }
    emit_orders(5, 5);
    run_end_to_end(10, 2);
    EXPECT_EQ(count("SELECT count(*) FROM public.trap_fired"), 0)
        << query_column(*admin_, "SELECT coalesce(string_agg(DISTINCT trap, '; '), '') FROM public.trap_fired")[0];
    // The WARNING each trap raises (the statements that made them are in
    // the log too).
    EXPECT_EQ(pg_->log().find("WARNING:  pg_outbox trap fired"), std::string::npos) << pg_->log();
    EXPECT_EQ(count("SELECT count(*) FROM outbox.dead_letters"), 2);
    EXPECT_EQ(count("SELECT count(*) FROM public.seen"), 10);
}

}  // namespace
