/* command.c - lookups in the generated Redis 7.0 command table
 * (command_table.h): a hash index for top-level names, binary search within a
 * container's subcommands, and the argument-dependent blocking check. */
#include "command.h"

#include "command_table.h"

#include <stdint.h>
#include <string.h>

#define FNV_PRIME 16777619u /* 32-bit FNV-1a, as scripts/gen-commands */

static unsigned char lower_ascii(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') {
        return (unsigned char)(c - 'A' + 'a');
    }
    return c;
}

/* Compares a NUL-terminated table name with key[0..len) (already lowercase)
 * in byte order, as the generator sorts: <0, 0 or >0 like strcmp. */
static int compare_name(const char *entry, const unsigned char *key, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char e = (unsigned char)entry[i];
        if (e == '\0') {
            return -1; /* entry is a proper prefix of key */
        }
        if (e != key[i]) {
            return (int)e - (int)key[i];
        }
    }
    return entry[len] == '\0' ? 0 : 1;
}

const command *command_lookup(const char *name, size_t len)
{
    unsigned char lower[COMMAND_NAME_MAX];
    uint32_t hash = COMMAND_HASH_SEED;

    if (name == NULL || len == 0 || len > COMMAND_NAME_MAX) {
        return NULL;
    }
    for (size_t i = 0; i < len; i++) {
        lower[i] = lower_ascii((unsigned char)name[i]);
        hash ^= lower[i];
        hash *= FNV_PRIME;
    }
    size_t pos = hash & (COMMAND_HASH_SIZE - 1);
    for (int probe = 0; probe < COMMAND_HASH_MAX_PROBE; probe++) {
        unsigned slot = command_hash_slots[pos];
        if (slot == 0) {
            return NULL;
        }
        const command *cmd = &command_entries[slot - 1];
        if (compare_name(cmd->name, lower, len) == 0) {
            return cmd;
        }
        pos = (pos + 1) & (COMMAND_HASH_SIZE - 1);
    }
    return NULL;
}

/* The subcommand of container whose name after "container|" is sub (any
 * case), or NULL. */
static const command *subcommand_lookup(const command *container, const char *sub, size_t len)
{
    unsigned char lower[COMMAND_SUBNAME_MAX];
    size_t prefix = 0;

    if (sub == NULL || len == 0 || len > COMMAND_SUBNAME_MAX) {
        return NULL;
    }
    for (size_t i = 0; i < len; i++) {
        lower[i] = lower_ascii((unsigned char)sub[i]);
    }
    while (container->name[prefix] != '\0') {
        prefix++;
    }
    prefix++; /* the '|' */

    size_t lo = 0;
    size_t hi = container->nsub;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int cmp = compare_name(container->sub[mid].name + prefix, lower, len);
        if (cmp == 0) {
            return &container->sub[mid];
        }
        if (cmp < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return NULL;
}

const command *command_lookup_argv(size_t argc, const char *const *argv, const size_t *lens)
{
    if (argc == 0 || argv == NULL || lens == NULL) {
        return NULL;
    }
    const command *cmd = command_lookup(argv[0], lens[0]);
    if (cmd != NULL && cmd->nsub > 0 && argc >= 2) {
        const command *sub = subcommand_lookup(cmd, argv[1], lens[1]);
        if (sub != NULL) {
            return sub;
        }
    }
    return cmd;
}

const char *command_redis_version(void)
{
    return COMMAND_REDIS_VERSION;
}

const command *command_table(size_t *count)
{
    if (count != NULL) {
        *count = COMMAND_TABLE_COUNT;
    }
    return command_entries;
}

int command_xread_args(int group, size_t argc, const resp_arg *argv, xread_args *out)
{
    memset(out, 0, sizeof(*out));
    for (size_t i = 1; i < argc; i++) {
        size_t more = argc - i - 1;
        const resp_arg *a = &argv[i];
        if (resp_arg_is(a, "block") && more > 0) {
            out->block = 1;
            i++;
        } else if (resp_arg_is(a, "count") && more > 0) {
            i++;
        } else if (resp_arg_is(a, "streams") && more > 0) {
            if (more % 2 != 0 || (group && out->group == 0)) {
                return -1;
            }
            out->keys = i + 1;
            out->nkeys = more / 2;
            return 0;
        } else if (group && resp_arg_is(a, "group") && more >= 2) {
            out->group = i + 1;
            i += 2;
        } else if (group && resp_arg_is(a, "noack")) {
            out->noack = 1;
        } else if (group && resp_arg_is(a, "claim") && more > 0) {
            out->claim = 1; /* Redis 8.4: CLAIM min-idle-time */
            i++;
        } else {
            return -1;
        }
    }
    return -1;
}

int command_is_blocking(const command *cmd, size_t argc, const resp_arg *argv)
{
    if (cmd == NULL || cmd->cls != CMD_BLOCKING) {
        return 0;
    }
    if (cmd->name[0] == 'x') {
        int group = compare_name(cmd->name, (const unsigned char *)"xreadgroup", 10) == 0;
        if (group || compare_name(cmd->name, (const unsigned char *)"xread", 5) == 0) {
            /* Blocks only with BLOCK: option values are skipped, so a group
             * or consumer named "block" does not count, and a request Redis
             * refuses does not block. */
            xread_args x;
            return argv != NULL && command_xread_args(group, argc, argv, &x) == 0 && x.block;
        }
    }
    return 1;
}

int command_takes_out(const command *cmd)
{
    static const char *const names[] = {
        "lpop",       "rpop",   "blpop",  "brpop",   "lmove",      "blmove",   "rpoplpush",
        "brpoplpush", "lmpop",  "blmpop", "zpopmin", "zpopmax",    "bzpopmin", "bzpopmax",
        "zmpop",      "bzmpop", "spop",   "getdel",  "xreadgroup", "xclaim",   "xautoclaim"};
    if (cmd == NULL) {
        return 0;
    }
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(cmd->name, names[i]) == 0) {
            return 1;
        }
    }
    return 0;
}

const char *command_class_name(command_class cls)
{
    switch (cls) {
    case CMD_STATELESS:
        return "stateless";
    case CMD_BLOCKING:
        return "blocking";
    case CMD_PUBSUB:
        return "pubsub";
    case CMD_TRANSACTION:
        return "transaction";
    case CMD_CONNSTATE:
        return "connstate";
    case CMD_DENIED:
        return "denied";
    case CMD_LOCAL:
        return "local";
    }
    return "unknown";
}
