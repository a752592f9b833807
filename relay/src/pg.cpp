#include "pg_outbox/pg.hpp"

#include <arpa/inet.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <map>

#include <spdlog/spdlog.h>

#include "pg_outbox/errors.hpp"
#include "pg_outbox/io_wait.hpp"

namespace pg_outbox {

namespace {

// The bound of every wait on PostgreSQL (--pg-timeout), in ms.
std::atomic<std::int64_t> g_pg_timeout_ms{std::chrono::milliseconds(kDefaultPgTimeout).count()};

std::string seconds_text(std::chrono::milliseconds d) {
    return std::to_string(std::max<std::int64_t>(1, (d.count() + 999) / 1000));
}

struct ConninfoOptionsDeleter {
    void operator()(PQconninfoOption* o) const noexcept { PQconninfoFree(o); }
};
using ConninfoOptions = std::unique_ptr<PQconninfoOption, ConninfoOptionsDeleter>;

bool is_uri(std::string_view s) { return s.rfind("postgresql://", 0) == 0 || s.rfind("postgres://", 0) == 0; }

// What libpq expands as a connection string; anything else is a database
// name (PQconnectdbParams with expand_dbname).
bool is_connection_string(std::string_view s) { return is_uri(s) || s.find('=') != std::string_view::npos; }

bool is_secret_option(std::string_view keyword) { return keyword == "password" || keyword == "sslpassword"; }

// Where the text that may hold a password starts: the first "password"
// (sslpassword too) of a keyword/value string, or a URI's user information
// after its colon; npos when there is none.
std::size_t secret_start(const std::string& conninfo) {
    std::string lower(conninfo);
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    std::size_t start = lower.find("password");
    if (is_uri(conninfo)) {
        const auto authority = conninfo.find("://") + 3;
        const auto at = conninfo.find('@', authority);
        const auto colon = conninfo.find(':', authority);
        if (at != std::string::npos && colon < at) start = std::min(start, colon + 1);
        else if (at != std::string::npos) start = std::min(start, authority);
    }
    return start;
}

// libpq's message about a connection string it cannot parse quotes pieces
// of it: those that may be part of a password become "***".
std::string redact_parse_error(const std::string& conninfo, std::string message) {
    while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.pop_back();
    const auto secret = secret_start(conninfo);
    if (secret == std::string::npos) return message;
    std::string out;
    std::size_t i = 0;
    while (i < message.size()) {
        const auto open = message.find('"', i);
        const auto close = open == std::string::npos ? std::string::npos : message.find('"', open + 1);
        if (close == std::string::npos) {
            out += message.substr(i);
            break;
        }
        const std::string piece = message.substr(open + 1, close - open - 1);
        bool safe = piece == "=" || piece == "]";  // libpq's own words
        if (!safe && !piece.empty()) {
            safe = true;
            bool found = false;
            for (auto at = conninfo.find(piece); at != std::string::npos; at = conninfo.find(piece, at + 1)) {
                found = true;
                if (at + piece.size() > secret) safe = false;
            }
            safe = safe && found;
        }
        out += message.substr(i, open - i + 1);
        out += safe ? piece : "***";
        out += '"';
        i = close + 1;
    }
    return out;
}

std::vector<std::string> split_list(const std::string& s) {
    std::vector<std::string> out;
    std::size_t start = 0;
    while (true) {
        const auto comma = s.find(',', start);
        out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
        if (comma == std::string::npos) return out;
        start = comma + 1;
    }
}

// libpq's parse_int_param: an integer, white space around it allowed.
bool is_integer(const std::string& s, long* value = nullptr) {
    std::size_t i = 0;
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
    const auto digits = i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    if (i == digits || i - digits > 9) return false;
    const auto end = i;
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    if (i != s.size()) return false;
    if (value) *value = std::stol(s.substr(0, end));
    return true;
}

std::string quote_value(const std::string& v) {
    if (!v.empty() && v.find_first_of(" '\\\t\n\r") == std::string::npos) return v;
    std::string out = "'";
    for (char c : v) {
        if (c == '\'' || c == '\\') out += '\\';
        out += c;
    }
    return out + "'";
}

extern "C" void log_notice(void*, const char* message) {
    std::string_view m(message);
    while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.remove_suffix(1);
    if (m.rfind("WARNING:", 0) == 0)
        spdlog::warn("PostgreSQL: {}", m);
    else
        spdlog::info("PostgreSQL: {}", m);
}

}  // namespace

void check_conninfo(const std::string& conninfo) {
    std::map<std::string, std::string> given;
    if (is_connection_string(conninfo)) {
        if (is_uri(conninfo)) {
            // libpq takes the user information to the first "@" or "/": an
            // unencoded "@" or "/" in a password would leave the rest of it
            // in the host or database name, which libpq and the server quote.
            const auto authority = conninfo.find("://") + 3;
            const auto query = conninfo.find('?', authority);
            const auto at = conninfo.find('@', authority);
            const auto slash = conninfo.find('/', authority);
            if (at != std::string::npos && at < query &&
                (conninfo.find('@', at + 1) < query || slash < at))
                throw ConfigError("--pg: the URI has an \"@\" after its user information or a \"/\" before it; "
                                  "percent-encode \"@\" (%40) and \"/\" (%2F) in the user name and password");
        }
        char* error = nullptr;
        ConninfoOptions options(PQconninfoParse(conninfo.c_str(), &error));
        if (!options) {
            std::string message = error ? error : "out of memory";
            if (error) PQfreemem(error);
            message = redact_parse_error(conninfo, message);
            std::string hint;
            if (message.rfind("missing \"=\" after", 0) == 0)
                hint = " (a value with spaces needs single quotes, e.g. password='a b')";
            throw ConfigError("--pg: invalid connection string: " + message + hint);
        }
        for (auto* o = options.get(); o->keyword; ++o)
            if (o->val) given[o->keyword] = o->val;
    }
    // The PG* environment fills what the string leaves out.
    std::map<std::string, std::string> from_env;
    if (ConninfoOptions defaults{PQconndefaults()}) {
        for (auto* o = defaults.get(); o->keyword; ++o)
            if (o->val && !given.count(o->keyword)) {
                given[o->keyword] = o->val;
                if (o->envvar && std::getenv(o->envvar)) from_env[o->keyword] = o->envvar;
            }
    }
    auto where = [&](const std::string& keyword) {
        const auto env = from_env.find(keyword);
        return env == from_env.end() ? std::string() : " (from " + env->second + ")";
    };
    auto one_of = [&](const char* keyword, std::initializer_list<const char*> allowed, bool ignore_case = false) {
        const auto it = given.find(keyword);
        if (it == given.end() || (ignore_case && it->second.empty())) return;
        std::string list;
        for (const char* a : allowed) {
            if (ignore_case ? strcasecmp(a, it->second.c_str()) == 0 : it->second == a) return;
            list += list.empty() ? a : std::string(", ") + a;
        }
        throw ConfigError("--pg: " + std::string(keyword) + " \"" + it->second + "\"" + where(keyword) +
                          " is not one of " + list);
    };
    one_of("sslmode", {"disable", "allow", "prefer", "require", "verify-ca", "verify-full"});
    one_of("gssencmode", {"disable", "prefer", "require"});
    one_of("channel_binding", {"disable", "prefer", "require"});
    one_of("target_session_attrs", {"any", "read-write", "read-only", "primary", "standby", "prefer-standby"});
    one_of("ssl_min_protocol_version", {"TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"}, true);
    one_of("ssl_max_protocol_version", {"TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"}, true);
    for (const char* keyword :
         {"connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
          "tcp_user_timeout"}) {
        const auto it = given.find(keyword);
        if (it != given.end() && !it->second.empty() && !is_integer(it->second))
            throw ConfigError("--pg: " + std::string(keyword) + " \"" + it->second + "\"" + where(keyword) +
                              " is not an integer");
    }
    std::size_t hosts = 1;
    if (const auto it = given.find("hostaddr"); it != given.end() && !it->second.empty()) {
        const auto addrs = split_list(it->second);
        hosts = addrs.size();
        for (const auto& a : addrs) {
            unsigned char buf[16];
            if (!a.empty() && inet_pton(AF_INET, a.c_str(), buf) != 1 && inet_pton(AF_INET6, a.c_str(), buf) != 1)
                throw ConfigError("--pg: hostaddr \"" + a + "\"" + where("hostaddr") + " is not an IP address");
        }
        if (const auto h = given.find("host"); h != given.end() && !h->second.empty() &&
                                               split_list(h->second).size() != hosts)
            throw ConfigError("--pg: host and hostaddr list different numbers of hosts");
    } else if (const auto h = given.find("host"); h != given.end() && !h->second.empty()) {
        hosts = split_list(h->second).size();
    }
    if (const auto it = given.find("port"); it != given.end() && !it->second.empty()) {
        const auto ports = split_list(it->second);
        for (const auto& p : ports) {
            long n = 0;
            if (!p.empty() && (!is_integer(p, &n) || n < 1 || n > 65535))
                throw ConfigError("--pg: port \"" + p + "\"" + where("port") + " is not a port number (1-65535)");
        }
        if (ports.size() != 1 && ports.size() != hosts)
            throw ConfigError("--pg: " + std::to_string(ports.size()) + " ports for " + std::to_string(hosts) +
                              " hosts; give one port, or one for each host");
    }
}

std::string describe_conninfo(const std::string& conninfo) {
    if (conninfo.empty()) return "libpq's PG* environment";
    if (!is_connection_string(conninfo)) return "dbname=" + quote_value(conninfo);
    char* error = nullptr;
    ConninfoOptions options(PQconninfoParse(conninfo.c_str(), &error));
    if (error) PQfreemem(error);
    if (!options) return "(an invalid connection string)";
    std::string out;
    for (auto* o = options.get(); o->keyword; ++o) {
        if (!o->val) continue;
        if (!out.empty()) out += ' ';
        out += o->keyword;
        out += '=';
        out += is_secret_option(o->keyword) ? "********" : quote_value(o->val);
    }
    return out;
}

bool is_settings_failure(std::string_view m) {
    // libpq's own checks of option values, which it makes when it
    // connects (the relay runs in the C locale: libpq's messages are not
    // translated).
    const bool invalid_value = m.find("invalid ") != std::string_view::npos &&
                               (m.find(" value: \"") != std::string_view::npos ||
                                m.find("invalid integer value") != std::string_view::npos ||
                                m.find("invalid port number") != std::string_view::npos ||
                                m.find("invalid connection option") != std::string_view::npos ||
                                m.find("invalid URI") != std::string_view::npos);
    return invalid_value || m.find("could not match ") != std::string_view::npos ||
           m.find("could not parse network address") != std::string_view::npos ||
           m.find("definition of service \"") != std::string_view::npos ||
           m.find("\" invalid when ") != std::string_view::npos;
}

void set_pg_timeout(std::chrono::milliseconds timeout) { g_pg_timeout_ms = timeout.count(); }

std::chrono::milliseconds pg_timeout() { return std::chrono::milliseconds(g_pg_timeout_ms.load()); }

// The connection is made with libpq's asynchronous calls, each wait
// bounded by --pg-timeout as a whole and cut short by a stop request:
// PQconnectdb would wait connect_timeout for each host, and not wake up
// for SIGTERM. libpq's own settings are derived from the same bound, so
// that the kernel gives up on a link that acknowledges nothing
// (tcp_user_timeout) or answers no keepalive probe in about the same time;
// a connection string may set them otherwise.
PgConnection::PgConnection(const std::string& conninfo, const std::string& application_name)
    : timeout_(pg_timeout()) {
    // The server keeps 63 bytes of an application name and says so with a
    // NOTICE; control characters would become "?" there anyway.
    std::string name;
    for (char c : application_name) name += static_cast<unsigned char>(c) < 0x20 || c == 0x7f ? '?' : c;
    if (name.size() > 63) name.resize(63);
    const auto seconds = timeout_.count() / 1000;
    const std::string connect_timeout = seconds_text(timeout_);
    const std::string user_timeout = std::to_string(timeout_.count());
    const std::string idle = std::to_string(std::max<std::int64_t>(1, seconds / 3));
    const std::string interval = std::to_string(std::max<std::int64_t>(1, seconds / 6));
    // Defaults first: keywords given later, those of the expanded conninfo
    // included, override them.
    const char* keys[] = {"application_name", "connect_timeout", "tcp_user_timeout", "keepalives",
                          "keepalives_idle", "keepalives_interval", "keepalives_count", "dbname", nullptr};
    const char* values[] = {name.c_str(), connect_timeout.c_str(), user_timeout.c_str(), "1",
                            idle.c_str(), interval.c_str(), "3",
                            conninfo.empty() ? nullptr : conninfo.c_str(), nullptr};
    conn_.reset(PQconnectStartParams(keys, values, 1));
    if (!conn_) throw PgError("could not allocate a PostgreSQL connection", "", true);
    auto failed = [this](const std::string& why) {
        std::string msg = why.empty() ? PQerrorMessage(conn_.get()) : why;
        while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
        throw PgError("could not connect to PostgreSQL: " + msg, "08001", true);
    };
    if (PQstatus(conn_.get()) == CONNECTION_BAD) failed({});
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (auto polling = PGRES_POLLING_WRITING; polling != PGRES_POLLING_OK;) {
        if (polling == PGRES_POLLING_FAILED) failed({});
        const auto waited = wait_socket(PQsocket(conn_.get()), polling == PGRES_POLLING_READING ? POLLIN : POLLOUT,
                                        deadline);
        if (waited == WaitResult::timed_out)
            failed("no answer within " + std::to_string(timeout_.count()) + " ms (--pg-timeout)");
        if (waited == WaitResult::stopping) failed("the relay is stopping");
        polling = PQconnectPoll(conn_.get());
    }
    // From here on nothing blocks in libpq: every wait is wait_socket()'s,
    // PQfinish() included, which would otherwise wait to send its goodbye
    // on a link that takes nothing.
    if (PQsetnonblocking(conn_.get(), 1) != 0) failed({});
    // Notices and warnings go to the relay's log, which escapes them,
    // instead of libpq's raw line on stderr.
    PQsetNoticeProcessor(conn_.get(), log_notice, nullptr);
}

void PgConnection::await(short events, std::chrono::steady_clock::time_point deadline, const std::string& statement,
                         bool prepared) {
    const int fd = PQsocket(conn_.get());
    if (fd < 0) throw_error(nullptr, "the connection is closed", statement, prepared);
    const auto waited = wait_socket(fd, events, deadline);
    if (waited == WaitResult::ready) return;
    // A link that takes nothing (a firewall dropping packets, a cable
    // cut) or a server that does not answer: the socket is shut down, so
    // that libpq sees the connection as lost and everything queued on it
    // fails at once, and the caller reconnects. The server notices the
    // gone client through the settings pin_settings() made.
    ::shutdown(fd, SHUT_RDWR);
    PQconsumeInput(conn_.get());
    const std::string why = waited == WaitResult::timed_out
                                ? "no answer from PostgreSQL within " + std::to_string(timeout_.count()) +
                                      " ms (--pg-timeout); the connection is closed"
                                : "the relay is stopping; the connection is closed";
    throw PgError(why + (prepared ? " (statement " + statement + ")" : std::string()), "08006", true, statement);
}

void PgConnection::flush(std::chrono::steady_clock::time_point deadline, const std::string& statement,
                         bool prepared) {
    while (true) {
        const int rc = PQflush(conn_.get());
        if (rc == 0) return;
        if (rc < 0) throw_error(nullptr, "could not send a query", statement, prepared);
        // The server may be waiting for the relay to read before it reads
        // on: both ways.
        await(POLLOUT | POLLIN, deadline, statement, prepared);
        if (PQconsumeInput(conn_.get()) == 0) throw_error(nullptr, "could not send a query", statement, prepared);
    }
}

PGresult* PgConnection::next_result(std::chrono::steady_clock::time_point deadline, const std::string& statement,
                                    bool prepared) {
    flush(deadline, statement, prepared);
    while (PQisBusy(conn_.get())) {
        await(POLLIN, deadline, statement, prepared);
        if (PQconsumeInput(conn_.get()) == 0) break;  // PQgetResult reports it
    }
    return PQgetResult(conn_.get());
}

PgResult PgConnection::last_result(const std::string& statement, bool prepared) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    PgResult last(nullptr);
    while (PGresult* r = next_result(deadline, statement, prepared)) {
        last = PgResult(r);
        if (PQstatus(conn_.get()) == CONNECTION_BAD) break;
    }
    return last;
}

void PgConnection::pin_settings(bool keep_handler_settings) {
    // The server's side of the bound: a backend whose relay is gone (its
    // link cut) notices within --pg-timeout and ends, its transaction and
    // locks with it, instead of waiting for the kernel's retransmissions
    // (about 15 minutes) to give up. Over a Unix socket these do nothing.
    const std::string ms = std::to_string(timeout_.count());
    exec("SELECT pg_catalog.set_config('tcp_user_timeout'::pg_catalog.text, $1::pg_catalog.text, false),"
         "       pg_catalog.set_config('tcp_keepalives_idle'::pg_catalog.text, $2::pg_catalog.text, false),"
         "       pg_catalog.set_config('tcp_keepalives_interval'::pg_catalog.text, $2::pg_catalog.text, false),"
         "       pg_catalog.set_config('tcp_keepalives_count'::pg_catalog.text, '3'::pg_catalog.text, false),"
         "       pg_catalog.set_config('client_connection_check_interval'::pg_catalog.text, $1::pg_catalog.text,"
         "                             false)",
         {ms, std::to_string(std::max<std::int64_t>(1, timeout_.count() / 3000))});
    // What reaches Redis and the log is UTF-8 whatever the role's
    // client_encoding; the rest only changes how values are written as
    // text, which a consume handler's own SQL may depend on (DateStyle
    // also decides how '01/12/2026' is read), so consume mode leaves it.
    if (keep_handler_settings) {
        exec("SELECT pg_catalog.set_config('client_encoding', 'UTF8', false)");
        return;
    }
    exec("SELECT pg_catalog.set_config('client_encoding', 'UTF8', false),"
         "       pg_catalog.set_config('DateStyle', 'ISO, MDY', false),"
         "       pg_catalog.set_config('TimeZone', 'UTC', false),"
         "       pg_catalog.set_config('IntervalStyle', 'postgres', false),"
         "       pg_catalog.set_config('extra_float_digits', '3', false),"
         "       pg_catalog.set_config('bytea_output', 'hex', false)");
}

void PgConnection::throw_error(const PGresult* r, const std::string& what, const std::string& statement,
                               bool prepared) const {
    const char* state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
    std::string msg = r ? PQresultErrorMessage(r) : PQerrorMessage(conn_.get());
    while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
    const bool lost = PQstatus(conn_.get()) != CONNECTION_OK;
    throw PgError(what + (prepared ? " (statement " + statement + ")" : std::string()) + ": " + msg,
                  state ? state : (lost ? "08006" : ""), lost, statement);
}

PgResult PgConnection::exec(const std::string& sql, const std::vector<Param>& params) {
    return exec(sql, params, {});
}

namespace {

// The parameters of a statement as libpq takes them: each value's bytes
// and length (NULL: none), and a format each (text unless given).
struct ParamArrays {
    std::vector<const char*> values;
    std::vector<int> lengths;
    std::vector<int> formats;

    ParamArrays(const std::vector<Param>& params, const std::vector<int>& given) : formats(given) {
        values.reserve(params.size());
        lengths.reserve(params.size());
        for (const auto& p : params) {
            values.push_back(p ? p->data() : nullptr);
            lengths.push_back(p ? static_cast<int>(p->size()) : 0);
        }
        formats.resize(params.size(), 0);
    }
    int size() const { return static_cast<int>(values.size()); }
};

}  // namespace

PgResult PgConnection::exec(const std::string& sql, const std::vector<Param>& params,
                            const std::vector<int>& formats) {
    const ParamArrays p(params, formats);
    if (PQsendQueryParams(conn_.get(), sql.c_str(), p.size(), nullptr, p.values.data(), p.lengths.data(),
                          p.formats.data(), 0) == 0)
        throw_error(nullptr, "could not send a query", sql);
    return checked_result(sql, false);
}

PgResult PgConnection::checked_result(const std::string& statement, bool prepared) {
    PgResult result = last_result(statement, prepared);
    const PGresult* raw = result.raw();
    const auto status = raw ? PQresultStatus(raw) : PGRES_FATAL_ERROR;
    if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) throw_error(raw, "query failed", statement, prepared);
    return result;
}

PgResult PgConnection::exec_prepared(const std::string& name, const std::vector<Param>& params,
                                     const std::vector<int>& formats) {
    const ParamArrays p(params, formats);
    if (PQsendQueryPrepared(conn_.get(), name.c_str(), p.size(), p.values.data(), p.lengths.data(), p.formats.data(),
                            0) == 0)
        throw_error(nullptr, "could not send a query", name, true);
    return checked_result(name, true);
}

void PgConnection::prepare(const std::string& name, const std::string& sql, const std::vector<Oid>& types) {
    if (PQsendPrepare(conn_.get(), name.c_str(), sql.c_str(), static_cast<int>(types.size()),
                      types.empty() ? nullptr : types.data()) == 0)
        throw_error(nullptr, "could not prepare a statement", name, true);
    PgResult result = last_result(name, true);
    const PGresult* raw = result.raw();
    if (!raw || PQresultStatus(raw) != PGRES_COMMAND_OK) throw_error(raw, "could not prepare a statement", name, true);
}

void PgConnection::queue(const char* name, const char* sql, const std::vector<Param>& params, bool binary_result) {
    std::string statement = name ? name : sql;
    if (queued_ == 0 && PQenterPipelineMode(conn_.get()) == 0)
        throw_error(nullptr, "could not enter pipeline mode", statement, name != nullptr);
    std::vector<const char*> values;
    values.reserve(params.size());
    for (const auto& p : params) values.push_back(p ? p->c_str() : nullptr);
    const int n = static_cast<int>(values.size());
    const int format = binary_result ? 1 : 0;
    const int sent = name ? PQsendQueryPrepared(conn_.get(), name, n, values.data(), nullptr, nullptr, format)
                          : PQsendQueryParams(conn_.get(), sql, n, nullptr, values.data(), nullptr, nullptr, format);
    if (sent == 0 || PQpipelineSync(conn_.get()) == 0)
        throw_error(nullptr, "could not send a query", statement, name != nullptr);
    flush(std::chrono::steady_clock::now() + timeout_, statement, name != nullptr);
    sent_.emplace_back(std::move(statement), name != nullptr);
    ++queued_;
}

void PgConnection::send(const std::string& sql, const std::vector<Param>& params) {
    queue(nullptr, sql.c_str(), params);
}

void PgConnection::send_prepared(const std::string& name, const std::vector<Param>& params, bool binary_result) {
    queue(name.c_str(), nullptr, params, binary_result);
}

PgResult PgConnection::receive() {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    const auto& [sent_statement, sent_prepared] = sent_.front();
    PGresult* raw = nullptr;
    try {
        raw = next_result(deadline, sent_statement, sent_prepared);
    } catch (const PgError&) {
        // Lost with the connection, and so is everything queued after it.
        queued_ = 0;
        sent_.clear();
        throw;
    }
    PgResult result(raw);
    // Then the end of the statement (NULL) and its sync point. Two NULLs in
    // a row mean the connection broke.
    for (int nulls = 0; nulls < 2;) {
        PGresult* extra = nullptr;
        try {
            extra = next_result(deadline, sent_statement, sent_prepared);
        } catch (const PgError&) {
            break;  // the connection is lost: throw_error below says so
        }
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
    auto [statement, prepared] = std::move(sent_.front());
    sent_.pop_front();
    const auto status = raw ? PQresultStatus(raw) : PGRES_FATAL_ERROR;
    if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK)
        throw_error(raw, "query failed", statement, prepared);
    return result;
}

void PgConnection::listen(const std::string& channel) {
    std::unique_ptr<char, decltype(&PQfreemem)> quoted(
        PQescapeIdentifier(conn_.get(), channel.c_str(), channel.size()), &PQfreemem);
    if (!quoted) throw_error(nullptr, "LISTEN");
    exec(std::string("LISTEN ") + quoted.get());
}

bool PgConnection::in_recovery() { return exec("SELECT pg_catalog.pg_is_in_recovery()").get(0, 0) == "t"; }

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
    const int fd = PQsocket(conn_.get());
    if (fd < 0) throw_error(nullptr, "waiting for notifications");
    // An idle connection: the kernel's keepalives (and tcp_user_timeout)
    // find a dead link here; a stop request ends the wait like a timeout.
    if (wait_socket(fd, POLLIN, std::chrono::steady_clock::now() + timeout) != WaitResult::ready) return 0;
    if (PQconsumeInput(conn_.get()) == 0) throw_error(nullptr, "waiting for notifications");
    return drain();
}

}  // namespace pg_outbox
