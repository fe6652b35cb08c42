/* slot.c - the cluster key slot: CRC16-XMODEM with hash tags (slot.h). */
#include "slot.h"

#include <stdio.h>
#include <string.h>
#include <uv.h>

uint16_t slot_crc16(const char *p, size_t n)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)((uint16_t)(unsigned char)p[i] << 8);
        for (int b = 0; b < 8; b++) {
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
        }
    }
    return crc;
}

int slot_of_key(const char *key, size_t n)
{
    const char *open = n > 0 ? memchr(key, '{', n) : NULL;
    if (open != NULL) {
        size_t start = (size_t)(open - key) + 1;
        const char *close = memchr(key + start, '}', n - start);
        /* "{}" is no tag: the whole key is hashed. */
        if (close != NULL && close > key + start) {
            return slot_crc16(key + start, (size_t)(close - (key + start))) & (CLUSTER_SLOTS - 1);
        }
    }
    return slot_crc16(key, n) & (CLUSTER_SLOTS - 1);
}

static uint32_t tag_of[CLUSTER_SLOTS]; /* the number whose digits hash to each slot */
static uv_once_t tags_once = UV_ONCE_INIT;

static void tags_init(void)
{
    char num[16];
    size_t left = CLUSTER_SLOTS;
    static unsigned char seen[CLUSTER_SLOTS];
    /* (every slot is found below 110 000) */
    for (uint32_t n = 0; left > 0 && n < 100000000u; n++) {
        int len = snprintf(num, sizeof(num), "%u", n);
        int slot = slot_crc16(num, (size_t)len) & (CLUSTER_SLOTS - 1);
        if (!seen[slot]) {
            seen[slot] = 1;
            tag_of[slot] = n;
            left--;
        }
    }
}

int slot_tag_key(int slot, char *out, size_t len)
{
    if (slot < 0 || slot >= CLUSTER_SLOTS) {
        return -1;
    }
    uv_once(&tags_once, tags_init);
    int n = snprintf(out, len, "{%u}", tag_of[slot]);
    return n > 0 && (size_t)n < len ? n : -1;
}
