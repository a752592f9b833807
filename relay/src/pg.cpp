#include "pg_outbox/pg.hpp"

#include <poll.h>

#include "pg_outbox/errors.hpp"

namespace pg_outbox {

PgConnection::PgConnection(const std::string& conninfo, const std::string& application_name) {
    // Defaults first: keywords given later, those of the expanded conninfo
    // included, override them.
    const char* keys[] = {"application_name", "connect_timeout", "keepalives", "keepalives_idle",
                          "keepalives_interval", "keepalives_count", "dbname", nullptr};
    const char* values[] = {application_name.c_str(), "10", "1", "10", "5", "3",
                            conninfo.empty() ? nullptr : conninfo.c_str(), nullptr};
    conn_.reset(PQconnectdbParams(keys, values, 1));
    if (!conn_) throw PgError("could not allocate a PostgreSQL connection", "", true);
    if (PQstatus(conn_.get()) != CONNECTION_OK) {
        std::string msg = PQerrorMessage(conn_.get());
        while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
        throw PgError("could not connect to PostgreSQL: " + msg, "08001", true);
    }
}

void PgConnection::throw_error(const PGresult* r, const std::string& what) const {
    const char* state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
    std::string msg = r ? PQresultErrorMessage(r) : PQerrorMessage(conn_.get());
    while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
    const bool lost = PQstatus(conn_.get()) != CONNECTION_OK;
    throw PgError(what + ": " + msg, state ? state : (lost ? "08006" : ""), lost);
}

PgResult PgConnection::exec(const std::string& sql, const std::vector<Param>& params) {
    return exec(sql, params, {});
}

PgResult PgConnection::exec(const std::string& sql, const std::vector<Param>& params,
                            const std::vector<int>& formats) {
    std::vector<const char*> values;
    std::vector<int> lengths;
    values.reserve(params.size());
    lengths.reserve(params.size());
    for (const auto& p : params) {
        values.push_back(p ? p->data() : nullptr);
        lengths.push_back(p ? static_cast<int>(p->size()) : 0);
    }
    std::vector<int> all_formats(formats);
    all_formats.resize(params.size(), 0);
    PGresult* raw = PQexecParams(conn_.get(), sql.c_str(), static_cast<int>(values.size()), nullptr,
                                 values.data(), lengths.data(), all_formats.data(), 0);
    PgResult result(raw);
    const auto status = raw ? PQresultStatus(raw) : PGRES_FATAL_ERROR;
    if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) throw_error(raw, "query failed");
    return result;
}

void PgConnection::prepare(const std::string& name, const std::string& sql, const std::vector<Oid>& types) {
    PGresult* raw = PQprepare(conn_.get(), name.c_str(), sql.c_str(), static_cast<int>(types.size()),
                              types.empty() ? nullptr : types.data());
    PgResult result(raw);
    if (!raw || PQresultStatus(raw) != PGRES_COMMAND_OK) throw_error(raw, "could not prepare a statement");
}

void PgConnection::queue(const char* name, const char* sql, const std::vector<Param>& params) {
    if (queued_ == 0 && PQenterPipelineMode(conn_.get()) == 0) throw_error(nullptr, "could not enter pipeline mode");
    std::vector<const char*> values;
    values.reserve(params.size());
    for (const auto& p : params) values.push_back(p ? p->c_str() : nullptr);
    const int n = static_cast<int>(values.size());
    const int sent = name ? PQsendQueryPrepared(conn_.get(), name, n, values.data(), nullptr, nullptr, 0)
                          : PQsendQueryParams(conn_.get(), sql, n, nullptr, values.data(), nullptr, nullptr, 0);
    if (sent == 0 || PQpipelineSync(conn_.get()) == 0 || PQflush(conn_.get()) != 0)
        throw_error(nullptr, "could not send a query");
    ++queued_;
}

void PgConnection::send(const std::string& sql, const std::vector<Param>& params) {
    queue(nullptr, sql.c_str(), params);
}

void PgConnection::send_prepared(const std::string& name, const std::vector<Param>& params) {
    queue(name.c_str(), nullptr, params);
}

PgResult PgConnection::receive() {
    PGresult* raw = PQgetResult(conn_.get());
    PgResult result(raw);
    // Then the end of the statement (NULL) and its sync point. Two NULLs in
    // a row mean the connection broke.
    for (int nulls = 0; nulls < 2;) {
        PGresult* extra = PQgetResult(conn_.get());
        if (extra == nullptr) {
            ++nulls;
            continue;
        }
        nulls = 0;
        const bool sync = PQresultStatus(extra) == PGRES_PIPELINE_SYNC;
        PQclear(extra);
        if (sync) break;
    }
    if (--queued_ == 0) PQexitPipelineMode(conn_.get());
    const auto status = raw ? PQresultStatus(raw) : PGRES_FATAL_ERROR;
    if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) throw_error(raw, "query failed");
    return result;
}

void PgConnection::listen(const std::string& channel) {
    std::unique_ptr<char, decltype(&PQfreemem)> quoted(
        PQescapeIdentifier(conn_.get(), channel.c_str(), channel.size()), &PQfreemem);
    if (!quoted) throw_error(nullptr, "LISTEN");
    exec(std::string("LISTEN ") + quoted.get());
}

int PgConnection::wait_for_notification(std::chrono::milliseconds timeout) {
    auto drain = [this] {
        int n = 0;
        while (PGnotify* notify = PQnotifies(conn_.get())) {
            PQfreemem(notify);
            ++n;
        }
        return n;
    };
    if (const int n = drain(); n > 0) return n;
    pollfd pfd{PQsocket(conn_.get()), POLLIN, 0};
    if (pfd.fd < 0) throw_error(nullptr, "waiting for notifications");
    int rc = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
    if (rc > 0) {
        if (PQconsumeInput(conn_.get()) == 0) throw_error(nullptr, "waiting for notifications");
        return drain();
    }
    return 0;
}

}  // namespace pg_outbox
