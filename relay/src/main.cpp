// pg_outbox_relay: moves pg_outbox feeds to Redis Streams.
#include <csignal>

#include <atomic>
#include <memory>

#include <spdlog/spdlog.h>

#include "pg_outbox/config.hpp"
#include "pg_outbox/consumer.hpp"
#include "pg_outbox/errors.hpp"
#include "pg_outbox/log.hpp"
#include "pg_outbox/metrics.hpp"
#include "pg_outbox/publish_groups.hpp"

namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_stop_signal(int) { g_stop.store(true); }

}  // namespace

int main(int argc, char** argv) {
    auto parsed = pg_outbox::parse_command_line(argc, argv);
    if (!parsed.config) return parsed.exit_code;
    const auto& config = *parsed.config;

    pg_outbox::setup_logging(config.log_level, config.log_format);

    // Handlers only set a flag; the loop finishes its batch and exits.
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    std::signal(SIGPIPE, SIG_IGN);

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
