#include "pg_outbox/log.hpp"

#include <nlohmann/json.hpp>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <mutex>

namespace pg_outbox {

namespace {

// One JSON object a line on stderr: ts, level, msg.
class JsonSink : public spdlog::sinks::base_sink<std::mutex> {
protected:
    void sink_it_(const spdlog::details::log_msg& msg) override {
        const auto ts = std::chrono::duration_cast<std::chrono::microseconds>(msg.time.time_since_epoch()).count();
        nlohmann::json line = {
            {"ts", static_cast<double>(ts) / 1e6},
            {"level", std::string(spdlog::level::to_string_view(msg.level).data(),
                                  spdlog::level::to_string_view(msg.level).size())},
            {"msg", std::string(msg.payload.data(), msg.payload.size())},
        };
        const auto text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        std::fprintf(stderr, "%s\n", text.c_str());
    }
    void flush_() override { std::fflush(stderr); }
};

}  // namespace

void setup_logging(const std::string& level, LogFormat format) {
    std::shared_ptr<spdlog::logger> logger;
    if (format == LogFormat::json) {
        logger = std::make_shared<spdlog::logger>("pg_outbox_relay", std::make_shared<JsonSink>());
    } else {
        logger = spdlog::stderr_color_mt("pg_outbox_relay");
        logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e%z %^%l%$ %v");
    }
    logger->set_level(spdlog::level::from_str(level));
    logger->flush_on(spdlog::level::info);
    spdlog::set_default_logger(logger);
}

}  // namespace pg_outbox
