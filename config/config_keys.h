/* config_keys.h - what the two halves of the configuration loader give each
 * other (internal to config/). config.c owns the key table, the parsers of
 * a value's text and the rules that span keys; config_yaml.c reads the YAML
 * document, walks it into the table and places errors at file:line:column. */
#ifndef FERRY_CONFIG_KEYS_H
#define FERRY_CONFIG_KEYS_H

#include <stddef.h>

#include "config.h"

#define CONF_KEYS_MAX 128 /* room in a load's per-key positions (conf_table fits) */

/* How a key's value is parsed. */
typedef enum conf_type {
    CONF_SECTION,   /* a mapping of sub-keys (null = empty) */
    CONF_STRING,    /* char *, heap-allocated */
    CONF_INT,       /* int within [min, max] */
    CONF_UINT,      /* size_t, plain non-negative integer */
    CONF_SIZE,      /* size_t, integer with optional b/kb/mb/gb suffix */
    CONF_DURATION,  /* uint64_t milliseconds */
    CONF_BOOL,      /* int 0/1 from true/false/yes/no */
    CONF_ENUM,      /* int from a parse function */
    CONF_ADDR,      /* config_addr */
    CONF_ADDR_LIST, /* config_addr[], a scalar or a sequence */
    CONF_STR_LIST   /* char *[], a scalar or a sequence */
} conf_type;

#define CONF_EMPTY_NULL 0x1u /* strings: "" or null stores NULL ("none") */
#define CONF_OFF 0x2u        /* addresses: "" or "off" clears the flag field */

/* Normalises a string value in place; returns NULL or an error description. */
typedef const char *(*conf_check_fn)(char *value);

/* One configuration key. */
typedef struct conf_entry {
    const char *key;                  /* dotted key, e.g. "client.max_clients" */
    conf_type type;                   /* how the value is parsed */
    size_t off;                       /* offsetof the field in config */
    size_t count_off;                 /* lists: offsetof the int entry count */
    size_t flag_off;                  /* int set to 1 when the key is given */
    int has_flag;                     /* 1 if flag_off is meaningful */
    long long min;                    /* numbers: smallest accepted value */
    long long max;                    /* numbers: largest value; lists: most entries */
    unsigned flags;                   /* CONF_EMPTY_NULL, CONF_OFF */
    conf_check_fn check;              /* strings and string lists, or NULL */
    int (*parse_enum)(const char *s); /* CONF_ENUM: value or -1 */
    const char *what;                 /* CONF_ENUM: the accepted values, for errors */
    const char *(*enum_name)(int v);  /* CONF_ENUM: a value's name, or NULL: a number */
    const char *doc;                  /* one line for the reference (--describe-config) */
} conf_entry;

/* The keys (config.c), conf_table_len of them. */
extern const conf_entry conf_table[];
extern const size_t conf_table_len;

/* Checks of a string value the reference names (config.c): a word, a unix
 * socket path. */
const char *conf_check_word(char *value);
const char *conf_check_sockpath(char *value);

/* Index of a dotted key in conf_table, or -1. */
int conf_find(const char *key);
/* Parses an optionally signed decimal integer. 0, -1 if malformed, -2 on overflow. */
int conf_parse_ll(const char *s, long long *out);
/* Parses a non-negative integer, with a b/kb/mb/gb suffix when allow_suffix.
 * 0, -1 if malformed, -2 on overflow. */
int conf_parse_unsigned(const char *s, int allow_suffix, unsigned long long *out);
/* Parses an address; NULL or why it is refused. */
const char *conf_addr_parse(const char *s, config_addr *out);
int conf_addr_equal(const config_addr *a, const config_addr *b);

/* One load (config_yaml.c). */
typedef struct conf_ctx conf_ctx;

/* Error at a key's position, or 1:1 if the key was not given (config_yaml.c).
 * Returns -1. */
int conf_key_error(conf_ctx *ctx, const char *key, int at_value, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The key was given in the file (config_yaml.c). */
int conf_present(const conf_ctx *ctx, const char *key);
/* Rules that involve more than one key, once every key is read (config.c). */
int conf_semantic(conf_ctx *ctx, config *cfg);

#endif
