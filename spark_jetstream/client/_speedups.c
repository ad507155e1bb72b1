/*
 * Compiled twins of the bulk handlers in protocol.py (decision 0029): deliveries_handler_py and
 * direct_replies_handler_py, byte for byte. The pure-Python ones are the reference: for any buffer and position,
 * a handler made here calls its callback with equal arguments (the same types: bytes, memoryview slices of the
 * caller's view, ints, None), returns the same position and raises the same errors (tests/test_speedups.py).
 *
 * Each match_* function is the regex of its pure twin written out as a scanner. Python's regexes there are
 * possessive (no backtracking) but for two spots noted below, so each has one way to match; the scanners follow
 * them step by step. Every read of the buffer is checked against its length first: these are bytes from the
 * network. Sizes and numbers from the wire are converted as int() converts them (digits beyond 18 go through
 * int() itself, so its limit on long digit strings raises the same ValueError), and a size larger than a
 * Py_ssize_t counts as larger than any buffer.
 *
 * Plain CPython C API, limited to Python 3.11's stable ABI: one wheel per platform serves every CPython >= 3.11.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

typedef struct {
    Py_ssize_t at, len; /* a field of the buffer: b[at:at + len] (len 0: absent) */
} Span;

enum { DELIVERIES, DIRECT_REPLIES };

typedef struct {
    PyObject_HEAD
    PyObject *callback; /* deliver (deliveries) or keep (Direct Get replies) */
    int kind;
    int keep_headers;
    Py_ssize_t sid_len;
    char sid[32]; /* the subscription's id as the protocol line writes it (b"%d" % sid) */
} Handler;

static PyObject *handler_type; /* set once by the module's init */

/* -- scanning ---------------------------------------------------------------------------------------------- */

#define STOP_SPACE 1 /* [^ \r\n]: a subject */
#define STOP_DOT 2   /* [^ .\r\n]: a token of a reply subject (with STOP_SPACE) */

/* The length of the run at b[i:] without CR, LF and the bytes `stops` adds: a regex's [^...]++. */
static Py_ssize_t
run_of(const unsigned char *b, Py_ssize_t i, Py_ssize_t n, int stops)
{
    Py_ssize_t j = i;
    for (; j < n; j++) {
        unsigned char c = b[j];
        if (c == '\r' || c == '\n' || ((stops & STOP_SPACE) && c == ' ') || ((stops & STOP_DOT) && c == '.'))
            break;
    }
    return j - i;
}

/* The length of the run of ASCII digits at b[i:]: \d++ (bytes patterns match ASCII digits only). */
static Py_ssize_t
digits_at(const unsigned char *b, Py_ssize_t i, Py_ssize_t n)
{
    Py_ssize_t j = i;
    while (j < n && b[j] >= '0' && b[j] <= '9')
        j++;
    return j - i;
}

/* Whether b[*i:] starts with `text`; if so *i moves past it. */
static int
skip(const unsigned char *b, Py_ssize_t n, Py_ssize_t *i, const char *text, Py_ssize_t len)
{
    if (n - *i < len || memcmp(b + *i, text, (size_t)len) != 0)
        return 0;
    *i += len;
    return 1;
}

#define SKIP(text) skip(b, n, &i, (text), (Py_ssize_t)sizeof(text) - 1)

/* A digits field at b[*i:] (at least one): its span, *i past it; 0 when there is none. */
static int
digits_field(const unsigned char *b, Py_ssize_t n, Py_ssize_t *i, Span *field)
{
    field->at = *i;
    field->len = digits_at(b, *i, n);
    *i += field->len;
    return field->len > 0;
}

/* A run without CR and LF (and `stops`) at b[*i:], at least one byte: its span, *i past it; 0 when empty. */
static int
run_field(const unsigned char *b, Py_ssize_t n, Py_ssize_t *i, int stops, Span *field)
{
    field->at = *i;
    field->len = run_of(b, *i, n, stops);
    *i += field->len;
    return field->len > 0;
}

/* -- numbers ------------------------------------------------------------------------------------------------- */

#define SHORT_DIGITS 18 /* fewer than 10**18 < 2**63: exact in a long long */

/* int(b[at:at + len]) for a run of ASCII digits: a new reference, or NULL with int()'s error. */
static PyObject *
to_int(const unsigned char *b, Span field)
{
    if (field.len <= SHORT_DIGITS) {
        long long value = 0;
        for (Py_ssize_t k = 0; k < field.len; k++)
            value = value * 10 + (b[field.at + k] - '0');
        return PyLong_FromLongLong(value);
    }
    PyObject *text = PyBytes_FromStringAndSize((const char *)b + field.at, field.len);
    if (text == NULL)
        return NULL;
    PyObject *value = PyNumber_Long(text); /* int(bytes) itself: the same value, or the same ValueError */
    Py_DECREF(text);
    return value;
}

/* A size from the wire into *size, PY_SSIZE_T_MAX when larger (no buffer is that large): 0, or -1 with int()'s
 * error. */
static int
to_size(const unsigned char *b, Span field, Py_ssize_t *size)
{
    if (field.len <= SHORT_DIGITS) {
        long long value = 0;
        for (Py_ssize_t k = 0; k < field.len; k++)
            value = value * 10 + (b[field.at + k] - '0');
        *size = value > (long long)PY_SSIZE_T_MAX ? PY_SSIZE_T_MAX : (Py_ssize_t)value;
        return 0;
    }
    PyObject *value = to_int(b, field);
    if (value == NULL)
        return -1;
    *size = PyLong_AsSsize_t(value);
    Py_DECREF(value);
    if (*size == -1 && PyErr_Occurred()) { /* OverflowError: digits are never negative */
        PyErr_Clear();
        *size = PY_SSIZE_T_MAX;
    }
    return 0;
}

/* -- list helpers ---------------------------------------------------------------------------------------------- */

/* Append `item` (a new reference, or NULL after an error) to `list`, consuming it: 0, or -1 with an error. */
static int
append_new(PyObject *list, PyObject *item)
{
    if (item == NULL)
        return -1;
    int failed = PyList_Append(list, item);
    Py_DECREF(item);
    return failed;
}

static PyObject *
bytes_of(const unsigned char *b, Span field)
{
    return PyBytes_FromStringAndSize((const char *)b + field.at, field.len);
}

/* Up to `count` new empty lists into lists[]: 0, or -1 with an error (the ones made are freed by the caller). */
static int
new_lists(PyObject **lists, int count)
{
    for (int k = 0; k < count; k++)
        if ((lists[k] = PyList_New(0)) == NULL)
            return -1;
    return 0;
}

static void
clear_lists(PyObject **lists, int count)
{
    for (int k = 0; k < count; k++)
        Py_CLEAR(lists[k]);
}

/* -- deliveries -------------------------------------------------------------------------------------------- */

typedef struct {
    Span subject, seq, stamp, pending, header_size, total;
    Py_ssize_t body; /* where the message's bytes start: after its line's CRLF */
} Delivery;

/*
 * _delivery_patterns(sid) at b[i:]: "H?MSG <subject> <sid> $JS.ACK.<reply> [<header size> ]<size>\r\n", the
 * reply being 7 tokens (stream, consumer, then 5 numbers: delivered, stream seq, consumer seq, stamp, pending),
 * or 9 (domain and account hash first) or 10 (and a random token last). Tokens are non-empty and split by dots.
 * The two spots where the regex may backtrack, "H?" and "(?:(\d++) )?", cannot match another way: after H only
 * "MSG " can follow, and a header size must be followed by a size and CRLF.
 */
static int
match_delivery(const unsigned char *b, Py_ssize_t n, Py_ssize_t i, const Handler *h, Delivery *d)
{
    Span token[10], first_size;
    int count = 0, numbers;

    if (i < n && b[i] == 'H')
        i++;
    if (!SKIP("MSG ") || !run_field(b, n, &i, STOP_SPACE, &d->subject) || !SKIP(" "))
        return 0;
    if (!skip(b, n, &i, h->sid, h->sid_len) || !SKIP(" $JS.ACK."))
        return 0;
    for (;;) { /* the reply's tokens, up to the space after it */
        if (!run_field(b, n, &i, STOP_SPACE | STOP_DOT, &token[count]) || i >= n)
            return 0;
        count++;
        if (SKIP(" "))
            break;
        if (count == 10 || !SKIP("."))
            return 0; /* an 11th token, or the line ends inside the reply */
    }
    numbers = count == 7 ? 2 : (count == 9 || count == 10) ? 4 : -1;
    if (numbers < 0)
        return 0;
    for (int k = numbers; k < numbers + 5; k++)
        if (digits_at(b, token[k].at, n) != token[k].len)
            return 0;
    d->seq = token[numbers + 1];
    d->stamp = token[numbers + 3];
    d->pending = token[numbers + 4];
    if (!digits_field(b, n, &i, &first_size))
        return 0;
    if (SKIP(" ")) {
        d->header_size = first_size;
        if (!digits_field(b, n, &i, &d->total))
            return 0;
    }
    else {
        d->header_size.at = d->header_size.len = 0;
        d->total = first_size;
    }
    if (!SKIP("\r\n"))
        return 0;
    d->body = i;
    return 1;
}

/* deliveries_handler_py's take(): the run of deliveries at `pos` to the callback; the position after it. */
static PyObject *
take_deliveries(Handler *h, PyObject *buffer_object, PyObject *view, Py_ssize_t pos)
{
    enum { SUBJECTS, PAYLOADS, SEQS, STAMPS, HEADERS, LISTS };
    PyObject *lists[LISTS] = {NULL};
    Py_ssize_t count = 0, drained = -1;
    Py_buffer buffer;
    Delivery d;

    if (PyObject_GetBuffer(buffer_object, &buffer, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *b = buffer.buf;
    Py_ssize_t size = buffer.len;

    while (pos < size && match_delivery(b, size, pos, h, &d)) {
        Py_ssize_t total, header_size = 0, start = d.body, payload_start = d.body;
        int headed = b[pos] == 'H';

        if (to_size(b, d.total, &total) < 0)
            goto error;
        if (total > size - start - 2 || (d.header_size.len > 0) != headed)
            break; /* not all here yet, or malformed (the parser reports it) */
        if (headed) {
            if (to_size(b, d.header_size, &header_size) < 0)
                goto error;
            if (header_size > total)
                break;
            payload_start = start + header_size;
        }
        if (count == 0 && new_lists(lists, LISTS) < 0)
            goto error;
        if (h->keep_headers || (headed && PyList_Size(lists[HEADERS]) == 0)) {
            PyObject *block = headed ? PySequence_GetSlice(view, start, payload_start) : Py_NewRef(Py_None);
            if (append_new(lists[HEADERS], block) < 0)
                goto error;
        }
        if (append_new(lists[SUBJECTS], bytes_of(b, d.subject)) < 0 ||
            append_new(lists[PAYLOADS], PySequence_GetSlice(view, payload_start, start + total)) < 0 ||
            append_new(lists[SEQS], to_int(b, d.seq)) < 0 || append_new(lists[STAMPS], to_int(b, d.stamp)) < 0)
            goto error;
        if (drained < 0 && d.pending.len == 1 && b[d.pending.at] == '0')
            drained = count; /* the server counted nothing more pending after this one */
        count++;
        pos = start + total + 2;
    }
    PyBuffer_Release(&buffer);
    if (count) {
        if (PyList_Size(lists[HEADERS]) == 0 && append_new(lists[HEADERS], Py_NewRef(Py_None)) < 0)
            goto released;
        PyObject *taken = PyLong_FromSsize_t(drained >= 0 ? drained : count);
        if (taken == NULL)
            goto released;
        PyObject *result = PyObject_CallFunctionObjArgs(h->callback, lists[SUBJECTS], lists[PAYLOADS], lists[SEQS],
                                                        lists[STAMPS], lists[HEADERS], taken, NULL);
        Py_DECREF(taken);
        if (result == NULL)
            goto released;
        Py_DECREF(result);
    }
    clear_lists(lists, LISTS);
    return PyLong_FromSsize_t(pos);

error:
    PyBuffer_Release(&buffer);
released:
    clear_lists(lists, LISTS);
    return NULL;
}

/* -- Direct Get replies ---------------------------------------------------------------------------------------- */

typedef struct {
    Span header_size, total, subject, seq, stamp, pending;
    Py_ssize_t start;      /* the header block's start: after the line's CRLF */
    Py_ssize_t own_end;    /* where the server's headers start: the message's own end there */
    Py_ssize_t header_end; /* after the blank line that ends the block */
} Reply;

/*
 * The server's headers at b[i:] as _DIRECT_REPLY's tail reads them, through the blank line that ends the block:
 * Nats-Stream, Nats-Subject, Nats-Sequence, Nats-Time-Stamp, then maybe Nats-Num-Pending and Nats-Last-Sequence.
 * Each optional header either matches whole or is absent: what follows it can only be the next header or the
 * blank line, so the regex has no other way to match.
 */
static int
match_server_headers(const unsigned char *b, Py_ssize_t n, Py_ssize_t i, Reply *r)
{
    Span stream, last;
    Py_ssize_t j;

    if (!SKIP("Nats-Stream: "))
        return 0;
    run_field(b, n, &i, 0, &stream); /* may be empty: [^\r\n]*+ */
    if (!SKIP("\r\nNats-Subject: ") || !run_field(b, n, &i, 0, &r->subject))
        return 0;
    if (!SKIP("\r\nNats-Sequence: ") || !digits_field(b, n, &i, &r->seq))
        return 0;
    if (!SKIP("\r\nNats-Time-Stamp: ") || !run_field(b, n, &i, 0, &r->stamp) || !SKIP("\r\n"))
        return 0;
    r->pending.at = r->pending.len = 0;
    j = i;
    if (skip(b, n, &j, "Nats-Num-Pending: ", 18) && digits_field(b, n, &j, &r->pending) &&
        skip(b, n, &j, "\r\n", 2))
        i = j;
    else
        r->pending.at = r->pending.len = 0;
    j = i;
    if (skip(b, n, &j, "Nats-Last-Sequence: ", 20) && digits_field(b, n, &j, &last) && skip(b, n, &j, "\r\n", 2))
        i = j;
    if (!SKIP("\r\n"))
        return 0;
    r->header_end = i;
    return 1;
}

/*
 * _DIRECT_REPLY(sid) at b[i:]: "HMSG <inbox> <sid> <header size> <size>\r\nNATS/1.0\r\n", then the message's own
 * header lines, as few as let the server's follow (the regex's lazy "(?:[^\r\n]*+\r\n)*?": the server's headers
 * are tried at each line's start, and a line without its CRLF ends the search). Like the regex, the search is not
 * bounded by the header size: the caller checks that the block found is the one the sizes give.
 */
static int
match_direct(const unsigned char *b, Py_ssize_t n, Py_ssize_t i, const Handler *h, Reply *r)
{
    Span inbox;

    if (!SKIP("HMSG ") || !run_field(b, n, &i, STOP_SPACE, &inbox) || !SKIP(" "))
        return 0;
    if (!skip(b, n, &i, h->sid, h->sid_len) || !SKIP(" ") || !digits_field(b, n, &i, &r->header_size) || !SKIP(" "))
        return 0;
    if (!digits_field(b, n, &i, &r->total) || !SKIP("\r\n"))
        return 0;
    r->start = i;
    if (!SKIP("NATS/1.0\r\n"))
        return 0;
    for (;;) { /* each turn moves on by a whole line: at least its CRLF */
        if (match_server_headers(b, n, i, r)) {
            r->own_end = i;
            return 1;
        }
        i += run_of(b, i, n, 0);
        if (!SKIP("\r\n"))
            return 0;
    }
}

/* The message's own header block of a reply, as the pure handler cuts it: None when it had none. */
static PyObject *
own_headers(const unsigned char *b, const Reply *r)
{
    Py_ssize_t len = r->own_end - r->start; /* "NATS/1.0\r\n" and its own lines: at least 10 bytes */
    if (len <= (Py_ssize_t)sizeof("NATS/1.0\r\n") - 1)
        return Py_NewRef(Py_None);
    PyObject *block = PyBytes_FromStringAndSize(NULL, len + 2);
    if (block == NULL)
        return NULL;
    char *text = PyBytes_AsString(block);
    memcpy(text, b + r->start, (size_t)len);
    memcpy(text + len, "\r\n", 2);
    return block;
}

/* direct_replies_handler_py's take(): the run of replies at `pos` to the callback; the position after it. */
static PyObject *
take_direct_replies(Handler *h, PyObject *buffer_object, PyObject *view, Py_ssize_t pos)
{
    enum { SUBJECTS, PAYLOADS, SEQS, STAMPS, HEADERS, LISTS };
    PyObject *lists[LISTS] = {NULL};
    Py_ssize_t count = 0;
    Span pending = {0, 0};
    PyObject *pending_text = NULL;
    Py_buffer buffer;
    Reply r;

    if (PyObject_GetBuffer(buffer_object, &buffer, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *b = buffer.buf;
    Py_ssize_t size = buffer.len;

    while (pos < size && match_direct(b, size, pos, h, &r)) {
        Py_ssize_t total, header_size;

        if (to_size(b, r.total, &total) < 0 || to_size(b, r.header_size, &header_size) < 0)
            goto error;
        if (header_size != r.header_end - r.start || total < header_size || total > size - r.start - 2 ||
            b[r.start + total] != '\r')
            break; /* sizes that disagree with the block (the per-message path reads by sizes), or not all here */
        if (count == 0 && new_lists(lists, LISTS) < 0)
            goto error;
        /* a seq of up to 18 digits is its int now; a longer one stays text until the run is over, as the pure
         * handler converts them all then (int()'s error on a too long one comes after the run's other errors) */
        PyObject *seq = r.seq.len <= SHORT_DIGITS ? to_int(b, r.seq) : bytes_of(b, r.seq);
        if (append_new(lists[SUBJECTS], bytes_of(b, r.subject)) < 0 ||
            append_new(lists[PAYLOADS], PySequence_GetSlice(view, r.header_end, r.start + total)) < 0 ||
            append_new(lists[SEQS], seq) < 0 || append_new(lists[STAMPS], bytes_of(b, r.stamp)) < 0)
            goto error;
        if (h->keep_headers && append_new(lists[HEADERS], own_headers(b, &r)) < 0)
            goto error;
        pending = r.pending;
        count++;
        pos = r.start + total + 2;
    }
    if (count && pending.len > 0 && (pending_text = bytes_of(b, pending)) == NULL)
        goto error;
    PyBuffer_Release(&buffer);
    if (count) {
        for (Py_ssize_t k = 0; k < count; k++) { /* list(map(int, seqs)) */
            PyObject *seq = PyList_GetItem(lists[SEQS], k);
            if (PyBytes_Check(seq)) {
                PyObject *value = PyNumber_Long(seq);
                if (value == NULL || PyList_SetItem(lists[SEQS], k, value) < 0)
                    goto released;
            }
        }
        PyObject *result = PyObject_CallFunctionObjArgs(
            h->callback, lists[SUBJECTS], lists[PAYLOADS], lists[SEQS], lists[STAMPS],
            h->keep_headers ? lists[HEADERS] : Py_None, pending_text ? pending_text : Py_None, NULL);
        if (result == NULL)
            goto released;
        Py_DECREF(result);
    }
    Py_XDECREF(pending_text);
    clear_lists(lists, LISTS);
    return PyLong_FromSsize_t(pos);

error:
    PyBuffer_Release(&buffer);
released:
    Py_XDECREF(pending_text);
    clear_lists(lists, LISTS);
    return NULL;
}

/* -- the handler type ---------------------------------------------------------------------------------------- */

static PyObject *
handler_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"buf", "view", "pos", NULL};
    Handler *h = (Handler *)self;
    PyObject *buffer_object, *view;
    Py_ssize_t pos;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOn:take", names, &buffer_object, &view, &pos))
        return NULL;
    if (h->callback == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a bulk handler without its callback");
        return NULL;
    }
    if (pos < 0) { /* outside the seam's contract: a position of a line in the buffer */
        PyErr_SetString(PyExc_ValueError, "a bulk handler's position must not be negative");
        return NULL;
    }
    if (h->kind == DELIVERIES)
        return take_deliveries(h, buffer_object, view, pos);
    return take_direct_replies(h, buffer_object, view, pos);
}

static int
handler_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(((Handler *)self)->callback);
    Py_VISIT(Py_TYPE(self)); /* a heap type: its instances hold it */
    return 0;
}

static int
handler_clear(PyObject *self)
{
    Py_CLEAR(((Handler *)self)->callback);
    return 0;
}

static void
handler_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    handler_clear(self);
    freefunc free_self = (freefunc)PyType_GetSlot(type, Py_tp_free);
    free_self(self);
    Py_DECREF(type);
}

static PyType_Slot handler_slots[] = {
    {Py_tp_doc, "A compiled bulk handler: take(buf, view, pos) -> the position after the run it took."},
    {Py_tp_call, handler_call},
    {Py_tp_traverse, handler_traverse},
    {Py_tp_clear, handler_clear},
    {Py_tp_dealloc, handler_dealloc},
    {0, NULL},
};

static PyType_Spec handler_spec = {
    "spark_jetstream.client._speedups.BulkHandler",
    sizeof(Handler),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    handler_slots,
};

static PyObject *
new_handler(int kind, PyObject *args, PyObject *kwargs, char **names, const char *format)
{
    long long sid;
    PyObject *callback;
    int keep_headers;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, format, names, &sid, &callback, &keep_headers))
        return NULL;
    allocfunc alloc = (allocfunc)PyType_GetSlot((PyTypeObject *)handler_type, Py_tp_alloc);
    Handler *h = (Handler *)alloc((PyTypeObject *)handler_type, 0);
    if (h == NULL)
        return NULL;
    h->kind = kind;
    h->keep_headers = keep_headers;
    h->sid_len = PyOS_snprintf(h->sid, sizeof(h->sid), "%lld", sid);
    h->callback = Py_NewRef(callback);
    return (PyObject *)h;
}

static PyObject *
deliveries_handler(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"sid", "deliver", "keep_headers", NULL};
    (void)module;
    return new_handler(DELIVERIES, args, kwargs, names, "LOp:deliveries_handler");
}

static PyObject *
direct_replies_handler(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"sid", "keep", "keep_headers", NULL};
    (void)module;
    return new_handler(DIRECT_REPLIES, args, kwargs, names, "LOp:direct_replies_handler");
}

static PyMethodDef methods[] = {
    {"deliveries_handler", (PyCFunction)(void (*)(void))deliveries_handler, METH_VARARGS | METH_KEYWORDS,
     "deliveries_handler(sid, deliver, keep_headers): protocol.deliveries_handler_py, compiled."},
    {"direct_replies_handler", (PyCFunction)(void (*)(void))direct_replies_handler, METH_VARARGS | METH_KEYWORDS,
     "direct_replies_handler(sid, keep, keep_headers): protocol.direct_replies_handler_py, compiled."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "spark_jetstream.client._speedups",
    "Compiled twins of protocol.py's bulk handlers (decision 0029).",
    -1,
    methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (handler_type == NULL && (handler_type = PyType_FromSpec(&handler_spec)) == NULL) {
        Py_DECREF(module);
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "BulkHandler", handler_type) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
