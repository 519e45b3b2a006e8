/*
 * Columns of Arrow buffers from serialized Liftbridge `Message` protobufs (the Subscribe stream's
 * responses), one response at a time, without a Python object per field.
 *
 * The compiled twin of liftbridge_provider/client/_columns_py.py: same interface, same output
 * bytes, chosen at import time by liftbridge_provider/client/columns.py. Written from the protobuf
 * wire format's rules (varints, the four wire types, last value wins, unknown fields skipped) and
 * the field numbers of proto/liftbridge_api.proto (Message: offset 1, key 2, value 3, timestamp 4,
 * subject 7, headers 9 as map entries of key 1 / value 2).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { TAKEN = 0, SKIPPED = 1, LAST = 2, END = 3, FULL = 4 };

typedef struct {
    char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
} Buf;

static int buf_reserve(Buf *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) cap *= 2;
    char *grown = PyMem_Realloc(b->data, (size_t)cap);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = grown;
    b->cap = cap;
    return 0;
}

static int buf_put(Buf *b, const void *p, Py_ssize_t n) {
    if (n == 0) return 0;
    if (buf_reserve(b, n) < 0) return -1;
    memcpy(b->data + b->len, p, (size_t)n);
    b->len += n;
    return 0;
}

static int buf_i64(Buf *b, int64_t v) { return buf_put(b, &v, 8); }
static int buf_i32(Buf *b, int32_t v) { return buf_put(b, &v, 4); }

typedef struct {
    const uint8_t *p;
    Py_ssize_t n;
} Span;

typedef struct {
    Span name;
    Span value;
    Py_ssize_t order; /* position on the wire: the last of equal names wins */
} Header;

typedef struct {
    PyObject_HEAD
    Py_ssize_t max_rows;
    Py_ssize_t max_bytes;
    int64_t low;
    int64_t high;
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
    for (int i = 0; i < 6; i++)
        if (buf_i32(starts[i], 0) < 0) return -1;
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

/* The bytes of a length-delimited field, or -1. */
static int read_span(const uint8_t **p, const uint8_t *end, Span *out) {
    uint64_t n;
    if (read_varint(p, end, &n) < 0 || n > (uint64_t)(end - *p)) return -1;
    out->p = *p;
    out->n = (Py_ssize_t)n;
    *p += n;
    return 0;
}

static int skip_field(const uint8_t **p, const uint8_t *end, int wire) {
    uint64_t ignored;
    Span span;
    switch (wire) {
    case 0: return read_varint(p, end, &ignored);
    case 1: if (end - *p < 8) return -1; *p += 8; return 0;
    case 2: return read_span(p, end, &span);
    case 5: if (end - *p < 4) return -1; *p += 4; return 0;
    default: return -1; /* groups (3, 4) and wire types 6, 7 are not in this message */
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

static int header_less(const Header *a, const Header *b) {
    Py_ssize_t n = a->name.n < b->name.n ? a->name.n : b->name.n;
    int c = n ? memcmp(a->name.p, b->name.p, (size_t)n) : 0;
    if (c != 0) return c < 0;
    if (a->name.n != b->name.n) return a->name.n < b->name.n;
    return a->order < b->order;
}

static int same_name(const Header *a, const Header *b) {
    return a->name.n == b->name.n && (a->name.n == 0 || memcmp(a->name.p, b->name.p, (size_t)a->name.n) == 0);
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

static int parse_entry(Builder *self, Span entry, Py_ssize_t order, Py_ssize_t *count) {
    Header h = {{(const uint8_t *)"", 0}, {(const uint8_t *)"", 0}, order};
    const uint8_t *p = entry.p, *end = entry.p + entry.n;
    while (p < end) {
        uint64_t tag;
        if (read_varint(&p, end, &tag) < 0) return -1;
        int field = (int)(tag >> 3), wire = (int)(tag & 7);
        if ((field == 1 || field == 2) && wire == 2) {
            if (read_span(&p, end, field == 1 ? &h.name : &h.value) < 0) return -1;
        } else if (field == 0 || skip_field(&p, end, wire) < 0) {
            return -1;
        }
    }
    if (!valid_utf8(h.name)) return -1;
    if (*count == self->headers_cap) {
        Py_ssize_t cap = self->headers_cap ? self->headers_cap * 2 : 8;
        Header *grown = PyMem_Realloc(self->headers, (size_t)cap * sizeof(Header));
        if (grown == NULL) return -2;
        self->headers = grown;
        self->headers_cap = cap;
    }
    self->headers[(*count)++] = h;
    return 0;
}

/* 0, -1 malformed (message set), -2 a Python error is set. */
static int parse(Builder *self, const uint8_t *p, Py_ssize_t n, Parsed *m, const char **why) {
    const uint8_t *end = p + n;
    Py_ssize_t count = 0;
    memset(m, 0, sizeof(*m));
    m->key.p = m->value.p = m->subject.p = (const uint8_t *)"";
    while (p < end) {
        uint64_t tag, v;
        if (read_varint(&p, end, &tag) < 0) { *why = "truncated tag"; return -1; }
        int field = (int)(tag >> 3), wire = (int)(tag & 7);
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
            int r = parse_entry(self, entry, count, &count);
            if (r == -2) { PyErr_NoMemory(); return -2; }
            if (r < 0) { *why = "bad header entry"; return -1; }
        } else if ((field == 5 || field == 8 || field == 10 || field == 11) && wire == 2) {
            Span text; /* strings this decoder does not keep, checked as protobuf checks them */
            if (read_span(&p, end, &text) < 0) { *why = "truncated field"; return -1; }
            if (!valid_utf8(text)) { *why = "a string field is not UTF-8"; return -1; }
        } else if (skip_field(&p, end, wire) < 0) {
            *why = "bad field";
            return -1;
        }
    }
    /* Sort by name (UTF-8 bytes order = code point order), stable by wire order; keep the last of equal names. */
    Header *h = self->headers;
    for (Py_ssize_t i = 1; i < count; i++) {
        Header x = h[i];
        Py_ssize_t j = i;
        while (j > 0 && header_less(&x, &h[j - 1])) { h[j] = h[j - 1]; j--; }
        h[j] = x;
    }
    Py_ssize_t kept = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (i + 1 < count && same_name(&h[i], &h[i + 1])) continue;
        h[kept++] = h[i];
    }
    m->headers = kept;
    return 0;
}

static PyObject *Builder_add(Builder *self, PyObject *data) {
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "a serialized message must be bytes");
        return NULL;
    }
    Parsed m;
    const char *why = "";
    int r = parse(self, (const uint8_t *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), &m, &why);
    if (r == -2) return NULL;
    if (r < 0) return malformed(why);
    if (m.offset < self->low) return PyLong_FromLong(SKIPPED);
    if (m.offset > self->high) return PyLong_FromLong(END);
    Py_ssize_t names = 0, values = 0;
    for (Py_ssize_t i = 0; i < m.headers; i++) {
        names += self->headers[i].name.n;
        values += self->headers[i].value.n;
    }
    Py_ssize_t added = m.key.n + m.value.n + names + values;
    /* All variable-length data of the batch together within Arrow's int32 offsets (each column is then too). */
    int fits = (int64_t)self->data + added + m.subject.n <= INT32_MAX && (int64_t)self->entries + m.headers <= INT32_MAX;
    if (self->rows && (self->rows >= self->max_rows || self->size + added > self->max_bytes || !fits))
        return PyLong_FromLong(FULL);
    if (!fits) {
        PyErr_SetString(PyExc_OverflowError, "a message larger than an Arrow binary column holds (2 GiB)");
        return NULL;
    }
    int64_t micros = m.timestamp / 1000; /* truncated toward zero, as Arrow's integer divide */
    if (buf_i64(&self->offsets, m.offset) < 0 || buf_i64(&self->timestamps, micros) < 0 ||
        buf_put(&self->key_data, m.key.p, m.key.n) < 0 || buf_i32(&self->key_off, (int32_t)self->key_data.len) < 0 ||
        buf_put(&self->value_data, m.value.p, m.value.n) < 0 ||
        buf_i32(&self->value_off, (int32_t)self->value_data.len) < 0 ||
        buf_put(&self->subject_data, m.subject.p, m.subject.n) < 0 ||
        buf_i32(&self->subject_off, (int32_t)self->subject_data.len) < 0)
        return NULL;
    for (Py_ssize_t i = 0; i < m.headers; i++) {
        Header *h = &self->headers[i];
        if (buf_put(&self->name_data, h->name.p, h->name.n) < 0 ||
            buf_i32(&self->name_off, (int32_t)self->name_data.len) < 0 ||
            buf_put(&self->hval_data, h->value.p, h->value.n) < 0 ||
            buf_i32(&self->hval_off, (int32_t)self->hval_data.len) < 0)
            return NULL;
    }
    self->entries += (int32_t)m.headers;
    if (buf_i32(&self->map_off, self->entries) < 0) return NULL;
    self->rows++;
    self->size += added;
    self->data += added + m.subject.n;
    self->has_last = 1;
    self->last_offset = m.offset;
    if (m.offset < INT64_MAX) self->low = m.offset + 1;
    return PyLong_FromLong(m.offset == self->high ? LAST : TAKEN);
}

static PyObject *Builder_window(Builder *self, PyObject *args) {
    long long low, high;
    if (!PyArg_ParseTuple(args, "LL", &low, &high)) return NULL;
    self->low = low;
    self->high = high;
    Py_RETURN_NONE;
}

static PyObject *Builder_finish(Builder *self, PyObject *Py_UNUSED(ignored)) {
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

static int Builder_init(Builder *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"max_rows", "max_bytes", NULL};
    Py_ssize_t max_rows, max_bytes;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "$nn", names, &max_rows, &max_bytes)) return -1;
    if (max_rows < 1 || max_bytes < 1) {
        PyErr_SetString(PyExc_ValueError, "max_rows and max_bytes must be >= 1");
        return -1;
    }
    self->max_rows = max_rows;
    self->max_bytes = max_bytes;
    self->low = INT64_MIN;
    self->high = INT64_MAX;
    self->has_last = 0;
    return reset(self);
}

static void Builder_dealloc(Builder *self) {
    for (int i = 0; i < 13; i++) PyMem_Free(all_bufs(self, i)->data);
    PyMem_Free(self->headers);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Builder_methods[] = {
    {"add", (PyCFunction)Builder_add, METH_O, "Decode one serialized Message; returns TAKEN, SKIPPED, LAST, END or FULL."},
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
