/*
 * jinja_lex.c - template source to tokens, with jinja2's whitespace rules as Hugging Face
 * configures them (trim_blocks and lstrip_blocks on, keep_trailing_newline off):
 *
 *   1. Line endings "\r\n" and "\r" become "\n"; one final "\n" of the source is dropped.
 *   2. Text runs between tags become JT_TEXT. A tag opened with "-" ({%- {{- {#-) strips
 *      all whitespace before it; a block or comment tag opened plainly strips the spaces
 *      and tabs between the start of its line and the tag (lstrip_blocks; "+" keeps them).
 *   3. A tag closed with "-" (-%} -}} -#}) strips all whitespace after it; a block or
 *      comment tag closed plainly drops one newline right after it (trim_blocks).
 *   4. Inside a tag: names, numbers, strings (Python escapes: \n \t \r \\ \' \" \xNN
 *      \uNNNN \UNNNNNNNN \a \b \f \v \0; an unknown escape keeps its backslash), operators.
 *      "}}" inside an open "{" is two closing braces, as jinja2 balances them.
 *   5. {% raw %}...{% endraw %} is one text run, unparsed.
 *
 * Cost: one pass; every string lives in the template's arena.
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "jinja_int.h"

void *jarena_alloc(jarena *a, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (!a->head || a->head->size - a->head->used < n) {
        size_t size = n > 65536 ? n : 65536;
        jarena_blk *b = malloc(sizeof *b + size);
        if (!b)
            return NULL;
        b->next = a->head;
        b->used = 0;
        b->size = size;
        a->head = b;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    memset(p, 0, n);
    return p;
}

void jarena_free(jarena *a)
{
    for (jarena_blk *b = a->head, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    a->head = NULL;
}

typedef struct lexer {
    jarena *a;
    const char *s; /* normalised source */
    size_t n, pos;
    int line;
    jtok *toks;
    size_t n_toks, cap;
    char *err;
    size_t err_size;
} lexer;

static int lfail(lexer *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int lfail(lexer *L, const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cli_errf(L->err, L->err_size, "%d: %s", L->line, msg);
    return -1;
}

static jtok *push(lexer *L, int type)
{
    if (!cli_grow((void **)&L->toks, &L->cap, L->n_toks + 1, sizeof(jtok))) {
        lfail(L, "out of memory");
        return NULL;
    }
    jtok *t = &L->toks[L->n_toks++];
    memset(t, 0, sizeof *t);
    t->type = (uint8_t)type;
    t->line = L->line;
    return t;
}

static char *dup(lexer *L, const char *s, size_t n)
{
    char *d = jarena_alloc(L->a, n + 1);
    if (d)
        memcpy(d, s, n);
    return d;
}

/* The first "ab" in s[0..n), or NULL. */
static const char *find2(const char *s, size_t n, char a, char b)
{
    for (size_t i = 0; i + 1 < n; i++) {
        const char *p = memchr(s + i, a, n - 1 - i);
        if (!p)
            return NULL;
        i = (size_t)(p - s);
        if (p[1] == b)
            return p;
    }
    return NULL;
}

static int count_lines(const char *s, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++)
        k += s[i] == '\n';
    return k;
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* Step 2: emit text [start, end) with the opening tag's stripping rule (kind: '{', '%',
 * '#' of the tag that follows, or 0 at the end; mod: '-', '+' or 0). */
static int emit_text(lexer *L, size_t start, size_t end, char kind, char mod)
{
    size_t e = end;
    if (mod == '-') {
        while (e > start && is_ws(L->s[e - 1]))
            e--;
    } else if ((kind == '%' || kind == '#') && mod != '+') {
        size_t k = e;
        while (k > start && (L->s[k - 1] == ' ' || L->s[k - 1] == '\t'))
            k--;
        bool line_start = k > start ? L->s[k - 1] == '\n' : (k == 0 || L->s[k - 1] == '\n');
        if (line_start)
            e = k;
    }
    if (e > start) {
        jtok *t = push(L, JT_TEXT);
        if (!t)
            return -1;
        t->s = dup(L, L->s + start, e - start);
        if (!t->s)
            return lfail(L, "out of memory");
        t->n = e - start;
    }
    L->line += count_lines(L->s + start, end - start);
    return 0;
}

static size_t put_utf8(char *o, unsigned long cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Step 4: a string literal starting at the quote; its unescaped bytes into the arena. */
static int lex_string(lexer *L)
{
    char q = L->s[L->pos];
    size_t i = L->pos + 1;
    char *o = jarena_alloc(L->a, L->n - L->pos + 1); /* never longer than the source */
    if (!o)
        return lfail(L, "out of memory");
    size_t k = 0;
    int line0 = L->line;
    for (;;) {
        if (i >= L->n)
            return lfail(L, "unterminated string");
        char c = L->s[i];
        if (c == q)
            break;
        if (c == '\n')
            L->line++;
        if (c != '\\' || i + 1 >= L->n) {
            o[k++] = c;
            i++;
            continue;
        }
        char e = L->s[i + 1];
        int width = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (width) {
            unsigned long cp = 0;
            for (int d = 0; d < width; d++) {
                int h = i + 2 + (size_t)d < L->n ? cli_hexval((unsigned char)L->s[i + 2 + d]) : -1;
                if (h < 0)
                    return lfail(L, "bad \\%c escape in a string", e);
                cp = cp * 16 + (unsigned long)h;
            }
            if (cp > 0x10FFFF)
                return lfail(L, "bad \\%c escape in a string", e);
            k += put_utf8(o + k, cp);
            i += 2 + (size_t)width;
            continue;
        }
        const char *from = "ntr\\'\"abfv0\n", *to = "\n\t\r\\'\"\a\b\f\v";
        const char *f = strchr(from, e);
        if (f && e != '\n' && e != '0') {
            o[k++] = to[f - from];
        } else if (e == '0') {
            o[k++] = '\0';
        } else if (e == '\n') { /* a backslash-newline continues the line */
            L->line++;
        } else {
            o[k++] = '\\';
            o[k++] = e;
        }
        i += 2;
    }
    jtok *t = push(L, JT_STRING);
    if (!t)
        return -1;
    t->line = line0;
    t->s = o;
    t->n = k;
    L->pos = i + 1;
    return 0;
}

static int lex_number(lexer *L)
{
    size_t i = L->pos;
    char buf[64];
    size_t k = 0;
    bool real = false;
    while (i < L->n && (isdigit((unsigned char)L->s[i]) || L->s[i] == '_'))
        if (L->s[i++] != '_' && k < sizeof buf - 1)
            buf[k++] = L->s[i - 1];
    if (i + 1 < L->n && L->s[i] == '.' && isdigit((unsigned char)L->s[i + 1])) {
        real = true;
        buf[k++] = L->s[i++];
        while (i < L->n && (isdigit((unsigned char)L->s[i]) || L->s[i] == '_'))
            if (L->s[i++] != '_' && k < sizeof buf - 1)
                buf[k++] = L->s[i - 1];
    }
    if (i < L->n && (L->s[i] == 'e' || L->s[i] == 'E')) {
        size_t j = i + 1;
        if (j < L->n && (L->s[j] == '+' || L->s[j] == '-'))
            j++;
        if (j < L->n && isdigit((unsigned char)L->s[j])) {
            real = true;
            while (i < j && k < sizeof buf - 1)
                buf[k++] = L->s[i++];
            while (i < L->n && isdigit((unsigned char)L->s[i]))
                if (k < sizeof buf - 1)
                    buf[k++] = L->s[i++];
                else
                    i++;
        }
    }
    if (k >= sizeof buf - 1)
        return lfail(L, "number too long");
    buf[k] = 0;
    jtok *t = push(L, real ? JT_FLOAT : JT_INT);
    if (!t)
        return -1;
    if (real) {
        t->f = strtod(buf, NULL);
    } else {
        char *end;
        errno = 0;
        long long v = strtoll(buf, &end, 10);
        if (errno)
            return lfail(L, "integer %s out of range", buf);
        t->i = (json_int_t)v;
    }
    L->pos = i;
    return 0;
}

static const char *const ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                  "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                  "]",  "{",  "}",  ",",  ".",  ":",  "|", NULL};

/* Step 4: the tokens of one tag up to its closing delimiter (close: '}' or '%'). Sets
 * *strip_after to the closing modifier. */
static int lex_tag(lexer *L, char close, char *mod_after)
{
    int depth = 0; /* open braces, brackets and parentheses */
    for (;;) {
        while (L->pos < L->n && is_ws(L->s[L->pos])) {
            if (L->s[L->pos] == '\n')
                L->line++;
            L->pos++;
        }
        if (L->pos >= L->n)
            return lfail(L, "unclosed tag: expected '%c}'", close);
        const char *p = L->s + L->pos;
        size_t left = L->n - L->pos;
        if (depth == 0) {
            if (left >= 3 && (p[0] == '-' || p[0] == '+') && p[1] == close && p[2] == '}') {
                *mod_after = p[0];
                L->pos += 3;
                return 0;
            }
            if (left >= 2 && p[0] == close && p[1] == '}') {
                *mod_after = 0;
                L->pos += 2;
                return 0;
            }
        }
        char c = p[0];
        if (c == '\'' || c == '"') {
            if (lex_string(L) < 0)
                return -1;
            continue;
        }
        if (isdigit((unsigned char)c)) {
            if (lex_number(L) < 0)
                return -1;
            continue;
        }
        if (isalpha((unsigned char)c) || c == '_') {
            size_t i = L->pos;
            while (i < L->n && (isalnum((unsigned char)L->s[i]) || L->s[i] == '_'))
                i++;
            jtok *t = push(L, JT_NAME);
            if (!t)
                return -1;
            t->s = dup(L, p, i - L->pos);
            if (!t->s)
                return lfail(L, "out of memory");
            t->n = i - L->pos;
            L->pos = i;
            continue;
        }
        int k = 0;
        for (; ops[k]; k++) {
            size_t len = strlen(ops[k]);
            if (left >= len && memcmp(p, ops[k], len) == 0)
                break;
        }
        if (!ops[k])
            return lfail(L, "unexpected character '%c' in a tag", c);
        if (strchr("([{", ops[k][0]))
            depth++;
        else if (strchr(")]}", ops[k][0]) && depth > 0)
            depth--;
        jtok *t = push(L, JT_OP);
        if (!t)
            return -1;
        strcpy(t->op, ops[k]);
        L->pos += strlen(ops[k]);
    }
}

/* Step 3: after a tag closed with mod (kind: '{' '%' '#'). */
static void after_tag(lexer *L, char kind, char mod)
{
    if (mod == '-') {
        while (L->pos < L->n && is_ws(L->s[L->pos])) {
            if (L->s[L->pos] == '\n')
                L->line++;
            L->pos++;
        }
    } else if (kind != '{' && L->pos < L->n && L->s[L->pos] == '\n') {
        L->line++;
        L->pos++;
    }
}

/* Is the block tag just lexed (tokens from `from`) exactly `{% NAME %}`? */
static bool tag_is(lexer *L, size_t from, const char *name)
{
    return L->n_toks == from + 3 && L->toks[from + 1].type == JT_NAME &&
           strcmp(L->toks[from + 1].s, name) == 0;
}

/* Step 5: after {% raw %}, the text up to {% endraw %} as one run. */
static int lex_raw(lexer *L, size_t from)
{
    L->n_toks = from; /* drop the raw tag */
    size_t i = L->pos;
    for (;;) {
        const char *p = find2(L->s + i, L->n - i, '{', '%');
        if (!p)
            return lfail(L, "unclosed {%% raw %%}");
        size_t at = (size_t)(p - L->s), j = at + 2;
        char mod = 0;
        if (j < L->n && (L->s[j] == '-' || L->s[j] == '+'))
            mod = L->s[j++];
        while (j < L->n && is_ws(L->s[j]))
            j++;
        if (L->n - j >= 6 && memcmp(L->s + j, "endraw", 6) == 0) {
            if (emit_text(L, L->pos, at, '%', mod) < 0)
                return -1;
            L->pos = at + 2;
            if (mod)
                L->pos++;
            size_t before = L->n_toks;
            char mod_after;
            if (lex_tag(L, '%', &mod_after) < 0)
                return -1;
            L->n_toks = before;
            after_tag(L, '%', mod_after);
            return 0;
        }
        i = at + 2;
    }
}

int jinja_lex(jarena *a, const char *src, size_t n, jtok **toks, size_t *n_toks, char *err,
              size_t err_size)
{
    lexer L = {.a = a, .line = 1, .err = err, .err_size = err_size};
    /* Step 1: normalise line endings. */
    char *s = jarena_alloc(a, n + 1);
    if (!s)
        return cli_errf(err, err_size, "1: out of memory"), -1;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\r') {
            s[k++] = '\n';
            if (i + 1 < n && src[i + 1] == '\n')
                i++;
        } else {
            s[k++] = src[i];
        }
    }
    if (k > 0 && s[k - 1] == '\n')
        k--;
    L.s = s;
    L.n = k;
    size_t text_start = 0;
    while (L.pos < L.n) {
        const char *p = memchr(L.s + L.pos, '{', L.n - L.pos);
        if (!p)
            break;
        size_t at = (size_t)(p - L.s);
        char kind = at + 1 < L.n ? L.s[at + 1] : 0;
        if (kind != '{' && kind != '%' && kind != '#') {
            L.pos = at + 1;
            continue;
        }
        char mod = 0;
        if (at + 2 < L.n && (L.s[at + 2] == '-' || L.s[at + 2] == '+'))
            mod = L.s[at + 2];
        /* Step 2. */
        if (emit_text(&L, text_start, at, kind, mod) < 0)
            goto fail;
        L.pos = at + 2 + (mod ? 1 : 0);
        char mod_after = 0;
        if (kind == '#') {
            const char *e = find2(L.s + L.pos, L.n - L.pos, '#', '}');
            if (!e) {
                lfail(&L, "unclosed comment");
                goto fail;
            }
            size_t end = (size_t)(e - L.s);
            if (end > L.pos && (L.s[end - 1] == '-' || L.s[end - 1] == '+'))
                mod_after = L.s[end - 1];
            L.line += count_lines(L.s + L.pos, end - L.pos);
            L.pos = end + 2;
        } else {
            size_t from = L.n_toks;
            if (!push(&L, kind == '{' ? JT_VAR_BEGIN : JT_BLOCK_BEGIN))
                goto fail;
            if (lex_tag(&L, kind == '{' ? '}' : '%', &mod_after) < 0)
                goto fail;
            if (!push(&L, kind == '{' ? JT_VAR_END : JT_BLOCK_END))
                goto fail;
            if (kind == '%' && tag_is(&L, from, "raw")) {
                after_tag(&L, kind, mod_after);
                if (lex_raw(&L, from) < 0)
                    goto fail;
                text_start = L.pos;
                continue;
            }
        }
        /* Step 3. */
        after_tag(&L, kind, mod_after);
        text_start = L.pos;
    }
    if (emit_text(&L, text_start, L.n, 0, 0) < 0 || !push(&L, JT_EOF))
        goto fail;
    *toks = L.toks;
    *n_toks = L.n_toks;
    return 0;
fail:
    free(L.toks);
    return -1;
}
