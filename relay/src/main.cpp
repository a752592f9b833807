// pg_outbox_relay: moves pg_outbox feeds to Redis Streams.
//
// Signals are taken by a thread of their own (sigtimedwait), never by a
// handler: SIGTERM and SIGINT set the stop request, which every loop and
// every wait on the network (io_wait.hpp) reads, so that the relay stops
// within a second whatever it is doing; SIGHUP is logged and ignored (the
// relay reads its settings only at start and logs to standard error, so
// there is nothing to reload or reopen), where its default action would
// kill the relay without resigning.
#include <sys/resource.h>

#include <csignal>
#include <cstring>

#include <atomic>
#include <memory>
#include <thread>

#include <spdlog/spdlog.h>

#include "pg_outbox/config.hpp"
#include "pg_outbox/consumer.hpp"
#include "pg_outbox/errors.hpp"
#include "pg_outbox/io_wait.hpp"
#include "pg_outbox/log.hpp"
#include "pg_outbox/metrics.hpp"
#include "pg_outbox/pg.hpp"
#include "pg_outbox/publish_groups.hpp"

namespace {

std::atomic<bool> g_stop{false};

// Takes SIGTERM, SIGINT and SIGHUP (blocked in every thread) until "done".
class SignalThread {
public:
    explicit SignalThread(const sigset_t& signals)
        : signals_(signals), thread_([this] { run(); }) {}
    ~SignalThread() {
        done_ = true;
        thread_.join();
    }

private:
    void run() {
        while (!done_) {
            const timespec slice{0, 100 * 1000 * 1000};
            const int sig = sigtimedwait(&signals_, nullptr, &slice);
            if (sig == SIGHUP) {
                spdlog::info("SIGHUP received and ignored: the relay reads its settings only at start (restart it "
                             "to change them) and logs to standard error (nothing to reopen)");
            } else if (sig == SIGTERM || sig == SIGINT) {
                if (!g_stop.exchange(true))
                    spdlog::info("{} received: stopping (within a second)", sig == SIGTERM ? "SIGTERM" : "SIGINT");
            }
        }
    }

    sigset_t signals_;
    std::atomic<bool> done_{false};
    std::thread thread_;
};

// Raises the soft limit of open files to the hard one: the metrics
// endpoint takes at most a bounded number of descriptors
// (MetricsServer::kMaxConnections), and the rest are the data
// connections', which a limit of 1024 (systemd's default soft limit)
// would leave short of room with many groups.
void raise_open_files_limit() {
    rlimit limit{};
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
    const auto before = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
        spdlog::warn("could not raise the limit of open files from {} to {}: {}", before, limit.rlim_max,
                     std::strerror(errno));
        return;
    }
    spdlog::debug("limit of open files raised from {} to {}", before, limit.rlim_max);
}

}  // namespace

int main(int argc, char** argv) {
    // Blocked before any other thread starts (a logger's included), so
    // that every thread inherits the mask and only the signal thread takes
    // them.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    std::signal(SIGPIPE, SIG_IGN);

    auto parsed = pg_outbox::parse_command_line(argc, argv);
    if (!parsed.config) return parsed.exit_code;
    const auto& config = *parsed.config;

    pg_outbox::setup_logging(config.log_level, config.log_format);

    SignalThread signal_thread(signals);
    pg_outbox::watch_stop_request(&g_stop);
    pg_outbox::set_pg_timeout(config.pg_timeout);
    raise_open_files_limit();

    // One group or several, each in a thread of its own, with the metrics
    // endpoint: see publish_groups.hpp.
    if (config.mode == pg_outbox::Config::Mode::publish) return pg_outbox::run_publish(config, g_stop);

    pg_outbox::Metrics metrics("consume", config.consumer_group, std::chrono::milliseconds(0), config.consumer);
    for (const auto& stream : config.streams)
        if (stream.find(',') != std::string::npos)
            spdlog::warn("--stream \"{}\" is one stream whose name holds a comma; repeat --stream to read several",
                         stream);
    try {
        std::unique_ptr<pg_outbox::MetricsServer> server;
        if (config.metrics_address)
            server = std::make_unique<pg_outbox::MetricsServer>(*config.metrics_address, metrics);
        return pg_outbox::Consumer(config, metrics, g_stop).run();
    } catch (const pg_outbox::ConfigError& e) {
        // A setting that cannot work, found at start-up.
        spdlog::critical("{}", e.what());
        return 2;
    } catch (const std::exception& e) {
        spdlog::critical("{}", e.what());
        return 1;
    }
}
