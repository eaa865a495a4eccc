/* yaml.c: libyaml's event stream -> a YNode tree with locations.
 *
 * libyaml checks the syntax; this file adds what it does not: NUL bytes and
 * invalid UTF-8 (checked before libyaml sees the text, so the message names the
 * byte), tabs in indentation, duplicate mapping keys, aliases, non-scalar keys,
 * several documents, and a bound on nesting depth. */
#include "spec.h"

#include <stdio.h>
#include <string.h>
#include <yaml.h>

/* Check the raw bytes: no NUL, valid UTF-8, no tab in a line's indentation. */
static void prescan(const char *src, size_t len) {
  const unsigned char *s = (const unsigned char *)src;
  int line = 1, col = 1, bol = 1;
  for (size_t i = 0; i < len;) {
    unsigned c = s[i];
    Loc l = {line, col};
    if (c == 0)
      error_at(l, "file contains a NUL byte; a model spec is UTF-8 text (is this a binary file?)");
    if (c == '\t' && bol)
      error_at(l, "tab character in indentation; YAML indents with spaces");
    if (c == '\n') {
      line++, col = 1, bol = 1, i++;
      continue;
    }
    if (c != ' ' && c != '\t' && c != '\r')
      bol = 0;
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    unsigned cp = n == 2 ? c & 0x1f : n == 3 ? c & 0x0f : c & 0x07;
    int ok = n > 0 && i + n <= len;
    for (size_t k = 1; ok && k < n; k++) {
      ok = (s[i + k] & 0xc0) == 0x80;
      cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    if (ok && n > 1) /* overlong forms, surrogates, beyond U+10FFFF */
      ok = !(n == 2 && cp < 0x80) && !(n == 3 && cp < 0x800) && !(n == 4 && cp < 0x10000) &&
           !(cp >= 0xd800 && cp <= 0xdfff) && cp <= 0x10ffff;
    if (!ok)
      error_at(l, "invalid UTF-8 byte 0x%02x; a model spec must be UTF-8 text", c);
    i += n;
    col++;
  }
}

typedef struct {
  yaml_parser_t p;
  Arena *a;
} Loader;

static void loader_cleanup(void *arg) { yaml_parser_delete(&((Loader *)arg)->p); }

static Loc mark_loc(yaml_mark_t m) { return (Loc){(int)m.line + 1, (int)m.column + 1}; }

/* Next event; a syntax error becomes error_at with libyaml's mark. */
static void next_event(Loader *L, yaml_event_t *ev) {
  if (yaml_parser_parse(&L->p, ev))
    return;
  yaml_parser_t *p = &L->p;
  Loc l = mark_loc(p->problem_mark);
  const char *problem = p->problem ? p->problem : "malformed YAML";
  if (p->error == YAML_MEMORY_ERROR)
    error_at(l, "out of memory while reading YAML");
  size_t at = p->problem_mark.index;
  if (diag->src && at < diag->srclen && diag->src[at] == ':' && p->problem_mark.column > 1024)
    error_at(l, "a key longer than 1024 characters (YAML's limit for a plain key); use a shorter name");
  if (p->context)
    error_at(l, "YAML syntax error: %s (%s started at line %d, column %d)", problem, p->context,
             (int)p->context_mark.line + 1, (int)p->context_mark.column + 1);
  error_at(l, "YAML syntax error: %s", problem);
}

static YNode *load_node(Loader *L, yaml_event_t *ev, int depth);

static YNode *new_ynode(Loader *L, YKind k, yaml_event_t *ev) {
  YNode *n = arena_alloc(L->a, sizeof(YNode));
  n->kind = k;
  n->loc = n->vloc = mark_loc(ev->start_mark);
  return n;
}

/* Reads the items of a sequence or mapping until its end event. */
static YNode *load_collection(Loader *L, YNode *n, yaml_event_type_t end, int depth) {
  Vec items = {0}, keys = {0};
  int is_map = end == YAML_MAPPING_END_EVENT;
  for (;;) {
    yaml_event_t ev;
    next_event(L, &ev);
    if (ev.type == end) {
      yaml_event_delete(&ev);
      break;
    }
    YNode *x = load_node(L, &ev, depth + 1);
    if (is_map) {
      if (x->kind != Y_SCALAR)
        error_at(x->loc, "mapping keys must be plain names, not %s",
                 x->kind == Y_MAP ? "a mapping" : "a sequence");
      for (int i = 0; i < keys.n; i++) {
        YNode *k = keys.p[i];
        if (strcmp(k->str, x->str) == 0)
          error_at(x->loc, "duplicate key '%s' (first given at line %d)", x->str, k->loc.line);
      }
      vec_push(L->a, &keys, x);
      yaml_event_t vev;
      next_event(L, &vev);
      vec_push(L->a, &items, load_node(L, &vev, depth + 1));
    } else {
      vec_push(L->a, &items, x);
    }
  }
  n->items = (YNode **)items.p;
  n->keys = (YNode **)keys.p;
  n->n = items.n;
  return n;
}

/* Converts one event (already read) and, for collections, their contents. The
 * event is deleted here before anything can fail. */
static YNode *load_node(Loader *L, yaml_event_t *ev, int depth) {
  YNode *n;
  Loc l = mark_loc(ev->start_mark);
  int has_anchor = 0, has_tag = 0;
  yaml_event_type_t type = ev->type;
  if (depth > MAX_DEPTH) {
    yaml_event_delete(ev);
    error_at(l, "nesting deeper than %d levels", MAX_DEPTH);
  }
  switch (type) {
  case YAML_SCALAR_EVENT:
    n = new_ynode(L, Y_SCALAR, ev);
    n->str = arena_strndup(L->a, (const char *)ev->data.scalar.value, ev->data.scalar.length);
    n->quoted = ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
    n->multiline = ev->end_mark.line != ev->start_mark.line;
    if (ev->data.scalar.style == YAML_SINGLE_QUOTED_SCALAR_STYLE ||
        ev->data.scalar.style == YAML_DOUBLE_QUOTED_SCALAR_STYLE)
      n->vloc.col++;
    if (ev->data.scalar.style == YAML_LITERAL_SCALAR_STYLE ||
        ev->data.scalar.style == YAML_FOLDED_SCALAR_STYLE)
      n->multiline = 1;
    has_anchor = ev->data.scalar.anchor != NULL;
    has_tag = ev->data.scalar.tag != NULL;
    yaml_event_delete(ev);
    break;
  case YAML_SEQUENCE_START_EVENT:
  case YAML_MAPPING_START_EVENT: {
    int seq = type == YAML_SEQUENCE_START_EVENT;
    n = new_ynode(L, seq ? Y_SEQ : Y_MAP, ev);
    has_anchor = seq ? ev->data.sequence_start.anchor != NULL : ev->data.mapping_start.anchor != NULL;
    has_tag = seq ? ev->data.sequence_start.tag != NULL : ev->data.mapping_start.tag != NULL;
    yaml_event_delete(ev);
    if (has_tag)
      error_at(l, "YAML tags (!!type) are not supported in model specs; write the plain value");
    if (has_anchor)
      error_at(l, "YAML anchors (&name) are not supported in model specs; write the value out");
    load_collection(L, n, seq ? YAML_SEQUENCE_END_EVENT : YAML_MAPPING_END_EVENT, depth);
    break;
  }
  case YAML_ALIAS_EVENT:
    yaml_event_delete(ev);
    error_at(l, "YAML aliases (*name) are not supported in model specs; write the value out");
  default:
    yaml_event_delete(ev);
    error_at(l, "unexpected YAML event");
  }
  if (has_anchor)
    error_at(l, "YAML anchors (&name) are not supported in model specs; write the value out");
  if (has_tag)
    error_at(l, "YAML tags (!!type) are not supported in model specs; write the plain value");
  return n;
}

YNode *yaml_load(const char *src, size_t len) {
  prescan(src, len);
  Loader *L = arena_alloc(diag->arena, sizeof(Loader));
  L->a = diag->arena;
  if (!yaml_parser_initialize(&L->p))
    error_at((Loc){0, 0}, "out of memory initialising the YAML parser");
  yaml_parser_set_input_string(&L->p, (const unsigned char *)src, len);
  diag->cleanup = loader_cleanup;
  diag->cleanup_arg = L;

  yaml_event_t ev;
  next_event(L, &ev); /* STREAM_START */
  yaml_event_delete(&ev);
  next_event(L, &ev);
  if (ev.type == YAML_STREAM_END_EVENT) {
    yaml_event_delete(&ev);
    error_at((Loc){1, 1}, "empty file: expected a mapping with the model's keys (name, dims, inputs, params, graph, ...)");
  }
  yaml_event_delete(&ev); /* DOCUMENT_START */
  next_event(L, &ev);
  YNode *root = load_node(L, &ev, 0);
  next_event(L, &ev); /* DOCUMENT_END */
  yaml_event_delete(&ev);
  next_event(L, &ev);
  if (ev.type != YAML_STREAM_END_EVENT) {
    Loc l = mark_loc(ev.start_mark);
    yaml_event_delete(&ev);
    error_at(l, "a model spec is one YAML document; found a second one ('---')");
  }
  yaml_event_delete(&ev);
  diag->cleanup = NULL;
  yaml_parser_delete(&L->p);
  return root;
}
