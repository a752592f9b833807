// The workloads, in the table's order: each is its own unit under
// bench/workloads/.
#include "bench.hpp"

namespace pg_outbox::bench {

void workload_fetch(Context&);
void workload_advance(Context&);
void workload_emit(Context&);
void workload_drain(Context&);
void workload_formats(Context&);
void workload_shards(Context&);
void workload_scaling(Context&);
void workload_latency(Context&);
void workload_coldstart(Context&);
void workload_consume(Context&);
void workload_park(Context&);
void workload_catchup(Context&);
void workload_bloat(Context&);
void workload_engines(Context&);

const std::vector<Workload>& workloads() {
    static const std::vector<Workload> all{
        {"fetch", workload_fetch},
        {"advance", workload_advance},
        {"emit", workload_emit},
        {"drain", workload_drain},
        {"formats", workload_formats},
        {"shards", workload_shards},
        {"scaling", workload_scaling},
        {"latency", workload_latency},
        {"coldstart", workload_coldstart},
        {"consume", workload_consume},
        {"park", workload_park},
        {"catchup", workload_catchup},
        {"bloat", workload_bloat},
        {"engines", workload_engines},
    };
    return all;
}

}  // namespace pg_outbox::bench
