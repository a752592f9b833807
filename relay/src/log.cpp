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

thread_local std::string t_log_context;

// One JSON object a line on stderr: ts, level, msg. JSON escapes every
// control character itself.
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
        // Formatted in the thread that logs (a synchronous logger).
        if (!t_log_context.empty()) line["group"] = t_log_context;
        const auto text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        std::fprintf(stderr, "%s\n", text.c_str());
    }
    void flush_() override { std::fflush(stderr); }
};

// %E: the message, its control characters escaped. A name or an error
// message from outside (a consumer, a stream, a server's reply) cannot
// start a line of its own that would pass for one of the relay's.
class EscapedMessage : public spdlog::custom_flag_formatter {
public:
    void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
        if (!t_log_context.empty()) {
            const auto context = "[" + escape_control(t_log_context) + "] ";
            dest.append(context.data(), context.data() + context.size());
        }
        const auto text = escape_control(std::string_view(msg.payload.data(), msg.payload.size()));
        dest.append(text.data(), text.data() + text.size());
    }
    std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<EscapedMessage>(); }
};

}  // namespace

std::string escape_control(std::string_view text) {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out;
    out.reserve(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) {
        const auto c = static_cast<unsigned char>(text[i]);
        if (c == '\n') {
            out += "\\n";
        } else if (c == '\r') {
            out += "\\r";
        } else if (c == '\t') {
            out += "\\t";
        } else if (c < 0x20 || c == 0x7f) {
            out += "\\x";
            out += kHex[c >> 4];
            out += kHex[c & 0xf];
        } else if (c == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
                   static_cast<unsigned char>(text[i + 1]) <= 0x9f) {
            // U+0080-U+009F in UTF-8 (NEL among them)
            const auto c1 = static_cast<unsigned char>(text[++i]);
            out += "\\u00";
            out += kHex[c1 >> 4];
            out += kHex[c1 & 0xf];
        } else {
            out += static_cast<char>(c);
        }
    }
    return out;
}

void set_log_context(std::string context) { t_log_context = std::move(context); }

const std::string& log_context() { return t_log_context; }

std::unique_ptr<spdlog::formatter> make_text_formatter() {
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<EscapedMessage>('E').set_pattern("%Y-%m-%dT%H:%M:%S.%e%z %^%l%$ %E");
    return formatter;
}

void setup_logging(const std::string& level, LogFormat format) {
    std::shared_ptr<spdlog::logger> logger;
    if (format == LogFormat::json) {
        logger = std::make_shared<spdlog::logger>("pg_outbox_relay", std::make_shared<JsonSink>());
    } else {
        logger = spdlog::stderr_color_mt("pg_outbox_relay");
        logger->set_formatter(make_text_formatter());
    }
    logger->set_level(spdlog::level::from_str(level));
    logger->flush_on(spdlog::level::info);
    spdlog::set_default_logger(logger);
}

}  // namespace pg_outbox
