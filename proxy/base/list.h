/* list.h - intrusive circular doubly-linked lists (the node lives inside the
 * object; no allocation to link or unlink). */
#ifndef FERRY_LIST_H
#define FERRY_LIST_H

#include <stddef.h>

typedef struct list_node {
    struct list_node *prev; /* previous node, or the head */
    struct list_node *next; /* next node, or the head */
} list_node;

#define list_entry(node, type, member) ((type *)((char *)(node)-offsetof(type, member)))
#define list_foreach(pos, head) for ((pos) = (head)->next; (pos) != (head); (pos) = (pos)->next)
#define list_foreach_safe(pos, tmp, head)                                                          \
    for ((pos) = (head)->next, (tmp) = (pos)->next; (pos) != (head);                               \
         (pos) = (tmp), (tmp) = (pos)->next)

static inline void list_init(list_node *head)
{
    head->prev = head;
    head->next = head;
}

static inline int list_empty(const list_node *head)
{
    return head->next == head;
}

/* A node that is not on any list points to itself (after list_init/list_del). */
static inline int list_linked(const list_node *n)
{
    return n->next != n && n->next != NULL;
}

static inline void list_add_tail(list_node *head, list_node *n)
{
    n->prev = head->prev;
    n->next = head;
    head->prev->next = n;
    head->prev = n;
}

static inline void list_add_head(list_node *head, list_node *n)
{
    n->next = head->next;
    n->prev = head;
    head->next->prev = n;
    head->next = n;
}

static inline void list_del(list_node *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n;
    n->next = n;
}

static inline list_node *list_first(const list_node *head)
{
    return head->next == head ? NULL : head->next;
}

#endif
