/* manifest.c: parse and validate the cluster manifest (YAML) with libyaml's document API. */
#include "manifest.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <fnmatch.h>
#include <string.h>
#include <sys/stat.h>
#include <arpa/inet.h>
#include <strings.h>
#include <unistd.h>
#include <yaml.h>

#include "ps/ps_error.h"
#include "regfile.h"

/* A manifest is a page of YAML; a bigger file is a mistake (or /dev/zero), not a manifest
 * (libyaml's document takes ~90 times the text: a 16 MiB one took 1.5 GB). */
#define MANIFEST_MAX_BYTES (1u << 20)
#define MANIFEST_MAX_NODES 65536 /* scalars, mappings and sequences: 64 servers are ~500 */
#define PATH_LEN 192  /* room for the longest dotted key path we print */
#define MAX_FIELDS 32 /* rows per table; parse_map() tracks each row's first line */
#define NOMAX INFINITY

/* Names indexed by the enum values in manifest.h; NULL-terminated for the tables. */
static const char *const optim_names[] = {"sgd",     "momentum", "adam", "adamw",
                                          "adagrad", "mean",     NULL};
static const char *const consist_names[] = {"bsp", "asp", "ssp", NULL};
static const char *const sched_names[] = {"constant", "cosine", NULL};
static const char *const model_names[] = {"mlp", NULL};

_Static_assert(PS_OPT_SGD == 0 && PS_OPT_MOMENTUM == 1 && PS_OPT_ADAM == 2 && PS_OPT_ADAMW == 3 &&
                   PS_OPT_ADAGRAD == 4 && PS_OPT_MEAN == 5,
               "optim_names follows ps_optim_kind_t");
_Static_assert(PS_CONSIST_BSP == 0 && PS_CONSIST_ASP == 1 && PS_CONSIST_SSP == 2,
               "consist_names follows the enum");
_Static_assert(PS_SCHED_CONSTANT == 0 && PS_SCHED_COSINE == 1, "sched_names follows the enum");

typedef enum {
    T_STR,   /* char[size]; non-empty; one of names[] when names is set */
    T_INT,   /* unsigned integer of 1, 2, 4 or 8 bytes in [min, max] */
    T_FLOAT, /* float or double in [min, max]; F_GT_MIN / F_LT_MAX make a bound open */
    T_BOOL,  /* bool: true | false */
    T_ENUM,  /* enum stored as its index in names[] */
    T_MAP,   /* nested mapping described by sub[] */
    T_LIST,  /* sequence of elements elem bytes apart: mappings (sub[]) or T_INT in [min, max] */
} ftype_t;

enum { F_REQ = 1, F_GT_MIN = 2, F_LT_MAX = 4 };

typedef struct ctx_s ctx_t;
typedef struct field_s field_t;

/* A check runs after its field parsed; @p base is the struct holding the field. */
typedef int (*check_fn)(ctx_t *c, const field_t *f, yaml_node_t *node, char *base,
                        const char *path);

/* One row of a table: one YAML key and the struct member it fills. */
struct field_s {
    const char *key; /* the YAML key, which is also the C member's name */
    size_t off;      /* offsetof() the member in the table's struct */
    size_t size;     /* sizeof the member (a string's capacity, a list's whole array) */
    ftype_t type;
    int flags;                /* F_REQ, F_GT_MIN, F_LT_MAX */
    double min, max;          /* T_INT, T_FLOAT, and the T_INT elements of a T_LIST */
    const char *zero;         /* T_INT: 0 is also allowed, and means this ("off") */
    const char *const *names; /* T_ENUM; T_STR when only some values are allowed */
    const field_t *sub;       /* T_MAP; T_LIST of mappings */
    size_t elem;              /* T_LIST: bytes per element */
    size_t count_off;         /* T_LIST: offsetof() the int element count */
    int min_count;            /* T_LIST: fewest elements; the most is size / elem */
    check_fn check;           /* optional cross-value rule */
};

struct ctx_s {
    const char *name; /* the file, for messages */
    yaml_document_t *doc;
    char *err;
    size_t errlen;
};

/* ---- messages ---------------------------------------------------------------------------- */

/* Write one line "NAME:LINE: PATH: message" (LINE when > 0, PATH when non-empty). Control
 * characters (from scalars or the file name) become '?' so the message stays one line. */
static void vset_err(ctx_t *c, size_t line, const char *path, const char *fmt, va_list ap)
{
    if (c->err == NULL || c->errlen == 0) return;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    char where[32] = "";
    if (line > 0) snprintf(where, sizeof where, ":%zu", line);
    snprintf(c->err, c->errlen, "%s%s: %s%s%s", c->name, where, path, *path ? ": " : "", msg);
    for (char *p = c->err; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
}

__attribute__((format(printf, 4, 5))) static int fail_at(ctx_t *c, size_t line, const char *path,
                                                         const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset_err(c, line, path, fmt, ap);
    va_end(ap);
    return PS_ECONFIG;
}

static size_t line_of(const yaml_node_t *n)
{
    return n->start_mark.line + 1;
}

__attribute__((format(printf, 4, 5))) static int fail(ctx_t *c, const yaml_node_t *n,
                                                      const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset_err(c, line_of(n), path, fmt, ap);
    va_end(ap);
    return PS_ECONFIG;
}

/* The path of a child: ("job", "lr", -1) -> "job.lr", ("servers", NULL, 1) -> "servers[1]".
 * A path cut to PATH_LEN still names the place well enough. */
static void child_path(char *dst, const char *path, const char *key, int index)
{
    char tail[16];
    if (index >= 0) snprintf(tail, sizeof tail, "[%d]", index);
    const char *parts[3] = {path, index < 0 && *path ? "." : "", index >= 0 ? tail : key};
    size_t n = 0;
    for (int i = 0; i < 3; i++) {
        size_t len = strnlen(parts[i], PATH_LEN - 1 - n);
        memcpy(dst + n, parts[i], len);
        n += len;
    }
    dst[n] = '\0';
}

static bool is_scalar(const yaml_node_t *n)
{
    return n->type == YAML_SCALAR_NODE;
}
static bool is_plain(const yaml_node_t *n)
{
    return is_scalar(n) && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}
static const char *text_of(const yaml_node_t *n)
{
    return (const char *)n->data.scalar.value;
}

/* A scalar's text, cut to fit a message; a NUL or another control byte shown as \0 or \xXX
 * (a NUL used to end the text shown: "cluster\0x" read as an unknown key "cluster"). */
static const char *clip(const yaml_node_t *n, char *buf, size_t size)
{
    size_t len = n->data.scalar.length, o = 0;
    const unsigned char *t = (const unsigned char *)text_of(n);
    for (size_t i = 0; i < len && o + 8 < size; i++) {
        if (o >= 57) {
            o += (size_t)snprintf(buf + o, size - o, "...");
            break;
        }
        if (t[i] == 0)
            o += (size_t)snprintf(buf + o, size - o, "\\0");
        else if (t[i] < 0x20 || t[i] == 0x7f)
            o += (size_t)snprintf(buf + o, size - o, "\\x%02x", t[i]);
        else
            buf[o++] = (char)t[i];
    }
    buf[o < size ? o : size - 1] = '\0';
    return buf;
}

/* What a node is, for "got ...": 'text', a quoted string 'text', nothing, a mapping. */
static const char *describe(const yaml_node_t *n, char *buf, size_t size)
{
    if (n->type == YAML_MAPPING_NODE) return "a mapping";
    if (n->type == YAML_SEQUENCE_NODE) return "a sequence";
    if (is_plain(n) && n->data.scalar.length == 0) return "nothing";
    char t[72];
    snprintf(buf, size, "%s'%s'", is_plain(n) ? "" : "a quoted string ", clip(n, t, sizeof t));
    return buf;
}

/* "a|b|c" from a NULL-terminated list. */
static const char *join_names(const char *const *names, char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; names[i] && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%s", i ? "|" : "", names[i]);
    return buf;
}

static int find_name(const char *const *names, const yaml_node_t *n)
{
    for (int i = 0; names[i]; i++)
        if (strlen(names[i]) == n->data.scalar.length && strcmp(names[i], text_of(n)) == 0)
            return i;
    return -1;
}

/* ---- scalars ----------------------------------------------------------------------------- */

/* YAML 1.2 core-schema decimal integer: [-+]?[0-9]+, without a leading zero (YAML 1.1
 * readers, PyYAML among them, take 0700 as octal: the two would read one file two ways). */
static bool is_int_text(const char *s)
{
    if (*s == '-' || *s == '+') s++;
    if (*s == '\0' || (s[0] == '0' && s[1] != '\0')) return false;
    for (; *s; s++)
        if (*s < '0' || *s > '9') return false;
    return true;
}

/* [-+]?(digits[.digits?] | .digits)([eE][-+]?digits)?: no inf, nan, hex or 1_000. */
static bool is_float_text(const char *s)
{
    if (*s == '-' || *s == '+') s++;
    size_t digits = strspn(s, "0123456789");
    s += digits;
    if (*s == '.') {
        size_t frac = strspn(s + 1, "0123456789");
        s += 1 + frac;
        digits += frac;
    }
    if (digits == 0) return false;
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '-' || *s == '+') s++;
        size_t exp = strspn(s, "0123456789");
        if (exp == 0) return false;
        s += exp;
    }
    return *s == '\0';
}

static void store_uint(void *dst, size_t size, uint64_t v)
{
    switch (size) {
    case 1:
        *(uint8_t *)dst = (uint8_t)v;
        break;
    case 2:
        *(uint16_t *)dst = (uint16_t)v;
        break;
    case 4:
        *(uint32_t *)dst = (uint32_t)v;
        break;
    default:
        *(uint64_t *)dst = v;
        break;
    }
}

/* A table bound as an integer, clamped to what the member can hold. */
static uint64_t int_bound(double b, size_t size)
{
    uint64_t cap = size >= 8 ? UINT64_MAX : (UINT64_C(1) << (8 * size)) - 1;
    if (b <= 0) return 0;
    return b >= (double)cap ? cap : (uint64_t)b;
}

static int parse_int(ctx_t *c, const field_t *f, yaml_node_t *n, void *dst, const char *path)
{
    char buf[96];
    if (!is_plain(n) || !is_int_text(text_of(n)))
        return fail(c, n, path, "expected an integer%s, got %s",
                    is_plain(n) && text_of(n)[text_of(n)[0] == '+' || text_of(n)[0] == '-'] == '0'
                        ? " without a leading zero"
                        : "",
                    describe(n, buf, sizeof buf));
    const char *s = text_of(n);
    uint64_t lo = int_bound(f->min, f->size), hi = int_bound(f->max, f->size);
    errno = 0;
    uint64_t v = strtoull(s + (*s == '-' || *s == '+'), NULL, 10);
    bool negative = *s == '-' && v != 0;
    if (f->zero && v == 0 && !negative && errno != ERANGE) {
        store_uint(dst, f->size, 0);
        return 0;
    }
    if (errno == ERANGE || negative || v < lo || v > hi)
        return fail(c, n, path, "must be %s%s%s[%" PRIu64 ", %" PRIu64 "], got %s",
                    f->zero ? "0 (" : "", f->zero ? f->zero : "", f->zero ? ") or in " : "in ",
                    lo, hi, clip(n, buf, sizeof buf));
    store_uint(dst, f->size, v);
    return 0;
}

static int parse_float(ctx_t *c, const field_t *f, yaml_node_t *n, void *dst, const char *path)
{
    char buf[96];
    if (!is_plain(n) || !is_float_text(text_of(n)))
        return fail(c, n, path, "expected a number, got %s", describe(n, buf, sizeof buf));
    /* strtod follows LC_NUMERIC; the programs never call setlocale(), so '.' is the point. */
    double v = strtod(text_of(n), NULL);
    if (!isfinite(v) || (f->size == sizeof(float) && fabs(v) > FLT_MAX))
        return fail(c, n, path, "is too large, got %s", clip(n, buf, sizeof buf));
    if (f->size == sizeof(float)) v = (float)v; /* check the value that will be used */
    bool gt = f->flags & F_GT_MIN, lt = f->flags & F_LT_MAX;
    bool below = gt ? v <= f->min : v < f->min;
    bool above = lt ? v >= f->max : v > f->max;
    if (below || above) {
        clip(n, buf, sizeof buf);
        if (isinf(f->max))
            return fail(c, n, path, "must be %s %g, got %s", gt ? ">" : ">=", f->min, buf);
        return fail(c, n, path, "must be in %c%g, %g%c, got %s", gt ? '(' : '[', f->min, f->max,
                    lt ? ')' : ']', buf);
    }
    if (f->size == sizeof(float))
        *(float *)dst = (float)v;
    else
        *(double *)dst = v;
    return 0;
}

static int parse_str(ctx_t *c, const field_t *f, yaml_node_t *n, char *dst, const char *path)
{
    char buf[96], names[128];
    if (!is_scalar(n) || (is_plain(n) && n->data.scalar.length == 0))
        return fail(c, n, path, "expected a string, got %s", describe(n, buf, sizeof buf));
    size_t len = n->data.scalar.length;
    if (len == 0) return fail(c, n, path, "must not be empty");
    if (strlen(text_of(n)) != len) return fail(c, n, path, "must not contain a NUL character");
    const char *t = text_of(n);
    if (is_plain(n) && (strcmp(t, "~") == 0 || strcmp(t, "null") == 0 || strcmp(t, "Null") == 0 ||
                        strcmp(t, "NULL") == 0))
        return fail(c, n, path, "is YAML's null, not a string: leave the key out, or quote the "
                    "text ('%s')", t);
    for (size_t i = 0; i < len; i++) {
        const unsigned char *u = (const unsigned char *)t + i;
        if (u[0] < 0x20 || u[0] == 0x7f)
            return fail(c, n, path, "must not contain a control character (byte %zu is 0x%02x)", i,
                        (unsigned)u[0]);
        /* UTF-8's C1 controls (U+0080-U+009F: NEL breaks lines) and the line and paragraph
         * separators (U+2028, U+2029) break log lines as well (a review, session 71). */
        if ((u[0] == 0xc2 && i + 1 < len && u[1] >= 0x80 && u[1] <= 0x9f) ||
            (u[0] == 0xe2 && i + 2 < len && u[1] == 0x80 && (u[2] == 0xa8 || u[2] == 0xa9)))
            return fail(c, n, path, "must not contain a control character (bytes %zu.. are "
                        "U+%04X)", i, u[0] == 0xc2 ? (unsigned)u[1] : 0x2000u + u[2] - 0x80u);
    }
    /* The names first: a value that is none of them is wrong for that reason, whatever its
     * length ("topk:0.1" for compression.pull is not "too long"). */
    if (f->names && find_name(f->names, n) < 0)
        return fail(c, n, path, "must be one of %s, got %s",
                    join_names(f->names, names, sizeof names), describe(n, buf, sizeof buf));
    if (len >= f->size)
        return fail(c, n, path, "is too long: at most %zu bytes, got %zu", f->size - 1, len);
    memcpy(dst, text_of(n), len + 1);
    return 0;
}

/* ---- mappings and sequences -------------------------------------------------------------- */

static int parse_map(ctx_t *c, const field_t *tab, yaml_node_t *node, char *base, const char *path);

static int parse_list(ctx_t *c, const field_t *f, yaml_node_t *n, char *base, const char *path)
{
    char buf[96];
    if (n->type != YAML_SEQUENCE_NODE)
        return fail(c, n, path, "expected a sequence, got %s", describe(n, buf, sizeof buf));
    int count = (int)(n->data.sequence.items.top - n->data.sequence.items.start);
    int most = (int)(f->size / f->elem);
    if (count == 0 && f->min_count > 0) return fail(c, n, path, "must not be empty");
    if (count > most) return fail(c, n, path, "too many entries: at most %d, got %d", most, count);
    if (count < f->min_count)
        return fail(c, n, path, "must have %d to %d entries, got %d", f->min_count, most, count);
    /* Each element parses like a field of its own at offset i * elem. */
    field_t ef = {.key = f->key,
                  .size = f->elem,
                  .min = f->min,
                  .max = f->max,
                  .sub = f->sub,
                  .type = f->sub ? T_MAP : T_INT};
    for (int i = 0; i < count; i++) {
        yaml_node_t *item = yaml_document_get_node(c->doc, n->data.sequence.items.start[i]);
        char sub[PATH_LEN];
        child_path(sub, path, NULL, i);
        char *dst = base + f->off + (size_t)i * f->elem;
        int rc = f->sub ? parse_map(c, f->sub, item, dst, sub) : parse_int(c, &ef, item, dst, sub);
        if (rc) return rc;
    }
    *(int *)(base + f->count_off) = count;
    return 0;
}

static int parse_value(ctx_t *c, const field_t *f, yaml_node_t *n, char *base, const char *path)
{
    char buf[96], names[128];
    char *dst = base + f->off;
    int rc = 0;
    switch (f->type) {
    case T_STR:
        rc = parse_str(c, f, n, dst, path);
        break;
    case T_INT:
        rc = parse_int(c, f, n, dst, path);
        break;
    case T_FLOAT:
        rc = parse_float(c, f, n, dst, path);
        break;
    case T_BOOL:
        if (is_plain(n) && strcmp(text_of(n), "true") == 0)
            *(bool *)dst = true;
        else if (is_plain(n) && strcmp(text_of(n), "false") == 0)
            *(bool *)dst = false;
        else
            rc = fail(c, n, path, "expected true or false, got %s", describe(n, buf, sizeof buf));
        break;
    case T_ENUM: {
        int i = is_scalar(n) ? find_name(f->names, n) : -1;
        if (i < 0)
            rc = fail(c, n, path, "must be one of %s, got %s",
                      join_names(f->names, names, sizeof names), describe(n, buf, sizeof buf));
        else
            store_uint(dst, f->size, (uint64_t)i);
        break;
    }
    case T_MAP:
        rc = parse_map(c, f->sub, n, dst, path);
        break;
    case T_LIST:
        rc = parse_list(c, f, n, base, path);
        break;
    }
    if (rc == 0 && f->check) rc = f->check(c, f, n, base, path);
    return rc;
}

/* Fill the struct at @p base from mapping @p node by table @p tab: each key once, every key
 * known, every F_REQ key present. The first problem found is the one reported. */
static int parse_map(ctx_t *c, const field_t *tab, yaml_node_t *node, char *base, const char *path)
{
    char buf[96];
    if (node->type != YAML_MAPPING_NODE)
        return fail(c, node, path, "expected a mapping, got %s", describe(node, buf, sizeof buf));
    size_t seen[MAX_FIELDS] = {0}; /* line where each row's key was first found, 0: absent */
    for (yaml_node_pair_t *p = node->data.mapping.pairs.start; p < node->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(c->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(c->doc, p->value);
        if (!is_scalar(k))
            return fail(c, k, path, "keys must be scalars, got %s", describe(k, buf, sizeof buf));
        char sub[PATH_LEN];
        child_path(sub, path, clip(k, buf, sizeof buf), -1);
        const field_t *f = tab;
        while (f->key &&
               !(strlen(f->key) == k->data.scalar.length && strcmp(f->key, text_of(k)) == 0))
            f++;
        if (f->key == NULL) return fail(c, k, sub, "unknown key");
        size_t i = (size_t)(f - tab);
        if (seen[i]) return fail(c, k, sub, "duplicate key (first at line %zu)", seen[i]);
        seen[i] = line_of(k);
        int rc = parse_value(c, f, v, base, sub);
        if (rc) return rc;
    }
    for (const field_t *f = tab; f->key; f++)
        if ((f->flags & F_REQ) && !seen[f - tab]) {
            char sub[PATH_LEN];
            child_path(sub, path, f->key, -1);
            return fail(c, node, sub, "missing required key");
        }
    return 0;
}

/* The value node of @p key in mapping @p map, or @p map itself when absent (for a line). */
static yaml_node_t *map_get(ctx_t *c, yaml_node_t *map, const char *key)
{
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(c->doc, p->key);
        if (is_scalar(k) && strcmp(text_of(k), key) == 0)
            return yaml_document_get_node(c->doc, p->value);
    }
    return map;
}

/* ---- cross-value rules ------------------------------------------------------------------- */

/* job.layers: the mlp gives Fashion-MNIST's 10 classes, so its last layer is 10 (psworker
 * refused anything else at its start, after `psctl check` had passed it; the first layer is
 * checked there against the dataset's pixels, which the manifest does not know). */
static int check_layers(ctx_t *c, const field_t *f, yaml_node_t *n, char *base, const char *path)
{
    const ps_job_conf_t *j = (const ps_job_conf_t *)base;
    uint32_t last = j->layers[j->nlayers - 1];
    if (last != 10) {
        char sub[PATH_LEN];
        child_path(sub, path, NULL, j->nlayers - 1);
        return fail(c, yaml_document_get_node(c->doc, n->data.sequence.items.top[-1]), sub,
                    "the mlp's last layer gives Fashion-MNIST's 10 classes: must be 10, got %u",
                    last);
    }
    return 0;
}

static int check_name(ctx_t *c, const field_t *f, yaml_node_t *n, char *base, const char *path)
{
    const char *s = base + f->off;
    char buf[96];
    if (s[strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")] != '\0')
        return fail(c, n, path, "must match [A-Za-z0-9_.-]+, got '%s'", clip(n, buf, sizeof buf));
    return 0;
}

/* What is wrong with host @p h (NULL: nothing), beyond check_host's characters: an IPv4
 * address written other than as four decimal numbers (the resolver reads "127.1" and
 * "2130706433" as 127.0.0.1, so two shards' addresses compared as text passed as two, a
 * review, session 71), dotted numbers that are no address ("999.1.1.1": refused only at psd's
 * start), or a name's labels out of shape (1 to 63 characters, no '-' at either end, 253 in
 * all). An address with ':' (IPv6) is left to getaddrinfo. @p buf holds the message. */
static const char *host_problem(const char *h, char *buf, size_t len)
{
    struct in_addr a;
    if (strchr(h, ':')) return NULL;
    if (inet_pton(AF_INET, h, &a) == 1) return NULL;
    if (inet_aton(h, &a)) {
        char full[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &a, full, sizeof full);
        snprintf(buf, len, "an IPv4 address is written as four decimal numbers: '%s' reads as "
                 "%s, write that", h, full);
        return buf;
    }
    bool numeric = strspn(h, "0123456789.") == strlen(h);
    size_t total = strlen(h), end = total && h[total - 1] == '.' ? total - 1 : total; /* root */
    bool labels_ok = end > 0 && end <= 253 && strchr(h, '%') == NULL;
    for (size_t i = 0; labels_ok && i < end;) {
        size_t k = strcspn(h + i, ".");
        if (i + k > end) k = end - i;
        labels_ok = k >= 1 && k <= 63 && h[i] != '-' && h[i + k - 1] != '-';
        i += k + 1;
    }
    if (numeric || !labels_ok) {
        snprintf(buf, len, numeric ? "'%.64s' is no IPv4 address (four numbers 0-255)"
                                   : "'%.64s' is no host name: labels of 1 to 63 characters "
                                     "between dots, none starting or ending with '-', 253 in "
                                     "all, no '%%'", h);
        return buf;
    }
    return NULL;
}

/* A host name or an address (IPv4, IPv6 without brackets): what psd and UCX can resolve
 * (getaddrinfo takes no brackets: "[::1]" passed here and psd could not resolve it), and what
 * status JSON and logs can show as it is. A metrics_host may be IPv6. */
static int check_host(ctx_t *c, const field_t *f, yaml_node_t *n, char *base, const char *path)
{
    const char *s = base + f->off;
    char buf[96];
    if (s[0] == '[')
        return fail(c, n, path, "an IPv6 address goes without brackets (::1, not [::1]), got "
                    "'%s'", clip(n, buf, sizeof buf));
    if (s[strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-:%")] !=
        '\0')
        return fail(c, n, path, "must be a host name or an address ([A-Za-z0-9_.:%%-]), got "
                    "'%s'", clip(n, buf, sizeof buf));
    const char *colon = strchr(s, ':'); /* one ':' and digits after it: no IPv6 address */
    if (colon && strchr(colon + 1, ':') == NULL && colon[1] &&
        strspn(colon + 1, "0123456789") == strlen(colon + 1))
        return fail(c, n, path, "'%s' has a port: give the host alone (the port has a key of "
                    "its own)", clip(n, buf, sizeof buf));
    char why[192];
    const char *bad = host_problem(s, why, sizeof why);
    return bad ? fail(c, n, path, "%s", bad) : 0;
}

/* A shard's host: as check_host, but no IPv6 address (UCX 1.13.1's TCP transport corrupts
 * memory with IPv6 peers: psd on ::1 died at its first client, an input probe, session 63). */
static int check_shard_host(ctx_t *c, const field_t *f, yaml_node_t *n, char *base,
                            const char *path)
{
    int rc = check_host(c, f, n, base, path);
    char buf[96];
    if (rc == 0 && strchr(base + f->off, ':'))
        return fail(c, n, path, "an IPv6 address, '%s': shards take IPv4 only (UCX 1.13's TCP "
                    "transport corrupts memory with IPv6 peers); use an IPv4 address or a name "
                    "that resolves to one", clip(n, buf, sizeof buf));
    return rc;
}

bool ps_codec_name_valid(const char *t)
{
    static const char *plain[] = {"none", "fp16", "bf16", "int8", "sign"};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
        if (strcmp(t, plain[i]) == 0) return true;
    const char *f = NULL;
    if (strncmp(t, "topk:", 5) == 0) f = t + 5;
    else if (strncmp(t, "randomk:", 8) == 0) f = t + 8;
    /* As psk_codec_parse (kernels/codec.c) takes it, which psworker runs: a digit or a point
     * first (no sign), and a fraction still > 0 as a float (1e-50 is 0). */
    if (f == NULL || !((*f >= '0' && *f <= '9') || *f == '.') ||
        strspn(f, "0123456789.eE-+") != strlen(f))
        return false;
    char *end;
    double v = strtod(f, &end);
    return *end == '\0' && v > 0 && v <= 1 && (float)v > 0.0f;
}

const char *ps_compression_codec_for(const ps_compression_conf_t *cc, const char *name,
                                     uint64_t bytes)
{
    for (int i = 0; i < cc->nrules; i++)
        if (fnmatch(cc->rules[i].match, name, 0) == 0) return cc->rules[i].codec;
    if (bytes < cc->min_bytes || cc->codec[0] == '\0') return "none";
    return cc->codec;
}

static int check_codec(ctx_t *c, const field_t *f, yaml_node_t *n, char *base, const char *path)
{
    const char *s = base + f->off;
    char buf[96];
    if (!ps_codec_name_valid(s))
        return fail(c, n, path,
                    "must be none|fp16|bf16|int8|sign|topk:F|randomk:F with F in (0, 1], got '%s'",
                    clip(n, buf, sizeof buf));
    return 0;
}

static int check_multiple_of_4(ctx_t *c, const field_t *f, yaml_node_t *n, char *base,
                               const char *path)
{
    uint64_t v = *(uint64_t *)(base + f->off);
    if (v % 4 != 0) return fail(c, n, path, "must be a multiple of 4, got %" PRIu64, v);
    return 0;
}

static bool wildcard(const char *h)
{
    return strcmp(h, "0.0.0.0") == 0 || strcmp(h, "::") == 0;
}

/* Whether @p h names this machine's loopback ("localhost", 127.0.0.0/8, ::1), or is a shard's
 * 0.0.0.0 (psd listens on every address, and workers that connect to it reach the machine they
 * run on: only ever this one; passed beside 127.0.0.1 on the same port, a review, session 71). */
static bool loopback(const char *h)
{
    return strcasecmp(h, "localhost") == 0 || strncmp(h, "127.", 4) == 0 ||
           strcmp(h, "::1") == 0 || strcmp(h, "0.0.0.0") == 0;
}

/* Whether two servers' `host`s name one machine: the same name, or both its loopback (a
 * manifest's "localhost" and "127.0.0.1" passed as two machines, and the second psd found the
 * port taken: a probe, session 45). No name is resolved here. */
static bool same_machine(const char *a, const char *b)
{
    return strcasecmp(a, b) == 0 || (loopback(a) && loopback(b)); /* names: any case */
}

/* Whether two hosts of one machine may be one address: the same, or "localhost" and the
 * address it may resolve to (127.0.0.1, or ::1 where /etc/hosts lists that first; no name is
 * resolved here): deliberately wary, one port spelled both ways is a mistake either way. */
static bool same_address(const char *a, const char *b)
{
    if (strcasecmp(a, b) == 0) return true;
    if (strcasecmp(b, "localhost") == 0) {
        const char *t = a;
        a = b;
        b = t;
    }
    return strcasecmp(a, "localhost") == 0 && (strcmp(b, "127.0.0.1") == 0 || strcmp(b, "::1") == 0);
}

/* Whether two listening sockets would take the same port: on one machine (same_machine), the
 * same port, bound to the same address or either to every address. */
static bool addr_clash(const char *machine1, const char *h1, uint16_t p1, const char *machine2,
                       const char *h2, uint16_t p2)
{
    if (p1 != p2 || !same_machine(machine1, machine2)) return false;
    return same_address(h1, h2) || wildcard(h1) || wildcard(h2);
}

static const char *metrics_host_of(const ps_server_conf_t *s)
{
    return s->metrics_host[0] ? s->metrics_host : "127.0.0.1";
}

/* A server's metrics_port may take neither its own port nor the port or metrics port of
 * another server on the same host. */
static int check_metrics_ports(ctx_t *c, yaml_node_t *n, const ps_manifest_t *m, const char *path)
{
    for (int j = 0; j < m->nservers; j++) {
        const ps_server_conf_t *b = &m->servers[j];
        if (b->metrics_port == 0) continue;
        const char *bh = metrics_host_of(b);
        yaml_node_t *item = yaml_document_get_node(c->doc, n->data.sequence.items.start[j]);
        char item_path[PATH_LEN], sub[PATH_LEN];
        child_path(item_path, path, NULL, j);
        child_path(sub, item_path, "metrics_port", -1);
        for (int i = 0; i < m->nservers; i++) {
            const ps_server_conf_t *a = &m->servers[i];
            if (addr_clash(a->host, a->host, a->port, b->host, bh, b->metrics_port))
                return fail(c, map_get(c, item, "metrics_port"), sub,
                            "%s:%u is %s[%d]'s port for workers", bh, (unsigned)b->metrics_port,
                            path, i);
            if (i < j && a->metrics_port &&
                addr_clash(a->host, metrics_host_of(a), a->metrics_port, b->host, bh,
                           b->metrics_port))
                return fail(c, map_get(c, item, "metrics_port"), sub,
                            "same metrics address as %s[%d] (%s:%u)", path, i, bh,
                            (unsigned)b->metrics_port);
        }
    }
    return 0;
}

static bool path_within(const char *a, const char *b);

/* Two servers may not share an address or a data directory, nor on one machine hold one data
 * directory inside another. */
static int check_servers(ctx_t *c, const field_t *f, yaml_node_t *n, char *base, const char *path)
{
    const ps_manifest_t *m = (const ps_manifest_t *)base;
    for (int j = 1; j < m->nservers; j++) {
        const ps_server_conf_t *b = &m->servers[j];
        yaml_node_t *item = yaml_document_get_node(c->doc, n->data.sequence.items.start[j]);
        char sub[PATH_LEN];
        for (int i = 0; i < j; i++) {
            const ps_server_conf_t *a = &m->servers[i];
            if (addr_clash(a->host, a->host, a->port, b->host, b->host, b->port)) {
                child_path(sub, path, NULL, j);
                if (strcasecmp(a->host, b->host) == 0)
                    return fail(c, item, sub, "same host:port as %s[%d] (%s:%u)", path, i,
                                b->host, (unsigned)b->port);
                return fail(c, item, sub, "%s:%u takes the port of %s[%d] (%s:%u) on the same "
                            "machine", b->host, (unsigned)b->port, path, i, a->host,
                            (unsigned)a->port);
            }
            bool in_a = path_within(b->data_dir, a->data_dir),
                 holds_a = path_within(a->data_dir, b->data_dir);
            if ((in_a || holds_a) && same_machine(a->host, b->host)) {
                char item_path[PATH_LEN];
                child_path(item_path, path, NULL, j);
                child_path(sub, item_path, "data_dir", -1);
                if (in_a && holds_a)
                    return fail(c, map_get(c, item, "data_dir"), sub, "same host and data_dir "
                                "as %s[%d] ('%s')", path, i, b->data_dir);
                /* One store inside the other's directory: emptying a shard's data_dir for its
                 * restore (psd --restore takes an empty one) removed the other's store. */
                return fail(c, map_get(c, item, "data_dir"), sub, "'%s' %s %s[%d].data_dir "
                            "('%s') on the same host: each shard's store takes a directory of its "
                            "own", b->data_dir, in_a ? "is inside" : "holds", path, i,
                            a->data_dir);
            }
        }
    }
    return check_metrics_ports(c, n, m, path);
}

/* checkpoint: a map that says when; every_steps and every_s cannot both be 0. */
static int check_checkpoint(ctx_t *c, const field_t *f, yaml_node_t *n, char *base,
                            const char *path)
{
    ps_checkpoint_conf_t *ck = (ps_checkpoint_conf_t *)(base + f->off);
    if (ck->every_steps == 0 && ck->every_s == 0) {
        char sub[PATH_LEN];
        child_path(sub, path, "every_steps", -1);
        return fail(c, map_get(c, n, "every_steps"), sub,
                    "every_steps or every_s must be > 0 (when to checkpoint)");
    }
    ck->present = true;
    return 0;
}

/* lr is required by every optimizer but mean, which has none. */
static int check_optimizer(ctx_t *c, const field_t *f, yaml_node_t *n, char *base,
                           const char *path)
{
    const ps_optim_conf_t *o = (const ps_optim_conf_t *)(base + f->off);
    char sub[PATH_LEN];
    if (o->name != PS_OPT_MEAN && map_get(c, n, "lr") == n) {
        child_path(sub, path, "lr", -1);
        return fail(c, n, sub, "missing required key");
    }
    /* The cosine schedule goes from lr down to min_lr between warmup_steps and decay_steps
     * (counted from step 0; 0: the job's steps): other settings passed and did something else
     * without a word (an input probe, session 63: min_lr 1.0 over lr 0.01 raised the rate
     * 100x; decay_steps 10 under warmup_steps 1000 left no decay at all). */
    if (o->schedule == PS_SCHED_COSINE && o->min_lr > o->lr && o->name != PS_OPT_MEAN) {
        child_path(sub, path, "min_lr", -1);
        return fail(c, map_get(c, n, "min_lr"), sub, "%g is above lr %g: the cosine schedule "
                    "would raise the rate, not lower it", (double)o->min_lr, (double)o->lr);
    }
    if (o->schedule == PS_SCHED_COSINE && o->decay_steps && o->decay_steps <= o->warmup_steps) {
        child_path(sub, path, "decay_steps", -1);
        return fail(c, map_get(c, n, "decay_steps"), sub, "%llu is not past warmup_steps %llu: "
                    "the decay ends at that step, counted from step 0 with the warm-up",
                    (unsigned long long)o->decay_steps, (unsigned long long)o->warmup_steps);
    }
    /* adamw decays by (1 - lr x weight_decay) each step: at 1 or more it zeroes the parameters
     * or flips their sign every step. */
    if (o->name == PS_OPT_ADAMW && (double)o->lr * o->weight_decay >= 1.0) {
        child_path(sub, path, "weight_decay", -1);
        return fail(c, map_get(c, n, "weight_decay"), sub, "%g with lr %g: adamw multiplies the "
                    "parameters by 1 - lr x weight_decay = %g each step (it must stay above 0)",
                    (double)o->weight_decay, (double)o->lr,
                    1.0 - (double)o->lr * o->weight_decay);
    }
    /* A key the optimizer does not read, written out with a value other than its default, is
     * refused: `name: sgd, momentum: 0.9` (PyTorch's SGD(momentum=0.9)) ran plain SGD without a
     * word (a review, session 71). For sgd any momentum above 0 counts (0.9 is the default only
     * for name: momentum). The README's list of every key at its default still passes. */
    enum { SGD = 1 << PS_OPT_SGD, MOM = 1 << PS_OPT_MOMENTUM, ADAM = 1 << PS_OPT_ADAM,
           ADAMW = 1 << PS_OPT_ADAMW, ADAGRAD = 1 << PS_OPT_ADAGRAD };
    const struct {
        const char *key;
        unsigned used;
        bool set;
    } keys[] = {
        {"beta1", ADAM | ADAMW, o->beta1 != 0.9f},
        {"beta2", ADAM | ADAMW, o->beta2 != 0.999f},
        {"eps", ADAM | ADAMW | ADAGRAD, !isnan(o->eps) && o->eps != 1e-8f},
        {"momentum", MOM, o->name == PS_OPT_SGD ? o->momentum > 0 : o->momentum != 0.9f},
        {"nesterov", MOM, o->nesterov},
        {"weight_decay", SGD | MOM | ADAM | ADAMW | ADAGRAD, o->weight_decay != 0},
        {"lr_decay", ADAGRAD, o->lr_decay != 0},
        {"initial_accumulator_value", ADAGRAD, o->initial_accumulator_value != 0},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        yaml_node_t *kn = map_get(c, n, keys[i].key);
        if ((keys[i].used & (1u << o->name)) || !keys[i].set || kn == n) continue;
        child_path(sub, path, keys[i].key, -1);
        bool sgd_mom = o->name == PS_OPT_SGD && (keys[i].used & MOM);
        return fail(c, kn, sub, "optimizer %s does not use it%s", ps_optim_name(o->name),
                    sgd_mom ? ": name: sgd is plain SGD; for SGD with momentum (PyTorch's "
                              "SGD(momentum=...)) use name: momentum"
                            : " (leave it out, or give its default)");
    }
    if (o->schedule != PS_SCHED_COSINE) { /* 0 is their default: said, not refused */
        static const char *const cosine_only[] = {"warmup_steps", "decay_steps", "min_lr"};
        bool set[] = {o->warmup_steps != 0, o->decay_steps != 0, o->min_lr != 0};
        for (size_t i = 0; i < 3; i++)
            if (set[i]) {
                child_path(sub, path, cosine_only[i], -1);
                return fail(c, map_get(c, n, cosine_only[i]), sub, "applies to schedule cosine "
                            "(under constant the rate is lr throughout)");
            }
    }
    return 0;
}

/* job.compression: block, stochastic and fp16_values, written out with a value other than
 * their default, need a codec that reads them (codec or a rule's): they were accepted and
 * unused. */
static int check_compression(ctx_t *c, const field_t *f, yaml_node_t *n, char *base,
                             const char *path)
{
    const ps_compression_conf_t *cc = (const ps_compression_conf_t *)(base + f->off);
    bool int8 = false, sign = false, sparse = false;
    for (int i = -1; i < cc->nrules; i++) {
        const char *k = i < 0 ? cc->codec : cc->rules[i].codec;
        int8 |= strcmp(k, "int8") == 0;
        sign |= strcmp(k, "sign") == 0;
        sparse |= strncmp(k, "topk:", 5) == 0 || strncmp(k, "randomk:", 8) == 0;
    }
    const struct {
        const char *key, *who;
        bool used, set;
    } keys[] = {
        {"block", "int8 or sign", int8 || sign, cc->block != 256},
        {"stochastic", "int8", int8, cc->stochastic},
        {"fp16_values", "topk:F or randomk:F", sparse, cc->fp16_values},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        yaml_node_t *kn = map_get(c, n, keys[i].key);
        if (keys[i].used || !keys[i].set || kn == n) continue;
        char sub[PATH_LEN];
        child_path(sub, path, keys[i].key, -1);
        return fail(c, kn, sub, "applies to codec %s, and neither codec nor a rule names one "
                    "(leave it out, or give its default)", keys[i].who);
    }
    return 0;
}

/* Refuse key @p key of mapping @p n (at @p path): its line and path, then @p why. */
__attribute__((format(printf, 5, 6))) static int fail_key(ctx_t *c, yaml_node_t *n,
                                                          const char *path, const char *key,
                                                          const char *why, ...)
{
    char sub[PATH_LEN];
    child_path(sub, path, key, -1);
    va_list ap;
    va_start(ap, why);
    vset_err(c, line_of(map_get(c, n, key)), sub, why, ap);
    va_end(ap);
    return PS_ECONFIG;
}

/* Settings one consistency reads that the job's does not. optimizer mean keeps a step's mean
 * gradient: only a BSP step has one (asp and ssp apply each push alone, and a mean of one push
 * is not what the workers would pull). */
static int check_job(ctx_t *c, const field_t *f, yaml_node_t *n, char *base, const char *path)
{
    const ps_job_conf_t *j = (const ps_job_conf_t *)(base + f->off);
    const char *mode = ps_consistency_name(j->consistency);
    if (j->optimizer.name == PS_OPT_MEAN && j->consistency != PS_CONSIST_BSP)
        return fail_key(c, n, path, "consistency", "optimizer mean (psd keeps each step's mean "
                        "gradient) needs consistency bsp, got %s", mode);
    /* Read by ssp only: asp with a bound ran unbounded, and bsp in lockstep, without a word (a
     * review, session 72); its default, 4, may stand as the README's full list has it. */
    if (j->staleness != 4 && j->consistency != PS_CONSIST_SSP)
        return fail_key(c, n, path, "staleness", "applies to consistency ssp (how far a worker "
                        "may run ahead of the slowest), got %s: leave it out, or use "
                        "consistency ssp", mode);
    if (j->step_timeout_ms && j->consistency == PS_CONSIST_ASP)
        return fail_key(c, n, path, "step_timeout_ms", "applies to consistency bsp and ssp "
                        "(under asp no worker waits for another), got asp");
    return 0;
}

/* ---- tables: one row per key ------------------------------------------------------------- */

#define AT(T, m) .key = #m, .off = offsetof(T, m), .size = sizeof(((T *)0)->m)
#define OPT(m) AT(ps_optim_conf_t, m)
#define JOB(m) AT(ps_job_conf_t, m)
#define SRV(m) AT(ps_server_conf_t, m)
#define TOP(m) AT(ps_manifest_t, m)

static const field_t optim_fields[] = {
    {OPT(name), .type = T_ENUM, .flags = F_REQ, .names = optim_names},
    {OPT(lr), .type = T_FLOAT, .flags = F_GT_MIN, .min = 0, .max = NOMAX}, /* check_optimizer */
    {OPT(beta1), .type = T_FLOAT, .flags = F_LT_MAX, .min = 0, .max = 1},
    {OPT(beta2), .type = T_FLOAT, .flags = F_LT_MAX, .min = 0, .max = 1},
    {OPT(eps), .type = T_FLOAT, .flags = F_GT_MIN, .min = 0, .max = NOMAX},
    {OPT(momentum), .type = T_FLOAT, .flags = F_LT_MAX, .min = 0, .max = 1},
    {OPT(nesterov), .type = T_BOOL},
    {OPT(weight_decay), .type = T_FLOAT, .min = 0, .max = NOMAX},
    {OPT(lr_decay), .type = T_FLOAT, .min = 0, .max = NOMAX},
    {OPT(initial_accumulator_value), .type = T_FLOAT, .min = 0, .max = NOMAX},
    {OPT(schedule), .type = T_ENUM, .names = sched_names},
    {OPT(warmup_steps), .type = T_INT, .min = 0, .max = NOMAX},
    {OPT(decay_steps), .type = T_INT, .min = 0, .max = NOMAX},
    {OPT(min_lr), .type = T_FLOAT, .min = 0, .max = NOMAX},
    {0},
};

#define CMP(m) AT(ps_compression_conf_t, m)
#define RULE(m) AT(ps_codec_rule_t, m)
static const char *const pull_names[] = {"none", "fp16", "bf16", NULL};

static const field_t rule_fields[] = {
    {RULE(match), .type = T_STR, .flags = F_REQ},
    {RULE(codec), .type = T_STR, .flags = F_REQ, .check = check_codec},
    {0},
};

static const field_t compression_fields[] = {
    {CMP(codec), .type = T_STR, .check = check_codec},
    {CMP(error_feedback), .type = T_BOOL},
    {CMP(min_bytes), .type = T_INT, .min = 0, .max = NOMAX},
    {CMP(rules), .type = T_LIST, .sub = rule_fields, .elem = sizeof(ps_codec_rule_t),
     .count_off = offsetof(ps_compression_conf_t, nrules)},
    {CMP(pull), .type = T_STR, .names = pull_names},
    {CMP(block), .type = T_INT, .min = 1, .max = 1048576},
    {CMP(stochastic), .type = T_BOOL},
    {CMP(fp16_values), .type = T_BOOL},
    {0},
};

static const field_t job_fields[] = {
    {JOB(model), .type = T_STR, .flags = F_REQ, .names = model_names},
    {JOB(layers), .type = T_LIST, .min = 1, .max = 1 << 20, .elem = sizeof(uint32_t),
     .count_off = offsetof(ps_job_conf_t, nlayers), .min_count = 2, .check = check_layers},
    {JOB(dataset), .type = T_STR},
    {JOB(train_samples), .type = T_INT, .min = 0, .max = NOMAX},
    {JOB(batch_size), .type = T_INT, .flags = F_REQ, .min = 1, .max = 1048576},
    {JOB(epochs), .type = T_INT, .flags = F_REQ, .min = 1, .max = PS_MAX_EPOCHS},
    {JOB(seed), .type = T_INT, .min = 0, .max = NOMAX},
    {JOB(workers), .type = T_INT, .flags = F_REQ, .min = 1, .max = 64},
    {JOB(consistency), .type = T_ENUM, .names = consist_names},
    {JOB(staleness), .type = T_INT, .min = 0, .max = 1000000},
    {JOB(max_steps), .type = T_INT, .min = 0, .max = NOMAX},
    {JOB(heartbeat_timeout_ms), .type = T_INT, .min = 100, .max = 3600000},
    {JOB(reconnect_timeout_ms), .type = T_INT, .min = 1000, .max = 86400000},
    {JOB(start_wait_ms), .type = T_INT, .min = 100, .max = 86400000,
     .zero = "heartbeat_timeout_ms"},
    {JOB(step_timeout_ms), .type = T_INT, .min = 100, .max = 86400000, .zero = "off"},
    {JOB(optimizer), .type = T_MAP, .flags = F_REQ, .sub = optim_fields, .check = check_optimizer},
    {JOB(compression), .type = T_MAP, .sub = compression_fields, .check = check_compression},
    {0},
};

static const field_t server_fields[] = {
    {SRV(host), .type = T_STR, .flags = F_REQ, .check = check_shard_host},
    {SRV(port), .type = T_INT, .flags = F_REQ, .min = 1, .max = 65535},
    {SRV(data_dir), .type = T_STR, .flags = F_REQ},
    {SRV(metrics_port), .type = T_INT, .min = 0, .max = 65535},
    {SRV(metrics_host), .type = T_STR, .check = check_host},
    {0},
};

#define CKP(m) AT(ps_checkpoint_conf_t, m)
static const field_t checkpoint_fields[] = {
    {CKP(every_steps), .type = T_INT, .min = 0, .max = NOMAX},
    {CKP(every_s), .type = T_INT, .min = 0, .max = 31536000},
    {CKP(dir), .type = T_STR},
    {CKP(keep), .type = T_INT, .min = 1, .max = 1000000},
    {CKP(drain_s), .type = T_INT, .min = 1, .max = 86400},
    {0},
};

static const field_t top_fields[] = {
    {TOP(cluster), .type = T_STR, .flags = F_REQ, .check = check_name},
    {TOP(chunk_bytes), .type = T_INT, .min = 1024, .max = 1 << 30, .check = check_multiple_of_4},
    {TOP(map_size_mb), .type = T_INT, .min = 16, .max = 1048576},
    /* fsync cadence of each shard's store, seconds; 0: only at a clean shutdown (issue #6). */
    {TOP(sync_interval_s), .type = T_INT, .min = 0, .max = 86400},
    /* bundle size for fusing small messages (issue #3); 0: off */
    {TOP(fusion_bytes), .type = T_INT, .min = 4096, .max = 1 << 20, .zero = "no fusion"},
    /* busy-poll window after activity, microseconds (issue #3: small-op latency) */
    {TOP(spin_us), .type = T_INT, .min = 0, .max = 10000},
    {TOP(apply_threads), .type = T_INT, .min = 0, .max = 64},
    {TOP(servers), .type = T_LIST, .flags = F_REQ, .sub = server_fields,
     .elem = sizeof(ps_server_conf_t), .count_off = offsetof(ps_manifest_t, nservers),
     .min_count = 1, .check = check_servers},
    {TOP(job), .type = T_MAP, .flags = F_REQ, .sub = job_fields, .check = check_job},
    /* periodic checkpoints, run by shard 0's psctl checkpoint --follow (issue #6) */
    {TOP(checkpoint), .type = T_MAP, .sub = checkpoint_fields, .check = check_checkpoint},
    /* the cluster secret's file: every connection is authenticated with it (common/auth.h) */
    {TOP(secret_file), .type = T_STR},
    {0},
};

_Static_assert(sizeof optim_fields / sizeof *optim_fields <= MAX_FIELDS, "raise MAX_FIELDS");
_Static_assert(sizeof job_fields / sizeof *job_fields <= MAX_FIELDS, "raise MAX_FIELDS");
_Static_assert(sizeof server_fields / sizeof *server_fields <= MAX_FIELDS, "raise MAX_FIELDS");
_Static_assert(sizeof top_fields / sizeof *top_fields <= MAX_FIELDS, "raise MAX_FIELDS");

static void set_defaults(ps_manifest_t *m, const char *name)
{
    memset(m, 0, sizeof *m);
    snprintf(m->path, sizeof m->path, "%s", name);
    m->chunk_bytes = 1048576;
    m->map_size_mb = 4096;
    m->fusion_bytes = 65536;
    m->spin_us = PS_SPIN_US_DEFAULT;
    ps_job_conf_t *j = &m->job;
    static const uint32_t layers[] = {784, 256, 128, 10};
    memcpy(j->layers, layers, sizeof layers);
    j->nlayers = 4;
    snprintf(j->dataset, sizeof j->dataset, "%s", "/usr/share/datasets/fashion-mnist");
    j->seed = 1;
    j->consistency = PS_CONSIST_BSP;
    j->heartbeat_timeout_ms = 3000;
    j->reconnect_timeout_ms = 30000;
    j->staleness = 4;
    ps_optim_conf_t *o = &j->optimizer;
    o->beta1 = 0.9f;
    o->beta2 = 0.999f;
    o->eps = NAN; /* until parsed: its default depends on the optimizer (ps_manifest_parse) */
    o->momentum = 0.9f;
    o->schedule = PS_SCHED_CONSTANT;
    ps_compression_conf_t *cc = &j->compression;
    snprintf(cc->codec, sizeof cc->codec, "none");
    cc->error_feedback = true;
    cc->min_bytes = 16384;
    cc->block = 256;
    snprintf(cc->pull, sizeof cc->pull, "none");
    m->checkpoint.keep = 3;
    m->checkpoint.drain_s = 30;
}

/* Whether path @p a is @p b or lies under it, compared as written after dropping repeated and
 * trailing slashes and "." components ("/d/./x//" is under "/d"). No link is followed. */
static bool path_within(const char *a, const char *b)
{
    char na[PS_PATH_MAX], nb[PS_PATH_MAX];
    const char *in[2] = {a, b};
    char *out[2] = {na, nb};
    for (int k = 0; k < 2; k++) {
        size_t o = 0;
        for (const char *p = in[k]; *p && o + 2 < PS_PATH_MAX;) {
            size_t len = strcspn(p, "/");
            if (len == 0 && o == 0 && p == in[k]) out[k][o++] = '/'; /* absolute */
            if (len > 0 && !(len == 1 && p[0] == '.')) {
                if (o > 0 && out[k][o - 1] != '/') out[k][o++] = '/';
                if (o + len + 1 >= PS_PATH_MAX) break;
                memcpy(out[k] + o, p, len);
                o += len;
            }
            p += len;
            while (*p == '/') p++;
        }
        out[k][o] = '\0';
    }
    size_t lb = strlen(nb);
    return strcmp(na, nb) == 0 ||
           (strncmp(na, nb, lb) == 0 && (na[lb] == '/' || (lb == 1 && nb[0] == '/')));
}

/* ---- entry points ------------------------------------------------------------------------ */

#define MANIFEST_MAX_DEPTH 32 /* nested mappings and lists: the deepest field is 4 levels down */

/* Refuse a manifest nested deeper than MANIFEST_MAX_DEPTH from its events alone (linear), before
 * yaml_parser_load builds its nodes: a file of 40 000 '[' took that 3.8 s, one of 200 000 more
 * than a minute. A syntax error is left to the load, which reports it. Returns 0 or the error. */
static int depth_check(ctx_t *c, const char *text, size_t len)
{
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) return 0; /* the load says "out of memory" */
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    int depth = 0, rc = 0;
    long nodes = 0;
    for (;;) {
        yaml_event_t e;
        if (!yaml_parser_parse(&p, &e)) break;
        yaml_event_type_t t = e.type;
        size_t line = e.start_mark.line + 1;
        /* An explicit tag (!!str, !!binary, !!float) is not followed by the document API: the
         * text was taken as it is (!!binary L3RtcA== as a path), so none is taken. */
        const yaml_char_t *tag = t == YAML_SCALAR_EVENT           ? e.data.scalar.tag
                                 : t == YAML_SEQUENCE_START_EVENT ? e.data.sequence_start.tag
                                 : t == YAML_MAPPING_START_EVENT  ? e.data.mapping_start.tag
                                                                  : NULL;
        char tagbuf[64] = "";
        if (tag) snprintf(tagbuf, sizeof tagbuf, "%s", (const char *)tag);
        nodes += t == YAML_SCALAR_EVENT || t == YAML_SEQUENCE_START_EVENT ||
                 t == YAML_MAPPING_START_EVENT;
        yaml_event_delete(&e);
        if (t == YAML_STREAM_END_EVENT) break;
        if (tag) {
            for (char *q = tagbuf; *q; q++)
                if ((unsigned char)*q < 0x20 || *q == 0x7f) *q = '?';
            rc = fail_at(c, line, "", "a YAML tag (%s) is not taken: write the value without it",
                         tagbuf);
            break;
        }
        if (nodes > MANIFEST_MAX_NODES) {
            rc = fail_at(c, line, "", "more than %d YAML values: a manifest is a page",
                         MANIFEST_MAX_NODES);
            break;
        }
        if (t == YAML_SEQUENCE_START_EVENT || t == YAML_MAPPING_START_EVENT) depth++;
        if (t == YAML_SEQUENCE_END_EVENT || t == YAML_MAPPING_END_EVENT) depth--;
        if (depth > MANIFEST_MAX_DEPTH) {
            rc = fail_at(c, line, "", "nested deeper than %d levels", MANIFEST_MAX_DEPTH);
            break;
        }
    }
    yaml_parser_delete(&p);
    return rc;
}

static int syntax_error(ctx_t *c, const yaml_parser_t *p, const char *text, size_t len)
{
    if (p->error == YAML_MEMORY_ERROR) {
        fail_at(c, 0, "", "out of memory while parsing");
        return PS_ENOMEM;
    }
    const char *problem = p->problem ? p->problem : "malformed YAML";
    if (p->error == YAML_READER_ERROR) { /* no mark, only a byte offset */
        size_t line = 1;
        for (size_t i = 0; i < p->problem_offset && i < len; i++)
            line += text[i] == '\n';
        return fail_at(c, line, "", "unreadable text: %s", problem);
    }
    size_t line = p->problem_mark.line + 1;
    if (p->context)
        return fail_at(c, line, "", "syntax error: %s (%s at line %zu)", problem, p->context,
                       p->context_mark.line + 1);
    return fail_at(c, line, "", "syntax error: %s", problem);
}

int ps_manifest_parse(ps_manifest_t *m, const char *name, const char *text, size_t len, char *err,
                      size_t errlen)
{
    ctx_t c = {.name = name ? name : "<manifest>", .err = err, .errlen = errlen};
    if (err && errlen) err[0] = '\0';
    if (text == NULL) text = "", len = 0;
    /* Parse into a copy so that a refused manifest leaves *m as it was. */
    ps_manifest_t *tmp = malloc(sizeof *tmp);
    if (tmp == NULL) {
        fail_at(&c, 0, "", "out of memory");
        return PS_ENOMEM;
    }
    set_defaults(tmp, c.name);
    int rc = PS_ENOMEM;
    yaml_parser_t parser;
    yaml_document_t doc, extra;
    if (!yaml_parser_initialize(&parser)) {
        fail_at(&c, 0, "", "out of memory");
        goto out_tmp;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if ((rc = depth_check(&c, text, len)) != 0) goto out_parser;
    if (!yaml_parser_load(&parser, &doc)) { /* which deletes doc */
        rc = syntax_error(&c, &parser, text, len);
        goto out_parser;
    }
    c.doc = &doc;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    char buf[96];
    if (root == NULL)
        rc = fail_at(&c, 1, "", "the manifest is empty");
    else if (root->type != YAML_MAPPING_NODE)
        rc = fail(&c, root, "", "the top level must be a mapping, got %s",
                  describe(root, buf, sizeof buf));
    else
        rc = parse_map(&c, top_fields, root, (char *)tmp, "");
    if (rc == 0 && tmp->checkpoint.present) {
        /* Each checkpoint's directory, DIR/step-N or DIR/time-MS, travels in a wire message:
         * one too long made every periodic checkpoint fail (psd's follower died at each). The
         * default DIR is servers[0].data_dir's parent's checkpoints/. */
        const ps_checkpoint_conf_t *ck = &tmp->checkpoint;
        size_t dir = ck->dir[0] ? strlen(ck->dir) : strlen(tmp->servers[0].data_dir) + 12;
        size_t most = dir + strlen("/time-18446744073709551615");
        if (most >= PS_CKPT_DIR_MAX) {
            yaml_node_t *ckn = map_get(&c, root, "checkpoint");
            rc = fail(&c, ck->dir[0] ? map_get(&c, ckn, "dir") : ckn,
                      ck->dir[0] ? "checkpoint.dir" : "checkpoint",
                      "each checkpoint's directory (%s/step-N) must stay under %d bytes, and "
                      "this one can take %zu%s", ck->dir[0] ? "dir" : "servers[0].data_dir/..",
                      PS_CKPT_DIR_MAX, most, ck->dir[0] ? "" : ": set checkpoint.dir");
        }
    }
    if (rc == 0 && tmp->checkpoint.present) {
        /* Checkpoints in a shard's data_dir: `psctl restore` then moved the checkpoint away
         * with the store it replaces (a review, session 71). Compared as written (both
         * absolute or both relative); the default, beside servers[0].data_dir, is not in one. */
        const ps_checkpoint_conf_t *ck = &tmp->checkpoint;
        const char *dir = ck->dir;
        for (int i = 0; rc == 0 && i < tmp->nservers && ck->dir[0]; i++) {
            const char *d = tmp->servers[i].data_dir;
            if (!path_within(dir, d)) continue;
            char sub[PATH_LEN];
            child_path(sub, "servers", NULL, i);
            yaml_node_t *ckn = map_get(&c, root, "checkpoint");
            rc = fail(&c, map_get(&c, ckn, "dir"), "checkpoint.dir", "'%s' is in %s.data_dir "
                      "('%s'): checkpoints go in a directory of their own, beside the stores",
                      dir, sub, d);
        }
    }
    if (rc) goto out_doc;
    ps_optim_conf_t *o = &tmp->job.optimizer;
    if (isnan(o->eps)) o->eps = o->name == PS_OPT_ADAGRAD ? 1e-10f : 1e-8f; /* PyTorch's */
    for (int i = 0; i < tmp->nservers; i++)
        if (tmp->servers[i].metrics_host[0] == '\0')
            snprintf(tmp->servers[i].metrics_host, PS_HOST_MAX, "127.0.0.1");
    /* A second document would be silently ignored; refuse it (and any syntax error in it). */
    if (!yaml_parser_load(&parser, &extra)) {
        rc = syntax_error(&c, &parser, text, len);
        goto out_doc;
    }
    yaml_node_t *root2 = yaml_document_get_root_node(&extra);
    if (root2) rc = fail(&c, root2, "", "a manifest is one YAML document, found a second");
    yaml_document_delete(&extra);
    if (rc == 0) memcpy(m, tmp, sizeof *m);
out_doc:
    yaml_document_delete(&doc);
out_parser:
    yaml_parser_delete(&parser);
out_tmp:
    free(tmp);
    return rc;
}

int ps_manifest_load(ps_manifest_t *m, const char *path, char *err, size_t errlen)
{
    ctx_t c = {.name = path, .err = err, .errlen = errlen};
    if (err && errlen) err[0] = '\0';
    if (strlen(path) >= PS_PATH_MAX) {
        fail_at(&c, 0, "", "cannot read: %s", strerror(ENAMETOOLONG));
        return -ENAMETOOLONG;
    }
    /* A FIFO there hung every program (each reads the manifest): refused as what it is. */
    struct stat st;
    int fd = ps_open_regular(path, 0, &st);
    if (fd < 0) {
        if (fd == -EINVAL)
            fail_at(&c, 0, "", "cannot read: not a regular file (%s)", ps_file_kind(&st));
        else
            fail_at(&c, 0, "", "cannot read: %s", strerror(-fd));
        return fd;
    }
    int rc = 0;
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    if (buf == NULL) {
        rc = PS_ENOMEM;
        fail_at(&c, 0, "", "cannot read: %s", strerror(ENOMEM));
        goto out;
    }
    for (;;) {
        if (len == cap) {
            if (cap > MANIFEST_MAX_BYTES) {
                rc = fail_at(&c, 0, "", "too large: a manifest is at most %u bytes",
                             MANIFEST_MAX_BYTES);
                goto out;
            }
            size_t ncap = cap * 2 > MANIFEST_MAX_BYTES ? MANIFEST_MAX_BYTES + 1 : cap * 2;
            char *nbuf = realloc(buf, ncap);
            if (nbuf == NULL) {
                rc = PS_ENOMEM;
                fail_at(&c, 0, "", "cannot read: %s", strerror(ENOMEM));
                goto out;
            }
            buf = nbuf, cap = ncap;
        }
        ssize_t n = read(fd, buf + len, cap - len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            rc = -errno;
            fail_at(&c, 0, "", "cannot read: %s", strerror(-rc));
            goto out;
        }
        if (n == 0) break;
        len += (size_t)n;
    }
    rc = ps_manifest_parse(m, path, buf, len, err, errlen);
out:
    free(buf);
    close(fd);
    return rc;
}

const char *ps_optim_name(ps_optim_kind_t k)
{
    return (unsigned)k < sizeof optim_names / sizeof *optim_names - 1 ? optim_names[k] : "unknown";
}

const char *ps_consistency_name(ps_consistency_t c)
{
    return (unsigned)c < sizeof consist_names / sizeof *consist_names - 1 ? consist_names[c]
                                                                          : "unknown";
}
