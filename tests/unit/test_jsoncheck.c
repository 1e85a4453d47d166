/* test_jsoncheck.c: the tests' strict JSON checker (tests/integration/jsoncheck.c) takes what
 * RFC 8259 allows and names the first fault of what it does not. */
#include <check.h>
#include <string.h>

#include "jsoncheck.h"

static const char *check(const char *s) { return jc_invalid(s, strlen(s)); }

/* @p n '[' then @p n ']' into @p buf. */
static const char *nest(char *buf, int n)
{
    memset(buf, '[', (size_t)n);
    memset(buf + n, ']', (size_t)n);
    buf[2 * n] = '\0';
    return buf;
}

/* @p why (a fault) names @p want. */
static void says(const char *why, const char *want)
{
    ck_assert_msg(why != NULL && strstr(why, want) != NULL, "%s, want %s", why ? why : "valid",
                  want);
}

START_TEST(valid_texts)
{
    const char *ok[] = {
        "{}", "[]", " [ ] \n", "0", "-0", "-0.5e-3", "12E+7", "1.25", "true", "false", "null",
        "\"\"", "\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\\u00e9\\uD83D\\uDE00\"",
        "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"",
        "{\"a\": [1, {\"b\": null}], \"c\": {\"a\": 2}}", /* one key per object, nested again */
        "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        ck_assert_msg(check(ok[i]) == NULL, "'%s': %s", ok[i], check(ok[i]));
}
END_TEST

START_TEST(invalid_texts)
{
    struct {
        const char *text, *why;
    } bad[] = {
        {"", "a value missing"},
        {"[1,]", "not a JSON value"},
        {"{\"a\": 1,}", "does not start with a string key"},
        {"{\"a\" 1}", "a key without ':'"},
        {"{\"a\": 1 \"b\": 2}", "neither ',' nor '}'"},
        {"[1 2]", "neither ',' nor ']'"},
        {"[1] [2]", "more after the value"},
        {"NaN", "not a JSON value"},
        {"[-Infinity]", "a number lacks a digit"},
        {"[inf]", "not a JSON value"},
        {"01", "a leading zero"},
        {"+1", "not a JSON value"},
        {"1.", "a number lacks a digit"},
        {".5", "not a JSON value"},
        {"1e", "a number lacks a digit"},
        {"tru", "a literal other than"},
        {"\"a\tb\"", "a control byte inside a string"},
        {"\"a\\x41\"", "an escape JSON does not have"},
        {"\"\\u12g4\"", "without 4 hex digits"},
        {"\"abc", "without its closing quote"},
        {"\"\xc3\"", "not well-formed UTF-8"},
        {"\"\xc0\xaf\"", "not well-formed UTF-8"},
        {"\"\xe0\x80\xaf\"", "not well-formed UTF-8"},
        {"\"\xed\xa0\x80\"", "not well-formed UTF-8"},
        {"\"\xf4\x90\x80\x80\"", "not well-formed UTF-8"},
        {"\"\xff\"", "not well-formed UTF-8"},
        {"{\"a\": 1, \"b\": 2, \"a\": 3}", "a key twice in one object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *why = check(bad[i].text);
        ck_assert_msg(why != NULL && strstr(why, bad[i].why) != NULL, "'%s': %s, want %s",
                      bad[i].text, why ? why : "valid", bad[i].why);
    }
    /* 65 levels of nesting: refused, naming the depth; a NUL inside is a control byte. */
    char deep[200];
    says(check(nest(deep, 65)), "nested more than 64 deep");
    ck_assert_msg(check(nest(deep, 64)) == NULL, "64 levels: %s", check(deep));
    says(jc_invalid("\"a\0b\"", 5), "a control byte");
    /* The offset and the text around the fault are named. */
    says(check("{\"k\": NaN}"), "at byte 6 of 10 (around: '{\"k\": NaN}')");
}
END_TEST

Suite *ps_test_suite(void)
{
    Suite *s = suite_create("jsoncheck");
    TCase *tc = tcase_create("jsoncheck");
    tcase_add_test(tc, valid_texts);
    tcase_add_test(tc, invalid_texts);
    suite_add_tcase(s, tc);
    return s;
}
