// Consume mode: stream entries applied through the inbox and a handler.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pg_outbox/backoff.hpp"
#include "pg_outbox/errors.hpp"
#include "pg_outbox/redis_cluster.hpp"
#include "pg_outbox/service.hpp"

namespace pg_outbox {

// One stream entry as delivered to this worker: its fields exactly as
// received (any bytes, in order, duplicate names kept).
struct StreamEntry {
    std::string stream;
    std::string id;
    std::vector<std::pair<std::string, std::string>> fields;
    long long deliveries = 1;

    // The value of the first field called "name"; nullptr when absent.
    const std::string* field(std::string_view name) const;
    // How many fields are called "name".
    std::size_t count(std::string_view name) const;
    // The bytes of all names and values.
    std::size_t bytes() const;
};

// The fields inbox_consume() reads; each may appear at most once.
inline constexpr std::string_view kEntryFields[] = {"event_id", "topic", "key", "payload", "headers"};

// Entries whose fields add up to more are dead-lettered unread
// (SQLSTATE 54000): PostgreSQL takes a value of up to 1 GB, and a jsonb
// payload of up to 256 MB.
inline constexpr std::size_t kMaxEntryBytes = 256u << 20;
// One inbox_consume() call takes entries of up to this many bytes
// together (one larger entry goes alone).
inline constexpr std::size_t kMaxCallBytes = 32u << 20;
// A dead letter keeps an entry's fields losslessly up to this many bytes
// together; beyond, each value is cut to kTruncatedValueBytes.
inline constexpr std::size_t kMaxDeadLetterBytes = 256u << 20;
inline constexpr std::size_t kTruncatedValueBytes = 1u << 20;

// A PostgreSQL bytea[] in the binary format, for a binary parameter:
// one element per value, NULL for absent ones; values may hold any bytes.
std::string pg_bytea_array(const std::vector<const std::string*>& values);

// Reads the entries of an XREADGROUP or XAUTOCLAIM entry list.
std::vector<StreamEntry> parse_entries(const std::string& stream, const redisReply* list);

// Why the relay cannot hand an entry to inbox_consume() (a field it reads
// appears twice, or the entry is too large), with a SQLSTATE; nullopt when
// it can. Everything about the content is decided by the server.
std::optional<std::pair<std::string, std::string>> framing_fault(const StreamEntry& entry);

class Consumer : public Service {
public:
    Consumer(const Config& config, Metrics& metrics, const std::atomic<bool>& stop);

private:
    // The handler's SQL runs in the relay's session with the role's settings.
    bool keeps_handler_settings() const override { return true; }
    // What an apply left for later: entries held after a configuration or
    // transient fault, to be retried after a backoff.
    struct Held {
        std::vector<StreamEntry> entries;
        std::string sqlstate;
        std::string message;
        Fault fault = Fault::configuration;
    };

    void turn() override;
    void on_pg_connected() override;
    void on_redis_connected() override;
    void on_redis_fault() override;
    // A command on a stream: on the connection, or in a Redis Cluster on
    // the master of the stream's slot (MOVED and ASK followed).
    RedisReply command(std::string_view stream, const std::vector<std::string_view>& argv,
                       std::string_view context = {});
    RedisReply command_raw(std::string_view stream, const std::vector<std::string_view>& argv);

    // At start-up: the consumer may be used by this role, the streams are
    // text, and the handler prepares with the five parameter types and its
    // objects are accessible. A failure is a ConfigError (exit 2).
    void validate_settings();
    void ensure_groups();
    std::vector<StreamEntry> read_new();
    std::vector<StreamEntry> read_new_cluster();
    void reclaim();
    void report_trimmed_unread(const std::string& stream);
    // Applies entries (each in its own subtransaction, in calls of at most
    // kMaxCallBytes), then acknowledges what is done: applied, duplicate,
    // dead-lettered. Entries that met a configuration or transient fault
    // are held for retry.
    void apply(const std::vector<StreamEntry>& entries);
    void apply_call(const std::vector<const StreamEntry*>& call, std::vector<const StreamEntry*>& done);
    // One entry's failure that is the entry's: counts the delivery, and
    // dead-letters it after --max-deliveries.
    void entry_failed(const StreamEntry& e, std::string_view sqlstate, std::string_view message,
                      std::vector<const StreamEntry*>& done);
    void malformed(const StreamEntry& e, const std::string& reason, const std::string& sqlstate,
                   std::vector<const StreamEntry*>& done);
    void hold(const StreamEntry& e, std::string_view sqlstate, std::string_view message);
    // Records a dead letter with the entry's raw fields (cut when they are
    // too large for the server); the SQLSTATE and message of the error that
    // kept it from being recorded, nullopt when it is recorded.
    std::optional<std::pair<std::string, std::string>> dead_letter(const StreamEntry& entry, const std::string& reason,
                                                                   const std::optional<std::string>& sqlstate);
    void ack(const std::vector<const StreamEntry*>& entries);

    bool groups_ready_ = false;
    bool validated_ = false;
    std::chrono::steady_clock::time_point next_claim_{};
    Held held_;
    Backoff hold_backoff_;
    // With a redis+cluster:// address: the nodes, one connection each.
    std::optional<RedisCluster> cluster_;
};

}  // namespace pg_outbox
