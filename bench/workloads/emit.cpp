// The "emit" workload: events per second written by outbox_emit with
// pgbench (4 clients, 1 and 100 events a transaction) and in bulk from one
// session, beside a plain INSERT (the floor), the naive status-column
// outbox and PgQ's insert_event; the same plain INSERT and outbox_emit on a
// second server without commit tickets (pg_outbox.commit_order = off); the
// bytes each stores per event.
#include <cstdio>
#include <map>

#include "../bench.hpp"

namespace pg_outbox::bench {

void workload_emit(Context& ctx) {
    const int emit_seconds = knob_int("EMIT_SECONDS", 10);
    const int bulk = knob_int("BULK", 200000);
    const std::string B = std::to_string(bulk);
    const std::string P = kPayload;
    Context::say("emission: pg_outbox vs plain INSERT vs naive status-column outbox vs PgQ; 4 clients, 1 and 100 "
                 "events a transaction; bulk");
    // A second server, the same but without commit tickets
    // (pg_outbox.commit_order = off): outbox_emit in xid8 order only.
    auto pg2 = ctx.start_pg("pg_xid8", {"pg_outbox.commit_order = off"});
    const int port2 = pg2->port();
    const std::string plain_table = R"(
		CREATE TABLE plain_events (id bigserial PRIMARY KEY, topic text, key text, payload jsonb, headers jsonb,
			event_id uuid, created_at timestamptz DEFAULT now());)";
    ctx.psql("postgres", {"CREATE DATABASE emit"}, port2);
    ctx.psql("emit", {"CREATE EXTENSION pg_outbox", plain_table}, port2);
    ctx.psql("postgres", {"CREATE DATABASE emit"});
    ctx.psql("emit", {"CREATE EXTENSION pg_outbox", "CREATE EXTENSION pgq", "SELECT pgq.create_queue('emit')"});
    ctx.psql("emit", {plain_table + R"(
		CREATE TABLE naive_outbox (id bigserial PRIMARY KEY, topic text, key text, payload jsonb, headers jsonb,
			event_id uuid, created_at timestamptz DEFAULT now(), status text NOT NULL DEFAULT 'new', updated_at timestamptz);
		CREATE INDEX naive_outbox_new ON naive_outbox (id) WHERE status = 'new';)"});
    std::map<std::string, std::string> stmt{
        {"plain", "INSERT INTO plain_events (topic, key, payload, event_id) VALUES ('orders', lpad(:k::text, 16, '0'), '" +
                      P + "', gen_random_uuid());"},
        {"outbox", "SELECT outbox_emit('orders', lpad(:k::text, 16, '0'), '" + P + "');"},
        {"naive", "INSERT INTO naive_outbox (topic, key, payload, event_id) VALUES ('orders', lpad(:k::text, 16, '0'), '" +
                      P + "', gen_random_uuid());"},
        {"pgq", "SELECT pgq.insert_event('emit', lpad(:k::text, 16, '0'), '" + P + "');"},
    };
    stmt["xplain"] = stmt["plain"];
    stmt["xoutbox"] = stmt["outbox"];
    std::map<std::string, std::string> bulk_sql{
        {"plain", "INSERT INTO plain_events (topic, key, payload, event_id) SELECT 'orders', lpad(i::text, 16, '0'), '" +
                      P + "', gen_random_uuid() FROM generate_series(1, " + B + ") i"},
        {"outbox", "SELECT count(*) FROM outbox_emit_many('orders', (SELECT array_agg(lpad(i::text, 16, '0')) FROM "
                   "generate_series(1, " + B + ") i), (SELECT array_agg('" + P + "'::jsonb) FROM generate_series(1, " +
                       B + ")))"},
        {"naive", "INSERT INTO naive_outbox (topic, key, payload, event_id) SELECT 'orders', lpad(i::text, 16, '0'), '" +
                      P + "', gen_random_uuid() FROM generate_series(1, " + B + ") i"},
        {"pgq", "SELECT count(pgq.insert_event('emit', lpad(i::text, 16, '0'), '" + P + "')) FROM generate_series(1, " +
                    B + ") i"},
        // outbox_emit called once per row by set-based SQL
        {"outbox_row", "SELECT count(outbox_emit('orders', lpad(i::text, 16, '0'), '" + P +
                           "')) FROM generate_series(1, " + B + ") i"},
    };
    bulk_sql["xplain"] = bulk_sql["plain"];
    bulk_sql["xoutbox"] = bulk_sql["outbox"];
    // What each stores, indexes included, after a bulk emit (bytes).
    auto tree_size = [](const std::string& t) {
        return "(SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM pg_partition_tree('" + t +
               "') WHERE isleaf)";
    };
    std::map<std::string, std::string> size_sql{
        {"plain", "SELECT pg_total_relation_size('plain_events')"},
        {"outbox", "SELECT " + tree_size("outbox.event") + " + " + tree_size("outbox.commit_log")},
        {"naive", "SELECT pg_total_relation_size('naive_outbox')"},
        {"pgq", R"(WITH RECURSIVE t(oid) AS (SELECT 'pgq.event_template'::regclass::oid
			UNION SELECT i.inhrelid FROM pg_inherits i JOIN t ON i.inhparent = t.oid)
			SELECT sum(pg_total_relation_size(oid)) FROM t)"},
    };
    size_sql["outbox_row"] = size_sql["outbox"];
    // Variants whose name starts with x run on the server without tickets.
    const std::vector<std::string> variants{"plain", "outbox", "naive", "pgq", "xplain", "xoutbox"};
    std::vector<std::string> bulk_variants = variants;
    bulk_variants.push_back("outbox_row");
    auto port_of = [&](const std::string& v) { return v[0] == 'x' ? port2 : 0; };
    auto reset_tables = [&] {
        ctx.psql("emit", {"TRUNCATE plain_events, naive_outbox, outbox.event, outbox.commit_log",
                          "SELECT pgq.drop_queue('emit', true)", "SELECT pgq.create_queue('emit')", "CHECKPOINT"});
        ctx.psql("emit", {"TRUNCATE plain_events, outbox.event", "CHECKPOINT"}, port2);
    };
    for (const auto& v : variants) {
        ctx.write("emit1_" + v + ".sql", "\\set k random(1, 100000000)\n" + stmt[v] + "\n");
        std::string hundred = "\\set k random(1, 100000000)\nBEGIN;\n";
        for (int i = 0; i < 100; ++i) hundred += stmt[v] + "\n";
        ctx.write("emit100_" + v + ".sql", hundred + "COMMIT;\n");
    }
    std::vector<std::vector<double>> rounds;
    for (int r = 1; r <= ctx.rounds; ++r) {
        std::vector<double> line, sizes;
        // Each variant runs twice for half the time, the list forward and
        // then backward, so that a machine whose speed drifts during the
        // round favours no variant over another: a ratio of two variants
        // is taken between runs centred on the same moment.
        const int half = (emit_seconds + 1) / 2;
        for (int shape : {1, 100}) {
            std::map<std::string, double> sum;
            std::vector<std::string> order = variants;
            order.insert(order.end(), variants.rbegin(), variants.rend());
            for (const auto& v : order) {
                reset_tables();
                sum[v] += ctx.pgbench("emit",
                                      {"-M", "prepared", "-c", "4", "-j", "2", "-T", std::to_string(half), "-f",
                                       ctx.work + "/emit" + std::to_string(shape) + "_" + v + ".sql"},
                                      port_of(v));
            }
            for (const auto& v : variants) line.push_back(rounded(sum[v] / 2 * shape, 0));
        }
        for (const auto& v : bulk_variants) {
            reset_tables();
            const double t0 = epoch_now();
            ctx.psql("emit", {bulk_sql[v]}, port_of(v));
            const double t1 = epoch_now();
            line.push_back(rounded(bulk / (t1 - t0), 0));
            if (size_sql.count(v)) sizes.push_back(rounded(std::stod(ctx.value("emit", size_sql[v])) / bulk, 1));
        }
        std::string text, size_text;
        for (double x : line) text += " " + fixed(x, 0);
        for (double x : sizes) size_text += " " + fixed(x, 1);
        line.insert(line.end(), sizes.begin(), sizes.end());
        rounds.push_back(line);
        std::printf("   round %d: events/s (1/tx: plain outbox naive pgq xplain xoutbox; 100/tx: same; bulk: plain "
                    "outbox naive pgq xplain xoutbox outbox_row):%s\n",
                    r, text.c_str());
        std::printf("   bytes per event after a bulk emit, indexes included (plain outbox_emit_many naive pgq "
                    "outbox_emit):%s\n",
                    size_text.c_str());
    }
    // Columns as the table's file numbered them, from 1.
    auto col = [&](int c) {
        std::vector<double> v;
        for (const auto& l : rounds) v.push_back(l[c - 1]);
        return stats(v);
    };
    auto ratio = [&](int a, int b) {
        std::vector<double> v;
        for (const auto& l : rounds) v.push_back(l[a - 1] / l[b - 1]);
        return stats(v);
    };
    int i = 0;
    for (const std::string& shape : std::vector<std::string>{"1 event a transaction, 4 clients",
                                                             "100 events a transaction, 4 clients",
                                                             "bulk, one session, " + B + " events"}) {
        const int p = i * 6 + 1;
        const std::string many = i == 2 ? "_many" : "";
        ctx.row("emit, " + shape + ": plain INSERT (events/s) | " + col(p) + " |");
        ctx.row("emit, " + shape + ": outbox_emit" + many + " (events/s) | " + col(p + 1) + " |");
        ctx.row("emit, " + shape + ": naive status-column outbox (events/s) | " + col(p + 2) + " |");
        ctx.row("emit, " + shape + ": PgQ insert_event (events/s) | " + col(p + 3) + " |");
        ctx.row("emit, " + shape + ": cost of outbox_emit / plain INSERT | " + ratio(p, p + 1) + " | ≤ 1.15");
        ctx.row("emit, " + shape + ": cost of PgQ / plain INSERT | " + ratio(p, p + 3) + " |");
        ctx.row("emit, " + shape + ": without commit tickets: plain INSERT (events/s) | " + col(p + 4) + " |");
        ctx.row("emit, " + shape + ": without commit tickets: outbox_emit" + many + " (events/s) | " + col(p + 5) + " |");
        ctx.row("emit, " + shape + ": cost of outbox_emit / plain INSERT without commit tickets (xid8 order only) | " +
                ratio(p + 4, p + 5) + " |");
        ctx.row("emit, " + shape + ": cost of commit tickets: outbox_emit without / with | " + ratio(p + 5, p + 1) + " |");
        ++i;
    }
    // column 19: outbox_emit per row in set-based SQL; 20-24: bytes per event
    ctx.row("emit, bulk, one session, " + B + " events: outbox_emit once per row, set-based SQL (events/s) | " + col(19) +
            " |");
    ctx.row("emit, bulk, one session: outbox_emit once per row / plain INSERT | " + ratio(19, 13) + " | ≥ 0.95");
    ctx.row("emit, bulk, one session: outbox_emit_many / plain INSERT | " + ratio(14, 13) + " | ≥ 0.95");
    ctx.row("emit, 1 event a transaction, 4 clients: outbox_emit / plain INSERT | " + ratio(2, 1) + " | ≥ 0.97");
    int c = 20;
    for (const char* what : {"plain INSERT", "pg_outbox (outbox_emit_many)", "naive status-column outbox", "PgQ",
                             "pg_outbox (outbox_emit per row)"})
        ctx.row(std::string("stored bytes per event after a bulk emit, indexes included: ") + what + " | " + col(c++) +
                " |");
    ctx.drop_database("emit");
}

}  // namespace pg_outbox::bench
