/*
 * Columns of Arrow buffers from serialized Liftbridge `Message` protobufs (the Subscribe stream's
 * responses), one response at a time, without a Python object per field.
 *
 * The compiled twin of liftbridge_provider/client/_columns_py.py: same interface, same output
 * bytes, chosen at import time by liftbridge_provider/client/columns.py. Written from the protobuf
 * wire format's rules (varints, the four wire types, last value wins, unknown fields skipped) and
 * the field numbers of proto/liftbridge_api.proto (Message: offset 1, key 2, value 3, timestamp 4,
 * subject 7, headers 9 as map entries of key 1 / value 2). Where the format leaves room, it lands where
 * protobuf's own parser (upb, which the pure-Python twin runs) lands: tags of at most five bytes within
 * 32 bits, lengths of at most five bytes below 2**31 - 1, unknown groups skipped up to 100 levels deep,
 * strings checked as UTF-8 each time they are sent, and a map entry with any other field left out of it.
 *
 * The bytes come from the network: every read is checked against the end of its span, every size
 * against Arrow's int32 offsets before anything is written, and a batch's buffers are grown for a whole
 * message before any of them is written, so a failed add leaves the builder as it was.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { TAKEN = 0, SKIPPED = 1, LAST = 2, END = 3, FULL = 4 };
enum { DEPTH_LIMIT = 100 }; /* protobuf's nesting limit: a header entry is one level, each group one */
enum { HEADERS_KEPT = 1024 };  /* room for headers kept from one message to the next */

typedef struct {
    char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
} Buf;

/* Room for count items of size bytes after the buffer's data. */
static int buf_reserve(Buf *b, Py_ssize_t count, Py_ssize_t size) {
    if (count > (PY_SSIZE_T_MAX - b->len) / size) return PyErr_NoMemory(), -1;
    Py_ssize_t need = b->len + count * size;
    if (need <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap = cap > PY_SSIZE_T_MAX / 2 ? need : cap * 2;
    char *grown = PyMem_Realloc(b->data, (size_t)cap);
    if (grown == NULL) return PyErr_NoMemory(), -1;
    b->data = grown;
    b->cap = cap;
    return 0;
}

/* Append within the room buf_reserve made. */
static void put(Buf *b, const void *p, Py_ssize_t n) {
    if (n == 0) return;
    memcpy(b->data + b->len, p, (size_t)n);
    b->len += n;
}

static void put_i64(Buf *b, int64_t v) { put(b, &v, 8); }
static void put_i32(Buf *b, int32_t v) { put(b, &v, 4); }

typedef struct {
    const uint8_t *p;
    Py_ssize_t n;
} Span;

typedef struct {
    Span name;
    Span value;
    Py_ssize_t order; /* position on the wire: the last of equal names wins */
} Header;

/* A window's bound: an int64, or beyond the int64 range (over: 1 above it, -1 below it). */
typedef struct {
    int64_t value;
    int over;
} Bound;

static int below(int64_t offset, Bound b) { return b.over > 0 || (b.over == 0 && offset < b.value); }
static int above(int64_t offset, Bound b) { return b.over < 0 || (b.over == 0 && offset > b.value); }

typedef struct {
    PyObject_HEAD
    Py_ssize_t max_rows; /* 0 until __init__ ran */
    Py_ssize_t max_bytes;
    Bound low;
    Bound high;
    Py_ssize_t rows;
    Py_ssize_t size;
    Py_ssize_t data; /* bytes of keys, values, subjects, header names and values */
    int has_last;
    int64_t last_offset;
    int32_t entries;
    Buf offsets, timestamps, key_off, key_data, value_off, value_data, subject_off, subject_data;
    Buf map_off, name_off, name_data, hval_off, hval_data;
    Header *headers; /* scratch for one message */
    Py_ssize_t headers_cap;
} Builder;

static Buf *all_bufs(Builder *self, int i) {
    Buf *bufs[] = {&self->offsets,    &self->timestamps, &self->key_off,   &self->key_data,  &self->value_off,
                   &self->value_data, &self->subject_off, &self->subject_data, &self->map_off, &self->name_off,
                   &self->name_data,  &self->hval_off,   &self->hval_data};
    return i < 13 ? bufs[i] : NULL;
}

/* Empty columns: every offsets buffer starts with its 0. */
static int reset(Builder *self) {
    for (int i = 0; i < 13; i++) all_bufs(self, i)->len = 0;
    self->rows = 0;
    self->size = 0;
    self->data = 0;
    self->entries = 0;
    Buf *starts[] = {&self->key_off,  &self->value_off, &self->subject_off,
                     &self->map_off, &self->name_off,  &self->hval_off};
    for (int i = 0; i < 6; i++) {
        if (buf_reserve(starts[i], 1, 4) < 0) return -1;
        put_i32(starts[i], 0);
    }
    return 0;
}

static int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t byte = *(*p)++;
        v |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* A tag as protobuf reads one: at most five bytes, within 32 bits. */
static int read_tag(const uint8_t **p, const uint8_t *end, uint32_t *field, int *wire) {
    const uint8_t *start = *p;
    uint64_t tag;
    if (read_varint(p, end, &tag) < 0 || *p - start > 5 || tag > UINT32_MAX) return -1;
    *field = (uint32_t)(tag >> 3);
    *wire = (int)(tag & 7);
    return 0;
}

/* A length-delimited field's bytes, or -1: protobuf refuses lengths of over five bytes or from 2**31 - 1. */
static int read_span(const uint8_t **p, const uint8_t *end, Span *out) {
    const uint8_t *start = *p;
    uint64_t n;
    if (read_varint(p, end, &n) < 0 || *p - start > 5 || n >= INT32_MAX || n > (uint64_t)(end - *p)) return -1;
    out->p = *p;
    out->n = (Py_ssize_t)n;
    *p += n;
    return 0;
}

static int skip_field(const uint8_t **p, const uint8_t *end, uint32_t field, int wire, int depth);

/* The rest of a group after its start tag, through the end tag of the same number; depth: levels left. */
static int skip_group(const uint8_t **p, const uint8_t *end, uint32_t number, int depth) {
    if (depth <= 0) return -1;
    for (;;) {
        uint32_t field;
        int wire;
        if (*p >= end || read_tag(p, end, &field, &wire) < 0) return -1;
        if (wire == 4) return field == number ? 0 : -1;
        if (skip_field(p, end, field, wire, depth - 1) < 0) return -1;
    }
}

/* An unknown field (or a known one sent with another wire type), skipped as protobuf skips it. Field
 * number 0 is refused in a message or an entry (by the caller), not inside a group. */
static int skip_field(const uint8_t **p, const uint8_t *end, uint32_t field, int wire, int depth) {
    uint64_t ignored;
    Span span;
    switch (wire) {
    case 0: return read_varint(p, end, &ignored);
    case 1: if (end - *p < 8) return -1; *p += 8; return 0;
    case 2: return read_span(p, end, &span);
    case 3: return skip_group(p, end, field, depth);
    case 5: if (end - *p < 4) return -1; *p += 4; return 0;
    default: return -1; /* the end of a group never started, wire types 6 and 7 */
    }
}

/* Strict UTF-8 (no overlong forms, surrogates or code points above U+10FFFF), as protobuf checks strings. */
static int valid_utf8(Span s) {
    const uint8_t *p = s.p, *end = s.p + s.n;
    while (p < end) {
        uint8_t c = *p;
        if (c < 0x80) { p++; continue; }
        int n;
        uint32_t cp;
        if ((c & 0xe0) == 0xc0) { n = 1; cp = c & 0x1f; }
        else if ((c & 0xf0) == 0xe0) { n = 2; cp = c & 0x0f; }
        else if ((c & 0xf8) == 0xf0) { n = 3; cp = c & 0x07; }
        else return 0;
        if (end - p <= n) return 0;
        for (int i = 1; i <= n; i++) {
            if ((p[i] & 0xc0) != 0x80) return 0;
            cp = (cp << 6) | (p[i] & 0x3f);
        }
        if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000)) return 0;
        if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
        p += n + 1;
    }
    return 1;
}

/* qsort's order of headers: by name (UTF-8 bytes order = code point order), then by place on the wire. */
static int header_order(const void *x, const void *y) {
    const Header *a = x, *b = y;
    Py_ssize_t n = a->name.n < b->name.n ? a->name.n : b->name.n;
    int c = n ? memcmp(a->name.p, b->name.p, (size_t)n) : 0;
    if (c != 0) return c < 0 ? -1 : 1;
    if (a->name.n != b->name.n) return a->name.n < b->name.n ? -1 : 1;
    return a->order < b->order ? -1 : a->order > b->order;
}

static int same_name(const Header *a, const Header *b) {
    return a->name.n == b->name.n && (a->name.n == 0 || memcmp(a->name.p, b->name.p, (size_t)a->name.n) == 0);
}

/* Headers sorted by name then wire order (n log n: a message may hold millions), only the last of equal
 * names kept, as protobuf's map keeps it: how many are left. */
static Py_ssize_t compact(Header *h, Py_ssize_t count) {
    if (count > 1) qsort(h, (size_t)count, sizeof(Header), header_order);
    Py_ssize_t kept = 0;
    for (Py_ssize_t i = 0; i < count; i++)
        if (i + 1 == count || !same_name(&h[i], &h[i + 1])) h[kept++] = h[i];
    return kept;
}

static PyObject *malformed(const char *what) {
    PyErr_Format(PyExc_ValueError, "malformed Liftbridge message: %s", what);
    return NULL;
}

typedef struct {
    int64_t offset;
    int64_t timestamp;
    Span key, value, subject;
    Py_ssize_t headers; /* after sorting and dropping repeated names */
} Parsed;

/* One header entry into self->headers: 0, or -1 malformed, -2 out of memory. protobuf keeps an entry
 * with any field besides a key and a value as bytes among the message's unknown fields: left out here. */
static int parse_entry(Builder *self, Span entry, Py_ssize_t order, Py_ssize_t *count) {
    Header h = {{(const uint8_t *)"", 0}, {(const uint8_t *)"", 0}, order};
    const uint8_t *p = entry.p, *end = entry.p + entry.n;
    int other = 0;
    while (p < end) {
        uint32_t field;
        int wire;
        if (read_tag(&p, end, &field, &wire) < 0 || field == 0) return -1;
        if ((field == 1 || field == 2) && wire == 2) {
            Span *target = field == 1 ? &h.name : &h.value;
            if (read_span(&p, end, target) < 0 || (field == 1 && !valid_utf8(*target))) return -1;
        } else if (skip_field(&p, end, field, wire, DEPTH_LIMIT - 1) < 0) {
            return -1;
        } else {
            other = 1;
        }
    }
    if (other) return 0;
    if (*count == self->headers_cap) { /* full: drop repeated names first (memory by name, not by entry) */
        *count = compact(self->headers, *count);
        if (self->headers_cap == 0 || *count > self->headers_cap / 2) { /* too few went: grow */
            if (self->headers_cap > PY_SSIZE_T_MAX / 2 / (Py_ssize_t)sizeof(Header)) return -2;
            Py_ssize_t cap = self->headers_cap ? self->headers_cap * 2 : 8;
            Header *grown = PyMem_Realloc(self->headers, (size_t)cap * sizeof(Header));
            if (grown == NULL) return -2;
            self->headers = grown;
            self->headers_cap = cap;
        }
    }
    self->headers[(*count)++] = h;
    return 0;
}

/* 0, -1 malformed (message set), -2 a Python error is set. */
static int parse(Builder *self, const uint8_t *p, Py_ssize_t n, Parsed *m, const char **why) {
    const uint8_t *end = p + n;
    Py_ssize_t count = 0, sent = 0;
    memset(m, 0, sizeof(*m));
    m->key.p = m->value.p = m->subject.p = (const uint8_t *)"";
    while (p < end) {
        uint64_t v;
        uint32_t field;
        int wire;
        if (read_tag(&p, end, &field, &wire) < 0) { *why = "bad tag"; return -1; }
        if (field == 0) { *why = "field number 0"; return -1; }
        if ((field == 1 || field == 4) && wire == 0) {
            if (read_varint(&p, end, &v) < 0) { *why = "truncated varint"; return -1; }
            if (field == 1) m->offset = (int64_t)v; else m->timestamp = (int64_t)v;
        } else if ((field == 2 || field == 3 || field == 7) && wire == 2) {
            Span *target = field == 2 ? &m->key : field == 3 ? &m->value : &m->subject;
            if (read_span(&p, end, target) < 0) { *why = "truncated field"; return -1; }
            if (field == 7 && !valid_utf8(*target)) { *why = "subject is not UTF-8"; return -1; }
        } else if (field == 9 && wire == 2) {
            Span entry;
            if (read_span(&p, end, &entry) < 0) { *why = "truncated header"; return -1; }
            int r = parse_entry(self, entry, sent++, &count);
            if (r == -2) { PyErr_NoMemory(); return -2; }
            if (r < 0) { *why = "bad header entry"; return -1; }
        } else if ((field == 5 || field == 8 || field == 10 || field == 11) && wire == 2) {
            Span text; /* strings this decoder does not keep, checked as protobuf checks them */
            if (read_span(&p, end, &text) < 0) { *why = "truncated field"; return -1; }
            if (!valid_utf8(text)) { *why = "a string field is not UTF-8"; return -1; }
        } else if (skip_field(&p, end, field, wire, DEPTH_LIMIT) < 0) {
            *why = "bad field";
            return -1;
        }
    }
    m->headers = compact(self->headers, count);
    return 0;
}

static int not_ready(Builder *self) {
    if (self->max_rows > 0) return 0;
    PyErr_SetString(PyExc_AttributeError, "ColumnBuilder.__init__ was not called");
    return 1;
}

/* One serialized message at p (n bytes): TAKEN, SKIPPED, LAST, END or FULL, or -1 with a Python error set. */
static int add_span(Builder *self, const uint8_t *p, Py_ssize_t n) {
    Parsed m;
    const char *why = "";
    int r = parse(self, p, n, &m, &why);
    if (r == -2) return -1;
    if (r < 0) return malformed(why), -1;
    if (below(m.offset, self->low)) return SKIPPED;
    if (above(m.offset, self->high)) return END;
    Py_ssize_t names = 0, values = 0;
    for (Py_ssize_t i = 0; i < m.headers; i++) {
        names += self->headers[i].name.n;
        values += self->headers[i].value.n;
    }
    Py_ssize_t added = m.key.n + m.value.n + names + values;
    /* All variable-length data of the batch together within Arrow's int32 offsets (each column is then too). */
    int fits = (int64_t)self->data + added + m.subject.n <= INT32_MAX && (int64_t)self->entries + m.headers <= INT32_MAX;
    if (self->rows && (self->rows >= self->max_rows || self->size + added > self->max_bytes || !fits))
        return FULL;
    if (!fits) {
        PyErr_SetString(PyExc_OverflowError, "a message larger than an Arrow binary column holds (2 GiB)");
        return -1;
    }
    /* Room in every buffer first: past this point nothing fails, so a row is written whole or not at all. */
    if (buf_reserve(&self->offsets, 1, 8) < 0 || buf_reserve(&self->timestamps, 1, 8) < 0 ||
        buf_reserve(&self->key_off, 1, 4) < 0 || buf_reserve(&self->key_data, m.key.n, 1) < 0 ||
        buf_reserve(&self->value_off, 1, 4) < 0 || buf_reserve(&self->value_data, m.value.n, 1) < 0 ||
        buf_reserve(&self->subject_off, 1, 4) < 0 || buf_reserve(&self->subject_data, m.subject.n, 1) < 0 ||
        buf_reserve(&self->map_off, 1, 4) < 0 || buf_reserve(&self->name_off, m.headers, 4) < 0 ||
        buf_reserve(&self->name_data, names, 1) < 0 || buf_reserve(&self->hval_off, m.headers, 4) < 0 ||
        buf_reserve(&self->hval_data, values, 1) < 0)
        return -1;
    put_i64(&self->offsets, m.offset);
    put_i64(&self->timestamps, m.timestamp / 1000); /* truncated toward zero, as Arrow's integer divide */
    put(&self->key_data, m.key.p, m.key.n);
    put_i32(&self->key_off, (int32_t)self->key_data.len);
    put(&self->value_data, m.value.p, m.value.n);
    put_i32(&self->value_off, (int32_t)self->value_data.len);
    put(&self->subject_data, m.subject.p, m.subject.n);
    put_i32(&self->subject_off, (int32_t)self->subject_data.len);
    for (Py_ssize_t i = 0; i < m.headers; i++) {
        Header *h = &self->headers[i];
        put(&self->name_data, h->name.p, h->name.n);
        put_i32(&self->name_off, (int32_t)self->name_data.len);
        put(&self->hval_data, h->value.p, h->value.n);
        put_i32(&self->hval_off, (int32_t)self->hval_data.len);
    }
    self->entries += (int32_t)m.headers;
    put_i32(&self->map_off, self->entries);
    self->rows++;
    self->size += added;
    self->data += added + m.subject.n;
    self->has_last = 1;
    self->last_offset = m.offset;
    int last = self->high.over == 0 && m.offset == self->high.value;
    self->low.over = m.offset == INT64_MAX; /* no int64 follows the largest: every offset is below then */
    self->low.value = m.offset == INT64_MAX ? 0 : m.offset + 1;
    return last ? LAST : TAKEN;
}

/* A message's room for many headers goes with it. */
static void drop_header_room(Builder *self) {
    if (self->headers_cap > HEADERS_KEPT) {
        PyMem_Free(self->headers);
        self->headers = NULL;
        self->headers_cap = 0;
    }
}

static PyObject *Builder_add(Builder *self, PyObject *data) {
    if (not_ready(self)) return NULL;
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "a serialized message must be bytes");
        return NULL;
    }
    int status = add_span(self, (const uint8_t *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data));
    drop_header_room(self);
    return status < 0 ? NULL : PyLong_FromLong(status);
}

/* take(buffer, spans, index): the messages buffer[spans[i]:spans[i + 1]] for i = index, index + 2, ... (the
 * spans the data plane cuts from the DATA it read, without a copy), added in turn. Stops at the first LAST,
 * END or FULL and returns (that status, its i); (TAKEN, len(spans)) once every one was taken or skipped. */
static PyObject *Builder_take(Builder *self, PyObject *args) {
    PyObject *buffer, *spans;
    Py_ssize_t index;
    if (not_ready(self)) return NULL;
    if (!PyArg_ParseTuple(args, "OO!n", &buffer, &PyList_Type, &spans, &index)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE) < 0) return NULL;
    int status = TAKEN;
    Py_ssize_t count = PyList_GET_SIZE(spans);
    if (index < 0 || index > count || (count - index) % 2 != 0) {
        PyErr_SetString(PyExc_ValueError, "spans must be (start, end) pairs from index on");
        status = -1;
    }
    for (; status >= 0 && index < count; index += 2) {
        Py_ssize_t start = PyLong_AsSsize_t(PyList_GET_ITEM(spans, index));
        Py_ssize_t end = PyLong_AsSsize_t(PyList_GET_ITEM(spans, index + 1));
        if ((start == -1 || end == -1) && PyErr_Occurred()) { status = -1; break; }
        if (start < 0 || end < start || end > view.len) {
            PyErr_SetString(PyExc_ValueError, "a span outside its buffer");
            status = -1;
            break;
        }
        status = add_span(self, (const uint8_t *)view.buf + start, end - start);
        drop_header_room(self);
        if (status == LAST || status == END || status == FULL) break;
        if (status >= 0) status = TAKEN;
    }
    PyBuffer_Release(&view);
    if (status < 0) return NULL;
    return Py_BuildValue("(in)", status, index);
}

/* Any Python int (TypeError for other types, as operator.index) as an int64, or over: 1 above, -1 below. */
static int bound_of(PyObject *number, Bound *out) {
    PyObject *index = PyNumber_Index(number);
    if (index == NULL) return -1;
    long long value = PyLong_AsLongLongAndOverflow(index, &out->over);
    Py_DECREF(index);
    out->value = out->over ? 0 : (int64_t)value;
    return value == -1 && PyErr_Occurred() ? -1 : 0;
}

static PyObject *Builder_window(Builder *self, PyObject *args) {
    PyObject *low, *high;
    Bound lower, upper;
    if (!PyArg_ParseTuple(args, "OO", &low, &high) || bound_of(low, &lower) < 0 || bound_of(high, &upper) < 0)
        return NULL;
    self->low = lower;
    self->high = upper;
    Py_RETURN_NONE;
}

static PyObject *Builder_finish(Builder *self, PyObject *Py_UNUSED(ignored)) {
    if (not_ready(self)) return NULL;
    PyObject *out = PyTuple_New(14);
    if (out == NULL) return NULL;
    PyObject *rows = PyLong_FromSsize_t(self->rows);
    if (rows == NULL) { Py_DECREF(out); return NULL; }
    PyTuple_SET_ITEM(out, 0, rows);
    for (int i = 0; i < 13; i++) {
        Buf *b = all_bufs(self, i);
        PyObject *bytes = PyBytes_FromStringAndSize(b->data ? b->data : "", b->len);
        if (bytes == NULL) { Py_DECREF(out); return NULL; }
        PyTuple_SET_ITEM(out, i + 1, bytes);
    }
    if (reset(self) < 0) { Py_DECREF(out); return NULL; }
    return out;
}

static PyObject *Builder_get_rows(Builder *self, void *Py_UNUSED(closure)) { return PyLong_FromSsize_t(self->rows); }

static PyObject *Builder_get_last_offset(Builder *self, void *Py_UNUSED(closure)) {
    if (!self->has_last) Py_RETURN_NONE;
    return PyLong_FromLongLong(self->last_offset);
}

/* A budget from any Python int: those beyond Py_ssize_t are as good as its largest, no batch reaches them. */
static int budget_of(PyObject *number, Py_ssize_t *out) {
    Bound b;
    if (bound_of(number, &b) < 0) return -1;
    *out = b.over > 0 || b.value > PY_SSIZE_T_MAX ? PY_SSIZE_T_MAX : b.over < 0 || b.value < 1 ? 0 : (Py_ssize_t)b.value;
    return 0;
}

static int Builder_init(Builder *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"max_rows", "max_bytes", NULL};
    PyObject *rows_arg, *bytes_arg;
    Py_ssize_t max_rows, max_bytes;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "$OO", names, &rows_arg, &bytes_arg) ||
        budget_of(rows_arg, &max_rows) < 0 || budget_of(bytes_arg, &max_bytes) < 0)
        return -1;
    if (max_rows < 1 || max_bytes < 1) {
        PyErr_SetString(PyExc_ValueError, "max_rows and max_bytes must be >= 1");
        return -1;
    }
    self->max_rows = 0; /* not ready until the buffers are */
    if (reset(self) < 0) return -1;
    self->max_rows = max_rows;
    self->max_bytes = max_bytes;
    self->low = (Bound){INT64_MIN, 0};
    self->high = (Bound){INT64_MAX, 0};
    self->has_last = 0;
    return 0;
}

static void Builder_dealloc(Builder *self) {
    for (int i = 0; i < 13; i++) PyMem_Free(all_bufs(self, i)->data);
    PyMem_Free(self->headers);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Builder_methods[] = {
    {"add", (PyCFunction)Builder_add, METH_O, "Decode one serialized Message; returns TAKEN, SKIPPED, LAST, END or FULL."},
    {"take", (PyCFunction)Builder_take, METH_VARARGS,
     "take(buffer, spans, index): add buffer[spans[i]:spans[i+1]] from i = index; (LAST/END/FULL, i) at the first "
     "such, else (TAKEN, len(spans))."},
    {"window", (PyCFunction)Builder_window, METH_VARARGS, "Take only offsets low <= offset <= high."},
    {"finish", (PyCFunction)Builder_finish, METH_NOARGS, "The columns' buffers; the builder starts empty again."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Builder_getset[] = {
    {"rows", (getter)Builder_get_rows, NULL, "Rows taken since the last finish.", NULL},
    {"last_offset", (getter)Builder_get_last_offset, NULL, "Offset of the last message taken (None before one).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject BuilderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "liftbridge_provider.client._wire_columns.ColumnBuilder",
    .tp_basicsize = sizeof(Builder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Arrow column buffers from serialized Liftbridge messages, budgeted by rows and bytes.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Builder_init,
    .tp_dealloc = (destructor)Builder_dealloc,
    .tp_methods = Builder_methods,
    .tp_getset = Builder_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_wire_columns",
    .m_doc = "Compiled decoder of Liftbridge messages into Arrow buffers.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__wire_columns(void) {
    if (PyType_Ready(&BuilderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&BuilderType);
    if (PyModule_AddObject(m, "ColumnBuilder", (PyObject *)&BuilderType) < 0) {
        Py_DECREF(&BuilderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
