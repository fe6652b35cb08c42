/* test_command.c - unit tests of the command table: lookups in any case and
 * at name boundaries, subcommand resolution, arity/keys/flags of known
 * commands, routing classes, and the argument-dependent XREAD blocking. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "command.h"

#define MAX_ARGS 16

/* A request split from a space-separated string, for the argv lookups. */
typedef struct request {
    size_t argc;
    const char *argv[MAX_ARGS];
    size_t lens[MAX_ARGS];
    char buf[256];
} request;

static void split(request *req, const char *line)
{
    char *save = NULL;
    assert_true(strlen(line) < sizeof(req->buf));
    strcpy(req->buf, line);
    req->argc = 0;
    char *tok = strtok_r(req->buf, " ", &save);
    while (tok != NULL) {
        assert_true(req->argc < MAX_ARGS);
        req->argv[req->argc] = tok;
        req->lens[req->argc] = strlen(tok);
        req->argc++;
        tok = strtok_r(NULL, " ", &save);
    }
}

static const command *lookup_str(const char *name)
{
    return command_lookup(name, strlen(name));
}

static const command *lookup_line(const char *line)
{
    request req;
    split(&req, line);
    return command_lookup_argv(req.argc, req.argv, req.lens);
}

static int blocking_line(const char *line)
{
    request req;
    split(&req, line);
    const command *cmd = command_lookup_argv(req.argc, req.argv, req.lens);
    assert_non_null(cmd);
    resp_arg args[MAX_ARGS];
    for (size_t i = 0; i < req.argc; i++) {
        args[i].ptr = req.argv[i];
        args[i].len = req.lens[i];
    }
    return command_is_blocking(cmd, req.argc, args);
}

static void test_lookup_any_case(void **state)
{
    (void)state;
    const command *get = lookup_str("get");
    assert_non_null(get);
    assert_string_equal(get->name, "get");
    assert_ptr_equal(lookup_str("GET"), get);
    assert_ptr_equal(lookup_str("gEt"), get);
    assert_string_equal(lookup_str("ZRANGEBYSCORE")->name, "zrangebyscore");
    assert_string_equal(lookup_str("Restore-Asking")->name, "restore-asking");
}

static void test_lookup_not_nul_terminated(void **state)
{
    (void)state;
    const char buf[] = {'S', 'E', 'T', 'E', 'X', 'x'};
    assert_string_equal(command_lookup(buf, 3)->name, "set");
    assert_string_equal(command_lookup(buf, 5)->name, "setex");
    assert_null(command_lookup(buf, 6));
    assert_string_equal(command_lookup("getdelfoo", 6)->name, "getdel");
}

static void test_lookup_unknown_and_edges(void **state)
{
    (void)state;
    assert_null(lookup_str("nosuchcommand"));
    assert_null(lookup_str("ge"));
    assert_null(lookup_str("gett"));
    assert_null(lookup_str("g"));
    assert_null(command_lookup("get", 0));
    assert_null(command_lookup("", 0));
    assert_null(command_lookup(NULL, 3));
    assert_null(command_lookup("get\0", 4)); /* embedded NUL */
    assert_null(lookup_str("config|get"));   /* subcommands only via argv */
    assert_null(lookup_str("get "));
    char longname[300];
    memset(longname, 'a', sizeof(longname));
    assert_null(command_lookup(longname, sizeof(longname)));
    assert_null(lookup_str("\xc3\xa9"));
}

static void test_every_entry_found(void **state)
{
    (void)state;
    size_t count = 0;
    const command *table = command_table(&count);
    assert_non_null(table);
    assert_true(count > 200);
    size_t subs = 0;
    for (size_t i = 0; i < count; i++) {
        const command *cmd = &table[i];
        char upper[64];
        size_t len = strlen(cmd->name);
        assert_true(len < sizeof(upper));
        for (size_t j = 0; j < len; j++) {
            char c = cmd->name[j];
            upper[j] = (c >= 'a' && c <= 'z') ? (char)(c - 'a' + 'A') : c;
        }
        assert_ptr_equal(command_lookup(cmd->name, len), cmd);
        assert_ptr_equal(command_lookup(upper, len), cmd);
        assert_null(strchr(cmd->name, '|'));
        if (i > 0) {
            assert_true(strcmp(table[i - 1].name, cmd->name) < 0);
        }
        assert_true((cmd->sub == NULL) == (cmd->nsub == 0));
        for (size_t j = 0; j < cmd->nsub; j++) {
            const command *sub = &cmd->sub[j];
            const char *bar = strchr(sub->name, '|');
            assert_non_null(bar);
            assert_int_equal((size_t)(bar - sub->name), len);
            assert_memory_equal(sub->name, cmd->name, len);
            assert_null(sub->sub);
            const char *argv[2] = {upper, bar + 1};
            size_t lens[2] = {len, strlen(bar + 1)};
            assert_ptr_equal(command_lookup_argv(2, argv, lens), sub);
            if (j > 0) {
                assert_true(strcmp(cmd->sub[j - 1].name, sub->name) < 0);
            }
            subs++;
        }
    }
    assert_true(subs > 100);
}

static void test_subcommands(void **state)
{
    (void)state;
    const command *config = lookup_str("config");
    assert_non_null(config);
    assert_true(config->nsub > 0);
    assert_string_equal(lookup_line("CONFIG GET maxmemory")->name, "config|get");
    assert_string_equal(lookup_line("config Set maxmemory 1")->name, "config|set");
    assert_string_equal(lookup_line("client SETNAME x")->name, "client|setname");
    assert_string_equal(lookup_line("CLIENT no-evict on")->name, "client|no-evict");
    assert_string_equal(lookup_line("object encoding k")->name, "object|encoding");
    assert_string_equal(lookup_line("xinfo stream s")->name, "xinfo|stream");
    assert_string_equal(lookup_line("XGROUP CREATECONSUMER s g c")->name, "xgroup|createconsumer");
    assert_string_equal(lookup_line("pubsub channels")->name, "pubsub|channels");
    assert_string_equal(lookup_line("command docs get")->name, "command|docs");
    assert_string_equal(lookup_line("memory usage k")->name, "memory|usage");
    assert_string_equal(lookup_line("acl whoami")->name, "acl|whoami");
    assert_string_equal(lookup_line("cluster slots")->name, "cluster|slots");
    assert_string_equal(lookup_line("latency latest")->name, "latency|latest");
    assert_string_equal(lookup_line("module list")->name, "module|list");
    assert_string_equal(lookup_line("slowlog get")->name, "slowlog|get");
    assert_string_equal(lookup_line("function kill")->name, "function|kill");
    /* missing or unknown subcommand: the container */
    assert_ptr_equal(lookup_line("config"), config);
    assert_ptr_equal(lookup_line("config nosuch"), config);
    assert_ptr_equal(lookup_line("config ge"), config);
    assert_ptr_equal(lookup_line("config gett"), config);
    const char *argv[2] = {"config", "get"};
    size_t lens[2] = {6, 0};
    assert_ptr_equal(command_lookup_argv(2, argv, lens), config);
    lens[1] = 2;
    assert_ptr_equal(command_lookup_argv(2, argv, lens), config);
    /* not a container: argv[1] is ignored */
    assert_string_equal(lookup_line("get config")->name, "get");
    /* unknown or empty requests */
    assert_null(lookup_line("nosuch get"));
    assert_null(command_lookup_argv(0, argv, lens));
}

static void test_known_entries(void **state)
{
    (void)state;
    const command *get = lookup_str("get");
    assert_int_equal(get->arity, 2);
    assert_int_equal(get->first_key, 1);
    assert_int_equal(get->last_key, 1);
    assert_int_equal(get->key_step, 1);
    assert_true(get->flags & CMD_F_READONLY);
    assert_true(get->flags & CMD_F_FAST);
    assert_false(get->flags & CMD_F_WRITE);

    const command *set = lookup_str("set");
    assert_int_equal(set->arity, -3);
    assert_true(set->flags & CMD_F_WRITE);
    assert_true(set->flags & CMD_F_DENYOOM);

    const command *blpop = lookup_str("blpop");
    assert_int_equal(blpop->arity, -3);
    assert_int_equal(blpop->first_key, 1);
    assert_int_equal(blpop->last_key, -2);
    assert_int_equal(blpop->key_step, 1);
    assert_true(blpop->flags & CMD_F_BLOCKING);

    const command *eval = lookup_str("eval");
    assert_true(eval->flags & CMD_F_MOVABLEKEYS);
    assert_int_equal(eval->first_key, 0);

    const command *mset = lookup_str("mset");
    assert_int_equal(mset->arity, -3);
    assert_int_equal(mset->first_key, 1);
    assert_int_equal(mset->last_key, -1);
    assert_int_equal(mset->key_step, 2);

    const command *cget = lookup_line("config get x");
    assert_int_equal(cget->arity, -3);
    assert_true(cget->flags & CMD_F_ADMIN);
    assert_true(lookup_str("auth")->flags & CMD_F_NO_AUTH);
}

static void assert_class(const char *line, command_class cls)
{
    const command *cmd = lookup_line(line);
    assert_non_null(cmd);
    if (cmd->cls != cls) {
        fail_msg("%s: class %s, expected %s", line, command_class_name(cmd->cls),
                 command_class_name(cls));
    }
}

static void test_classes(void **state)
{
    (void)state;
    assert_class("get k", CMD_STATELESS);
    assert_class("publish c m", CMD_STATELESS);
    assert_class("spublish c m", CMD_STATELESS);
    assert_class("pubsub channels", CMD_STATELESS);
    assert_class("client list", CMD_STATELESS);
    assert_class("eval s 0", CMD_STATELESS);
    assert_class("function list", CMD_STATELESS);
    assert_class("config get x", CMD_STATELESS);
    assert_class("config set x y", CMD_STATELESS);
    assert_class("wait 1 0", CMD_STATELESS);
    assert_class("config", CMD_STATELESS);

    assert_class("blpop k 0", CMD_BLOCKING);
    assert_class("BZMPOP 0 1 k MIN", CMD_BLOCKING);
    assert_class("brpoplpush a b 0", CMD_BLOCKING);
    assert_class("script kill", CMD_BLOCKING);
    assert_class("FUNCTION KILL", CMD_BLOCKING);
    assert_class("xread streams s 0", CMD_BLOCKING);

    assert_class("subscribe c", CMD_PUBSUB);
    assert_class("SSUBSCRIBE c", CMD_PUBSUB);
    assert_class("punsubscribe", CMD_PUBSUB);

    assert_class("multi", CMD_TRANSACTION);
    assert_class("exec", CMD_TRANSACTION);
    assert_class("discard", CMD_TRANSACTION);
    assert_class("watch k", CMD_TRANSACTION);
    assert_class("unwatch", CMD_TRANSACTION);

    assert_class("select 1", CMD_CONNSTATE);
    assert_class("monitor", CMD_CONNSTATE);
    assert_class("client setname x", CMD_CONNSTATE);
    assert_class("client tracking on", CMD_CONNSTATE);
    assert_class("client reply off", CMD_CONNSTATE);
    assert_class("client caching yes", CMD_CONNSTATE);
    assert_class("client no-evict on", CMD_CONNSTATE);
    assert_class("readonly", CMD_CONNSTATE);
    assert_class("readwrite", CMD_CONNSTATE);
    assert_class("asking", CMD_CONNSTATE);

    assert_class("shutdown", CMD_DENIED);
    assert_class("replicaof no one", CMD_DENIED);
    assert_class("slaveof no one", CMD_DENIED);
    assert_class("failover", CMD_DENIED);
    assert_class("debug sleep 0", CMD_DENIED);
    assert_class("config rewrite", CMD_DENIED);

    assert_class("auth p", CMD_LOCAL);
    assert_class("hello 3", CMD_LOCAL);
    assert_class("quit", CMD_LOCAL);
    assert_class("reset", CMD_LOCAL);

    assert_string_equal(command_class_name(CMD_STATELESS), "stateless");
    assert_string_equal(command_class_name(CMD_BLOCKING), "blocking");
    assert_string_equal(command_class_name(CMD_PUBSUB), "pubsub");
    assert_string_equal(command_class_name(CMD_TRANSACTION), "transaction");
    assert_string_equal(command_class_name(CMD_CONNSTATE), "connstate");
    assert_string_equal(command_class_name(CMD_DENIED), "denied");
    assert_string_equal(command_class_name(CMD_LOCAL), "local");
}

static void test_blocking(void **state)
{
    (void)state;
    assert_true(blocking_line("blpop k 0"));
    assert_true(blocking_line("BRPOP a b 1.5"));
    assert_true(blocking_line("blmove a b LEFT RIGHT 0"));
    assert_true(blocking_line("bzpopmin z 0"));
    assert_true(blocking_line("script kill"));
    assert_false(blocking_line("script flush"));
    assert_false(blocking_line("get k"));
    assert_false(blocking_line("wait 1 0"));
    assert_false(blocking_line("subscribe c"));
    assert_false(command_is_blocking(NULL, 0, NULL));

    assert_false(blocking_line("xread streams s 0"));
    assert_false(blocking_line("XREAD COUNT 10 STREAMS s 0"));
    assert_true(blocking_line("xread block 0 streams s $"));
    assert_true(blocking_line("XREAD COUNT 1 BlOcK 100 STREAMS s $"));
    assert_false(blocking_line("xread streams block 0")); /* "block" is a key */
    assert_false(blocking_line("xread count 1 streams block $"));
    assert_false(blocking_line("xread block")); /* syntax error in Redis */
    assert_false(blocking_line("xread"));

    assert_false(blocking_line("xreadgroup group g c streams s >"));
    assert_true(blocking_line("XREADGROUP GROUP g c BLOCK 0 STREAMS s >"));
    assert_true(blocking_line("xreadgroup group g c count 5 noack block 10 streams s >"));
    assert_false(blocking_line("xreadgroup group block c streams s >"));
    assert_false(blocking_line("xreadgroup group g block streams s >"));
    assert_false(blocking_line("xreadgroup group g c streams block >"));
    assert_true(blocking_line("xreadgroup group g c claim 100 block 0 streams s >"));
    assert_false(blocking_line("xread claim 100 block 0 streams s $")); /* XREADGROUP only */
    assert_false(blocking_line("xreadgroup block 0 streams s >"));      /* no GROUP */
    assert_false(blocking_line("xread block 0 streams a b $"));         /* unbalanced */
}

/* line split into resp_args; command_xread_args on them. */
static int xread_line(const char *line, xread_args *x)
{
    request req;
    split(&req, line);
    resp_arg args[MAX_ARGS];
    for (size_t i = 0; i < req.argc; i++) {
        args[i].ptr = req.argv[i];
        args[i].len = req.lens[i];
    }
    return command_xread_args(req.argc > 0 && req.lens[0] == 10, req.argc, args, x);
}

static void test_xread_args(void **state)
{
    (void)state;
    xread_args x;
    assert_int_equal(xread_line("xread count 2 streams a b 0 $", &x), 0);
    assert_int_equal(x.keys, 4);
    assert_int_equal(x.nkeys, 2);
    assert_int_equal(x.group, 0);
    assert_false(x.block);

    assert_int_equal(xread_line("XREADGROUP GROUP g c NOACK BLOCK 5 STREAMS s >", &x), 0);
    assert_int_equal(x.group, 2);
    assert_int_equal(x.keys, 8);
    assert_int_equal(x.nkeys, 1);
    assert_true(x.block);
    assert_true(x.noack);
    assert_false(x.claim);

    assert_int_equal(xread_line("xreadgroup group g c claim 10 streams s t > >", &x), 0);
    assert_true(x.claim);
    assert_int_equal(x.keys, 7);
    assert_int_equal(x.nkeys, 2);

    /* Option values are skipped unread (Redis checks them): a stream
     * named "streams", a group named "block". */
    assert_int_equal(xread_line("xread block 1 streams streams 0", &x), 0);
    assert_int_equal(x.keys, 4);
    assert_false(xread_line("xreadgroup group block c streams s >", &x));
    assert_false(x.block);
    /* What Redis refuses. */
    assert_int_equal(xread_line("xread streams s", &x), -1);
    assert_int_equal(xread_line("xread count 1", &x), -1);
    assert_int_equal(xread_line("xread noack streams s 0", &x), -1);
    assert_int_equal(xread_line("xreadgroup streams s >", &x), -1);
    assert_int_equal(xread_line("xreadgroup group g streams s >", &x), -1);
    assert_int_equal(xread_line("xread bogus 1 streams s 0", &x), -1);
    assert_int_equal(xread_line("xread", &x), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup_any_case),
        cmocka_unit_test(test_lookup_not_nul_terminated),
        cmocka_unit_test(test_lookup_unknown_and_edges),
        cmocka_unit_test(test_every_entry_found),
        cmocka_unit_test(test_subcommands),
        cmocka_unit_test(test_known_entries),
        cmocka_unit_test(test_classes),
        cmocka_unit_test(test_blocking),
        cmocka_unit_test(test_xread_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
