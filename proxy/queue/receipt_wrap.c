/* receipt_wrap.c - a client's Lua script run inside a wrapper that keeps
 * its reply under a receipt key.
 *
 * A script that pops (N4's delayed queue: ZRANGEBYSCORE ... LIMIT 0 1 and
 * ZREM in one step) or pushes (a queue library's add) dies as a pop or a
 * push does: sent and unanswered when the master died, the promoted replica
 * may have run it, and sent again it takes a second item (the first on
 * nobody) or adds a second job. Offsets cannot always tell. So a writing
 * script that names a queue key (receipts.c says which) runs as
 *
 *   local k, a = table.remove(KEYS), table.remove(ARGV)
 *   if a == '1' then kept = GET k; if kept then return it end end
 *   local r = (function(...) <the client's body> end)()
 *   SET k <r, packed>; return r
 *
 * in one atomic step: the script's writes and its reply under the receipt
 * are replicated together (Redis 7 replicates a script's effects as one
 * transaction). Sent again after a failover it answers the first run's
 * reply if the new master has it, else runs. The wrapper is on the body's
 * first line, so the line numbers in Redis' errors are the body's; a body
 * that starts with a '#!lua' line keeps it first (its flags are the
 * script's), the wrapper on the line after. The receipt's SET goes with
 * redis.pcall (a read-only body meeting a full memory still answers) after
 * redis.set_repl(REPL_ALL) (a body that turned replication off for its own
 * writes must not keep the receipt from the replicas) and SELECT 0 (a body
 * that selected another database: the receipt is in database 0, where
 * ferry looks for it and deletes it; refused in cluster mode, which has
 * database 0 only).
 *
 * Not wrapped: a body whose '#!lua' line says no-writes (it cannot pop or
 * push), and a first line starting '#!' that is not '#!lua' (Redis says
 * what is wrong with it). */
#include "receipt_wrap.h"

#include <string.h>

static const char wrap_head[] =
    "local ferry_rk, ferry_again = table.remove(KEYS), table.remove(ARGV) "
    "if ferry_again == '1' then local ferry_kept = redis.call('GET', ferry_rk) "
    "if ferry_kept then return cmsgpack.unpack(ferry_kept) end end "
    "local ferry_r = (function(...) ";
static const char wrap_tail[] = "\nend)() redis.set_repl(redis.REPL_ALL) redis.pcall('SELECT', 0) "
                                "redis.pcall('SET', ferry_rk, cmsgpack.pack(ferry_r)) "
                                "return ferry_r";

/* Whether the shebang line (p, n: '#!lua' and its options) declares
 * no-writes among its flags. */
static int shebang_no_writes(const char *p, size_t n)
{
    static const char flags[] = "flags=";
    for (size_t i = 5; i + sizeof(flags) - 1 <= n; i++) {
        if ((p[i - 1] != ' ' && p[i - 1] != '\t') || memcmp(p + i, flags, sizeof(flags) - 1) != 0) {
            continue;
        }
        const char *f = p + i + sizeof(flags) - 1, *end = p + n;
        while (f < end && *f != ' ' && *f != '\t' && *f != '\r') {
            const char *comma = f;
            while (comma < end && *comma != ',' && *comma != ' ' && *comma != '\t' &&
                   *comma != '\r') {
                comma++;
            }
            if (comma - f == 9 && memcmp(f, "no-writes", 9) == 0) {
                return 1;
            }
            f = comma < end && *comma == ',' ? comma + 1 : comma;
        }
    }
    return 0;
}

int receipt_wrap(const char *body, size_t n, buf *out)
{
    size_t first = 0;
    if (n >= 2 && body[0] == '#' && body[1] == '!') {
        const char *nl = memchr(body, '\n', n);
        size_t line = nl != NULL ? (size_t)(nl - body) : n;
        if (line < 5 || memcmp(body, "#!lua", 5) != 0 ||
            (line > 5 && body[5] != ' ' && body[5] != '\t' && body[5] != '\r') ||
            shebang_no_writes(body, line)) {
            return -1;
        }
        first = nl != NULL ? line + 1 : n;
        buf_append(out, body, line);
        buf_append(out, "\n", 1);
    }
    buf_append(out, wrap_head, sizeof(wrap_head) - 1);
    buf_append(out, body + first, n - first);
    buf_append(out, wrap_tail, sizeof(wrap_tail) - 1);
    return 0;
}

static int is_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

int receipt_wrap_error(const char *p, size_t n, const char sha[41], buf *out)
{
    static const char mark[] = "script: ";
    const size_t m = sizeof(mark) - 1;
    if (n == 0 || p[0] != '-') {
        return 0;
    }
    for (size_t i = 0; i + m + 40 <= n; i++) {
        if (memcmp(p + i, mark, m) != 0) {
            continue;
        }
        size_t h = 0;
        while (h < 40 && is_hex(p[i + m + h])) {
            h++;
        }
        if (h != 40 || (i + m + 40 < n && is_hex(p[i + m + 40]))) {
            continue;
        }
        buf_append(out, p, i + m);
        buf_append(out, sha, 40);
        buf_append(out, p + i + m + 40, n - i - m - 40);
        return 1;
    }
    return 0;
}
