// The "catchup" workload: one batch of 1000 fetched with BENCH_BACKLOGS
// events behind the cursor, in both orders; the cost must not grow with
// the backlog.
#include <algorithm>
#include <cstdio>

#include "../bench.hpp"

namespace pg_outbox::bench {

void workload_catchup(Context& ctx) {
    const auto backlogs = words(knob("BACKLOGS", "10000 1000000 5000000"));
    long long largest = 0;
    std::string listed;
    for (const auto& b : backlogs) {
        largest = std::max(largest, std::stoll(b));
        listed += (listed.empty() ? "" : " ") + b;
    }
    Context::say("catch-up: one batch of 1000 with " + listed + " events behind the cursor");
    ctx.psql("postgres", {"CREATE DATABASE catchup"});
    ctx.psql("catchup", {"CREATE EXTENSION pg_outbox",
                         "SELECT outbox_group_create('c', start_at => 'beginning', ordering => 'xid8')",
                         "SELECT outbox_group_create('cc', start_at => 'beginning', ordering => 'commit')"});
    ctx.load_events("catchup", largest);
    ctx.psql("catchup", {"VACUUM ANALYZE outbox.event"});
    // The median of 21 fetches of one batch of group "g", in milliseconds,
    // with the cursor "b" events before the end (the events were loaded one
    // transaction after another, so both orders agree).
    ctx.psql("catchup", {R"(
	CREATE FUNCTION fetch_ms(g text, b bigint) RETURNS numeric LANGUAGE plpgsql AS $$
	DECLARE
		t0 timestamptz;
		ms numeric[] := '{}';
		e record;
	BEGIN
		SELECT * INTO e FROM outbox.event ORDER BY txid DESC, seq DESC OFFSET b LIMIT 1;
		IF g = 'c' THEN
			PERFORM outbox_rewind(g, coalesce(e.txid || '-' || e.seq, '0-0'));
		ELSE
			PERFORM outbox_rewind(g, coalesce((SELECT m.ticket || '-' || e.seq FROM outbox.commit_log m WHERE m.txid = e.txid), '0-0'));
		END IF;
		FOR i IN 1 .. 21 LOOP
			t0 := clock_timestamp();
			PERFORM count(*) FROM outbox_fetch(g, 1000);
			ms := ms || extract(epoch FROM clock_timestamp() - t0) * 1000;
		END LOOP;
		RETURN (SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY m) FROM unnest(ms) m);
	END
	$$)"});
    // Per round: xid8 order's backlogs, then commit order's.
    std::vector<std::vector<double>> rounds;
    for (int r = 1; r <= ctx.rounds; ++r) {
        std::vector<double> line;
        std::string text;
        for (const char* g : {"c", "cc"})
            for (const auto& b : backlogs) {
                const std::string v =
                    ctx.value("catchup", std::string("SELECT round(fetch_ms('") + g + "', " + b + "), 3)");
                line.push_back(std::stod(v));
                text += " " + v;
            }
        rounds.push_back(line);
        std::printf("   round %d: ms per batch at backlogs %s, xid8 then commit order:%s\n", r, listed.c_str(),
                    text.c_str());
    }
    std::size_t i = 0;
    for (const char* order : {"xid8", "commit"}) {
        const std::size_t first = i;
        for (const auto& b : backlogs) {
            std::vector<double> v;
            for (const auto& l : rounds) v.push_back(l[i]);
            ctx.row(std::string("catch-up, ") + order + " order: one batch of 1000 with " + b +
                    " events waiting (ms) | " + stats(v) + " |");
            ++i;
        }
        // The last backlog over the first, as listed, round by round.
        std::vector<double> ratio;
        for (const auto& l : rounds) ratio.push_back(l[i - 1] / l[first]);
        ctx.row(std::string("catch-up, ") + order + " order: largest / smallest backlog | " + stats(ratio) + " | ≤ 1.5");
    }
    ctx.drop_database("catchup");
}

}  // namespace pg_outbox::bench
