/* command.h - the table of every Redis 7.0 command: arity, key positions,
 * Redis' own flags, and the class ferry routes by. Generated from a Redis
 * 7.0 server's COMMAND reply by scripts/gen-commands (proxy/base/command_table.h);
 * tests/integration compares it with the live server. */
#ifndef FERRY_COMMAND_H
#define FERRY_COMMAND_H

#include <stddef.h>

#include "resp.h"

/* How ferry routes a command (see DESIGN.md "Upstream links"). */
typedef enum command_class {
    CMD_STATELESS = 0, /* shared pipelined link */
    CMD_BLOCKING,      /* dedicated link for the duration of the call */
    CMD_PUBSUB,        /* dedicated link in pass-through mode */
    CMD_TRANSACTION,   /* MULTI/EXEC/DISCARD/WATCH/UNWATCH: dedicated while open */
    CMD_CONNSTATE,     /* SELECT, CLIENT SETNAME/TRACKING/REPLY..., MONITOR */
    CMD_DENIED,        /* refused by default (SHUTDOWN, REPLICAOF, ...) */
    CMD_LOCAL          /* answered by ferry itself (AUTH, HELLO, QUIT, RESET) */
} command_class;

/* Redis' COMMAND flags, one bit each (names as Redis prints them). */
#define CMD_F_WRITE (1u << 0)
#define CMD_F_READONLY (1u << 1)
#define CMD_F_DENYOOM (1u << 2)
#define CMD_F_MODULE (1u << 3)
#define CMD_F_ADMIN (1u << 4)
#define CMD_F_PUBSUB (1u << 5)
#define CMD_F_NOSCRIPT (1u << 6)
#define CMD_F_BLOCKING (1u << 7)
#define CMD_F_LOADING (1u << 8)
#define CMD_F_STALE (1u << 9)
#define CMD_F_SKIP_MONITOR (1u << 10)
#define CMD_F_SKIP_SLOWLOG (1u << 11)
#define CMD_F_ASKING (1u << 12)
#define CMD_F_FAST (1u << 13)
#define CMD_F_NO_AUTH (1u << 14)
#define CMD_F_MAY_REPLICATE (1u << 15)
#define CMD_F_NO_MANDATORY_KEYS (1u << 16)
#define CMD_F_NO_ASYNC_LOADING (1u << 17)
#define CMD_F_NO_MULTI (1u << 18)
#define CMD_F_MOVABLEKEYS (1u << 19)
#define CMD_F_ALLOW_BUSY (1u << 20)

typedef struct command {
    const char *name;                  /* lowercase; subcommands as "config|get" */
    int arity;                         /* Redis arity: -N means at least N */
    int first_key, last_key, key_step; /* legacy key positions, as COMMAND */
    unsigned flags;                    /* CMD_F_* */
    command_class cls;                 /* ferry's routing class */
    const struct command *sub;         /* subcommands, or NULL */
    size_t nsub;                       /* entries in sub */
} command;

/* Find a command by name (any case, not NUL-terminated). NULL if unknown. */
const command *command_lookup(const char *name, size_t len);
/* Find the command for a request: for a container command (CONFIG, CLIENT,
 * ...) with argc >= 2 returns the subcommand entry if known, otherwise the
 * container. NULL if argv[0] is unknown. */
const command *command_lookup_argv(size_t argc, const char *const *argv, const size_t *lens);
/* All top-level commands, for iteration (tests, COMMAND comparison). */
const command *command_table(size_t *count);
/* The Redis version whose COMMAND reply the table was generated from
 * ("7.0.15"): the version ferry presents (HELLO, INFO). */
const char *command_redis_version(void);
/* True if this request blocks on the server: the CMD_BLOCKING class, plus
 * XREAD/XREADGROUP only when they carry BLOCK. */
int command_is_blocking(const command *cmd, size_t argc, const resp_arg *argv);
/* True if a data reply of this command is something it took out of Redis
 * (a pop, a move, GETDEL, a consumer group's read or claim): sent twice, a
 * second item is taken. Other writes answer data they made (XADD's id,
 * SET ... GET's old value, INCRBYFLOAT) or, a script, either. */
int command_takes_out(const command *cmd);

/* An XREAD or XREADGROUP, read as Redis reads it: options (BLOCK, COUNT;
 * XREADGROUP also GROUP, NOACK and CLAIM) up to STREAMS, then as many ids as
 * keys. Indexes are into argv. */
typedef struct xread_args {
    size_t keys;  /* the first stream key */
    size_t nkeys; /* stream keys (as many ids follow them) */
    size_t group; /* XREADGROUP: the group name, the consumer after it; 0 for XREAD */
    int block;    /* a BLOCK option */
    int noack;    /* a NOACK option */
    int claim;    /* a CLAIM option (Redis 8.4) */
} xread_args;

/* Reads argv (argv[0] XREAD, or XREADGROUP if group) into *out: 0, or -1
 * where Redis answers a syntax error (an unknown option, no STREAMS, keys
 * and ids unbalanced, XREADGROUP without GROUP). */
int command_xread_args(int group, size_t argc, const resp_arg *argv, xread_args *out);
const char *command_class_name(command_class cls);

#endif
