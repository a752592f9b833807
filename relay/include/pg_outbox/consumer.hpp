// Consume mode: stream entries applied through the inbox and a handler.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "pg_outbox/service.hpp"

namespace pg_outbox {

// One stream entry as delivered to this worker.
struct StreamEntry {
    std::string stream;
    std::string id;
    std::map<std::string, std::string> fields;
    long long deliveries = 1;
};

// A PostgreSQL array literal of text values (NULL for absent ones).
std::string pg_text_array(const std::vector<const std::string*>& values);

// Reads the entries of an XREADGROUP or XAUTOCLAIM entry list.
std::vector<StreamEntry> parse_entries(const std::string& stream, const redisReply* list);

class Consumer : public Service {
public:
    Consumer(const Config& config, Metrics& metrics, const std::atomic<bool>& stop);

private:
    void turn() override;
    void on_redis_connected() override { groups_ready_ = false; }
    void on_redis_fault() override { groups_ready_ = false; }

    void ensure_groups();
    std::vector<StreamEntry> read_new();
    void reclaim();
    void report_trimmed_unread(const std::string& stream);
    // Applies entries in one transaction (each in its own subtransaction),
    // then acknowledges what is done: applied, duplicate, dead-lettered.
    void apply(const std::vector<StreamEntry>& entries);
    void dead_letter(const StreamEntry& entry, const std::string& reason, const std::optional<std::string>& sqlstate);
    void ack(const std::vector<const StreamEntry*>& entries);

    bool groups_ready_ = false;
    std::chrono::steady_clock::time_point next_claim_{};
};

}  // namespace pg_outbox
