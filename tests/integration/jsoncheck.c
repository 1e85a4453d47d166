/* jsoncheck.c: a strict JSON checker for tests (jsoncheck.h). Recursive descent over the text;
 * nothing is built but, per open object, the list of its keys (for duplicates). */
#include "jsoncheck.h"
#include "utf8.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JC_MAX_DEPTH 64

typedef struct {
    const unsigned char *p, *end, *start;
    const char *fault; /* the first fault found, NULL while none */
    const unsigned char *at;
} jc_t;

static bool fail(jc_t *j, const char *why)
{
    if (j->fault == NULL) {
        j->fault = why;
        j->at = j->p;
    }
    return false;
}

static void ws(jc_t *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static bool lit(jc_t *j, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n) != 0)
        return fail(j, "not a JSON value (a literal other than true, false or null?)");
    j->p += n;
    return true;
}

static bool digits(jc_t *j)
{
    if (j->p >= j->end || *j->p < '0' || *j->p > '9') return fail(j, "a number lacks a digit");
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++;
    return true;
}

/* number = [ minus ] int [ frac ] [ exp ]; int = zero / ( digit1-9 *DIGIT ) */
static bool number(jc_t *j)
{
    if (j->p < j->end && *j->p == '-') j->p++;
    if (j->p < j->end && *j->p == '0') {
        j->p++;
        if (j->p < j->end && *j->p >= '0' && *j->p <= '9')
            return fail(j, "a number with a leading zero");
    } else if (!digits(j)) {
        return false;
    }
    if (j->p < j->end && *j->p == '.') {
        j->p++;
        if (!digits(j)) return false;
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-')) j->p++;
        if (!digits(j)) return false;
    }
    return true;
}

static int hexval(unsigned char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string at j->p (its opening quote). */
static bool string(jc_t *j)
{
    j->p++;
    for (;;) {
        if (j->p >= j->end) return fail(j, "a string without its closing quote");
        unsigned char c = *j->p;
        if (c == '"') {
            j->p++;
            return true;
        }
        if (c < 0x20) return fail(j, "a control byte inside a string (not escaped)");
        if (c >= 0x80) { /* common/utf8.h's rule, as psd's JSON writers follow it */
            size_t n = ps_utf8_len(j->p);
            if (n == 0 || n > (size_t)(j->end - j->p))
                return fail(j, "not well-formed UTF-8 (a stray or cut sequence, an overlong "
                               "form, a surrogate, or past U+10FFFF)");
            j->p += n;
            continue;
        }
        if (c != '\\') {
            j->p++;
            continue;
        }
        if (j->end - j->p < 2) return fail(j, "a string without its closing quote");
        c = j->p[1];
        if (strchr("\"\\/bfnrt", c) != NULL && c != '\0') {
            j->p += 2;
            continue;
        }
        if (c != 'u') return fail(j, "an escape JSON does not have");
        if (j->end - j->p < 6) return fail(j, "a \\u escape cut short");
        for (int i = 2; i < 6; i++)
            if (hexval(j->p[i]) < 0) return fail(j, "a \\u escape without 4 hex digits");
        j->p += 6;
    }
}

static bool value(jc_t *j, int depth);

typedef struct {
    const unsigned char **at;
    size_t *len, n, cap;
} keys_t;

static bool key_new(jc_t *j, keys_t *k, const unsigned char *at, size_t len)
{
    for (size_t i = 0; i < k->n; i++)
        if (k->len[i] == len && memcmp(k->at[i], at, len) == 0) {
            j->p = at;
            return fail(j, "a key twice in one object");
        }
    if (k->n == k->cap) {
        k->cap = k->cap ? 2 * k->cap : 16;
        k->at = realloc(k->at, k->cap * sizeof *k->at);
        k->len = realloc(k->len, k->cap * sizeof *k->len);
        if (k->at == NULL || k->len == NULL) abort();
    }
    k->at[k->n] = at;
    k->len[k->n++] = len;
    return true;
}

static bool object(jc_t *j, int depth)
{
    keys_t k = {0};
    bool ok = false;
    j->p++;
    ws(j);
    if (j->p < j->end && *j->p == '}') {
        j->p++;
        return true;
    }
    for (;;) {
        ws(j);
        if (j->p >= j->end || *j->p != '"') {
            fail(j, "an object's member does not start with a string key");
            break;
        }
        const unsigned char *kat = j->p;
        if (!string(j) || !key_new(j, &k, kat, (size_t)(j->p - kat))) break;
        ws(j);
        if (j->p >= j->end || *j->p != ':') {
            fail(j, "a key without ':'");
            break;
        }
        j->p++;
        if (!value(j, depth + 1)) break;
        ws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        if (j->p < j->end && *j->p == '}') {
            j->p++;
            ok = true;
        } else {
            fail(j, "an object's member followed by neither ',' nor '}'");
        }
        break;
    }
    free(k.at);
    free(k.len);
    return ok;
}

static bool array(jc_t *j, int depth)
{
    j->p++;
    ws(j);
    if (j->p < j->end && *j->p == ']') {
        j->p++;
        return true;
    }
    for (;;) {
        if (!value(j, depth + 1)) return false;
        ws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        if (j->p < j->end && *j->p == ']') {
            j->p++;
            return true;
        }
        return fail(j, "an array's element followed by neither ',' nor ']'");
    }
}

static bool value(jc_t *j, int depth)
{
    if (depth >= JC_MAX_DEPTH) return fail(j, "nested more than 64 deep");
    ws(j);
    if (j->p >= j->end) return fail(j, "a value missing (the text ends)");
    switch (*j->p) {
    case '{': return object(j, depth);
    case '[': return array(j, depth);
    case '"': return string(j);
    case 't': return lit(j, "true");
    case 'f': return lit(j, "false");
    case 'n': return lit(j, "null");
    default:
        if (*j->p == '-' || (*j->p >= '0' && *j->p <= '9')) return number(j);
        return fail(j, "not a JSON value");
    }
}

const char *jc_invalid(const char *text, size_t len)
{
    static char why[512];
    jc_t j = {.p = (const unsigned char *)text, .end = (const unsigned char *)text + len,
              .start = (const unsigned char *)text};
    if (value(&j, 0)) {
        ws(&j);
        if (j.p == j.end) return NULL;
        fail(&j, "more after the value");
    }
    size_t off = (size_t)(j.at - j.start);
    size_t from = off > 40 ? off - 40 : 0, to = off + 40 < len ? off + 40 : len;
    char around[200];
    size_t n = 0;
    for (size_t i = from; i < to && n + 5 < sizeof around; i++) { /* bytes shown safely */
        unsigned char c = (unsigned char)text[i];
        n += (size_t)snprintf(around + n, sizeof around - n, c >= 0x20 && c < 0x7f ? "%c" : "\\x%02x",
                              c);
    }
    snprintf(why, sizeof why, "%s at byte %zu of %zu (around: '%s')", j.fault, off, len, around);
    return why;
}
