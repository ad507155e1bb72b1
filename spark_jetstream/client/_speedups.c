/*
 * Compiled twins of the bulk handlers in protocol.py (decisions 0029 and 0033): deliveries_handler_py and
 * direct_replies_handler_py, byte for byte. The pure-Python ones are the reference: for any buffer and position, a
 * handler made here appends the same bytes and numbers to the target's rows (protocol.Columns), calls its callback
 * with equal arguments, returns the same position and raises the same errors (tests/test_speedups.py).
 *
 * Each match_* function is the regex of its pure twin written out as a scanner. Python's regexes there are
 * possessive (no backtracking) but for two spots noted below, so each has one way to match; the scanners follow
 * them step by step. Every read of the buffer is checked against its length first: these are bytes from the
 * network. A run is taken in two steps: the scan notes each message's fields (spans of the buffer, numbers) in
 * memory of its own, then, still holding the buffer and before any Python code runs, the texts are copied onto the
 * rows' bytearrays; the buffer is released before the rows' arrays grow and the callback runs. Numbers from the
 * wire are read as int() reads them (digits beyond what int() always converts go through int() itself), and one
 * that does not fit in 64 bits ends the run before its message, as in the pure twin.
 *
 * Plain CPython C API, limited to Python 3.11's stable ABI: one wheel per platform serves every CPython >= 3.11.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <string.h>

typedef struct {
    Py_ssize_t at, len; /* a field of the buffer: b[at:at + len] (len 0: absent) */
} Span;

enum { DELIVERIES, DIRECT_REPLIES };

typedef struct {
    PyObject_HEAD
    PyObject *target;   /* its rows are appended to (protocol.Target) */
    PyObject *callback; /* deliver (deliveries) or keep (Direct Get replies) */
    int kind;
    Py_ssize_t sid_len;
    char sid[32];       /* the subscription's id as the protocol line writes it (b"%d" % sid) */
    PyObject *stream;   /* Direct Get replies: the name they must carry in Nats-Stream (bytes, held); else NULL */
    const char *stream_text; /* its bytes */
    Py_ssize_t stream_len;
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

#define ALWAYS_DIGITS 640 /* sys.int_info.str_digits_check_threshold: int() converts so many digits, any limit */
#define MAX_DIGITS 19     /* 10**19 - 1 < 2**64: exact in an unsigned long long */

/* A number from the wire (a run of ASCII digits) as int() reads it, into *value: 1; 0 when it does not fit in a
 * long long or int() refuses it (more digits than sys.get_int_max_str_digits()): the run ends before its message;
 * -1 with an error. */
static int
to_number(const unsigned char *b, Span field, long long *value)
{
    if (field.len > ALWAYS_DIGITS) {
        PyObject *text = PyBytes_FromStringAndSize((const char *)b + field.at, field.len);
        if (text == NULL)
            return -1;
        PyObject *number = PyNumber_Long(text); /* int(bytes) itself: the same value, or the same ValueError */
        Py_DECREF(text);
        if (number == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_ValueError))
                return -1;
            PyErr_Clear();
            return 0;
        }
        int overflow;
        *value = PyLong_AsLongLongAndOverflow(number, &overflow);
        Py_DECREF(number);
        if (*value == -1 && PyErr_Occurred())
            return -1;
        return overflow == 0;
    }
    Py_ssize_t k = 0;
    while (k < field.len && b[field.at + k] == '0')
        k++; /* leading zeros: int() reads them */
    if (field.len - k > MAX_DIGITS)
        return 0;
    unsigned long long number = 0;
    for (; k < field.len; k++)
        number = number * 10 + (unsigned long long)(b[field.at + k] - '0');
    if (number > (unsigned long long)LLONG_MAX)
        return 0;
    *value = (long long)number;
    return 1;
}

/* A size from the wire into *size: 1; 0 when it is larger than any buffer (or int() refuses it); -1 with an error. */
static int
to_size(const unsigned char *b, Span field, Py_ssize_t *size)
{
    long long value;
    int found = to_number(b, field, &value);
    if (found <= 0 || value > (long long)PY_SSIZE_T_MAX)
        return found < 0 ? -1 : 0;
    *size = (Py_ssize_t)value;
    return 1;
}

/* -- runs ------------------------------------------------------------------------------------------------------ */

/* What a run keeps of one message: spans of the buffer, and its numbers. */
typedef struct {
    Span subject, payload, header, time; /* time: a Direct Get reply's RFC 3339 text */
    Py_ssize_t header_tail;              /* 2: the block is its span and "\r\n" (a Direct Get reply's own), else 0 */
    long long seq, stamp;
} Row;

typedef struct {
    Row *rows;
    Py_ssize_t count, capacity;
} Run;

/* The next message's slot (counted once its fields are all taken: run->count++), or NULL with an error. */
static Row *
next_row(Run *run)
{
    if (run->count == run->capacity) {
        Py_ssize_t capacity = run->capacity ? 2 * run->capacity : 64;
        if (run->capacity > PY_SSIZE_T_MAX / 2 / (Py_ssize_t)sizeof(Row)) {
            PyErr_NoMemory();
            return NULL;
        }
        Row *rows = PyMem_Realloc(run->rows, (size_t)capacity * sizeof(Row));
        if (rows == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        run->rows = rows;
        run->capacity = capacity;
    }
    return &run->rows[run->count];
}

/* -- the rows a run is appended to (protocol.Columns) ---------------------------------------------------------- */

enum { SUBJECTS, PAYLOADS, HEADERS, TIMES, TEXTS }; /* the columns kept as texts back to back */

typedef struct {
    PyObject *rows;
    PyObject *values[TEXTS], *ends[TEXTS]; /* a bytearray and its array("i") of ends; NULL: not kept as text */
    PyObject *seqs, *stamps;               /* array("q"); stamps NULL: the times are text */
    Py_ssize_t first;                      /* the run's first row */
} Columns;

static void
clear_columns(Columns *c)
{
    Py_CLEAR(c->rows);
    for (int k = 0; k < TEXTS; k++) {
        Py_CLEAR(c->values[k]);
        Py_CLEAR(c->ends[k]);
    }
    Py_CLEAR(c->seqs);
    Py_CLEAR(c->stamps);
}

static PyObject *
attribute(PyObject *rows, const char *name)
{
    return PyObject_GetAttrString(rows, name);
}

/* A text column named `values` (a bytearray) with its `ends`: 1; 0 when `ends` is None (not kept so); -1 with an
 * error. */
static int
text_column(Columns *c, int column, const char *values, const char *ends)
{
    c->ends[column] = attribute(c->rows, ends);
    if (c->ends[column] == NULL)
        return -1;
    if (c->ends[column] == Py_None) {
        Py_CLEAR(c->ends[column]);
        return 0;
    }
    c->values[column] = attribute(c->rows, values);
    if (c->values[column] == NULL)
        return -1;
    if (!PyByteArray_Check(c->values[column])) {
        PyErr_Format(PyExc_TypeError, "a bulk handler appends %s to a bytearray", values);
        return -1;
    }
    return 1;
}

/* target.rows and the columns of it a run is appended to (read before the buffer is held: it may run Python code):
 * 0, or -1 with an error. */
static int
get_columns(Handler *h, Columns *c)
{
    if ((c->rows = attribute(h->target, "rows")) == NULL)
        return -1;
    if (text_column(c, SUBJECTS, "subjects", "subject_ends") <= 0 ||
        text_column(c, PAYLOADS, "payload", "offsets") <= 0)
        goto missing;
    if (text_column(c, HEADERS, "headers", "header_ends") < 0) /* None: no header blocks kept */
        return -1;
    if (h->kind == DIRECT_REPLIES) {
        if (text_column(c, TIMES, "times", "time_ends") <= 0)
            goto missing;
    }
    else if ((c->stamps = attribute(c->rows, "times")) == NULL)
        return -1;
    if ((c->seqs = attribute(c->rows, "seqs")) == NULL || (c->first = PyObject_Size(c->seqs)) < 0)
        return -1;
    return 0;

missing:
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "a bulk handler appends subjects, payloads and times to texts back to back");
    return -1;
}

/* The span of `column` in a row, and how many bytes of "\r\n" follow it there. */
static Span
text_of(const Row *row, int column, Py_ssize_t *tail)
{
    *tail = column == HEADERS ? row->header_tail : 0;
    return column == SUBJECTS   ? row->subject
           : column == PAYLOADS ? row->payload
           : column == HEADERS  ? row->header
                                : row->time;
}

/* Append the run's texts to the columns kept so, each one's end into ends[column * count + k], while the buffer `b`
 * is held (nothing here runs Python code): 0, or -1 with an error, before anything is appended when a column would
 * pass INT_MAX bytes (its ends are an array("i")). */
static int
append_texts(Columns *c, const unsigned char *b, const Run *run, int *ends)
{
    Py_ssize_t base[TEXTS], total[TEXTS], tail;

    for (int column = 0; column < TEXTS; column++) {
        if (c->values[column] == NULL)
            continue;
        base[column] = PyByteArray_Size(c->values[column]);
        total[column] = 0;
        if (base[column] > INT_MAX)
            goto too_large;
        for (Py_ssize_t k = 0; k < run->count; k++) {
            Span text = text_of(&run->rows[k], column, &tail);
            if (text.len > (Py_ssize_t)INT_MAX - base[column] - total[column] - tail) /* all in [0, INT_MAX] */
                goto too_large;
            total[column] += text.len + tail;
        }
    }
    for (int column = 0; column < TEXTS; column++) {
        if (c->values[column] == NULL)
            continue;
        if (PyByteArray_Resize(c->values[column], base[column] + total[column]) < 0)
            return -1;
        char *into = PyByteArray_AsString(c->values[column]);
        Py_ssize_t at = base[column];
        for (Py_ssize_t k = 0; k < run->count; k++) {
            Span text = text_of(&run->rows[k], column, &tail);
            memcpy(into + at, b + text.at, (size_t)text.len);
            if (tail)
                memcpy(into + at + text.len, "\r\n", 2);
            at += text.len + tail;
            ends[column * run->count + k] = (int)at;
        }
    }
    return 0;

too_large:
    PyErr_SetString(PyExc_OverflowError,
                    "a run would take a record batch's column past 2 GiB (its offsets are 32-bit)"); /* TOO_LARGE */
    return -1;
}

/* `array.frombytes(bytes(items))`: 0, or -1 with an error. */
static int
extend_array(PyObject *array, const void *items, Py_ssize_t size)
{
    PyObject *done = PyObject_CallMethod(array, "frombytes", "y#", (const char *)items, size);
    if (done == NULL)
        return -1;
    Py_DECREF(done);
    return 0;
}

/*
 * The run's rows onto the columns: the texts while `buffer` is held, then (released: `buffer` is NULL after) the
 * ends of each text column, the seqs and the ns times where they are numbers. 0, or -1 with an error; `buffer` is
 * released either way.
 */
static int
append_run(Columns *c, Py_buffer *buffer, const Run *run)
{
    Py_ssize_t count = run->count;
    int *ends = PyMem_Malloc((size_t)count * TEXTS * sizeof(int));
    long long *numbers = PyMem_Malloc((size_t)count * 2 * sizeof(long long));
    int failed = ends == NULL || numbers == NULL;

    if (failed)
        PyErr_NoMemory();
    else
        failed = append_texts(c, buffer->buf, run, ends) < 0;
    PyBuffer_Release(buffer);
    for (int column = 0; column < TEXTS && !failed; column++)
        if (c->values[column] != NULL)
            failed = extend_array(c->ends[column], ends + column * count, count * (Py_ssize_t)sizeof(int)) < 0;
    if (!failed) {
        for (Py_ssize_t k = 0; k < count; k++) {
            numbers[k] = run->rows[k].seq;
            numbers[count + k] = run->rows[k].stamp;
        }
        failed = extend_array(c->seqs, numbers, count * (Py_ssize_t)sizeof(long long)) < 0 ||
                 (c->stamps != NULL &&
                  extend_array(c->stamps, numbers + count, count * (Py_ssize_t)sizeof(long long)) < 0);
    }
    PyMem_Free(ends);
    PyMem_Free(numbers);
    return failed ? -1 : 0;
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

/* Take a field with `call` (to_number, to_size): on to the next step when it is taken; the run ends before this
 * message when it cannot be (0); -1 is an error. */
#define TAKE(call)                  \
    do {                            \
        int taken_ = (call);        \
        if (taken_ < 0)             \
            goto scan_error;        \
        if (taken_ == 0)            \
            goto scanned;           \
    } while (0)

/* deliveries_handler_py's take(): the run of deliveries at `pos` onto the target's rows, then the callback; the
 * position after the run. */
static PyObject *
take_deliveries(Handler *h, PyObject *buffer_object, Py_ssize_t pos)
{
    Columns c = {0};
    Run run = {0};
    Py_ssize_t drained = -1;
    long long prior = -1;
    PyObject *header = NULL, *result = NULL;
    Py_buffer buffer;
    Delivery d;

    if (get_columns(h, &c) < 0 || PyObject_GetBuffer(buffer_object, &buffer, PyBUF_SIMPLE) < 0)
        goto done;
    const unsigned char *b = buffer.buf;
    Py_ssize_t size = buffer.len;

    while (pos < size && match_delivery(b, size, pos, h, &d)) {
        Py_ssize_t total, header_size = 0, start = d.body;
        int headed = b[pos] == 'H';
        Row *row = next_row(&run);

        if (row == NULL)
            goto scan_error;
        TAKE(to_size(b, d.total, &total));
        if (total > size - start - 2 || (d.header_size.len > 0) != headed)
            break; /* not all here yet, or malformed (the parser reports it) */
        if (headed)
            TAKE(to_size(b, d.header_size, &header_size));
        if (header_size > total)
            break;
        TAKE(to_number(b, d.seq, &row->seq));
        TAKE(to_number(b, d.stamp, &row->stamp));
        if (row->seq <= prior)
            break; /* a redelivery starts a run of its own: each run ascends */
        row->subject = d.subject;
        row->header = (Span){start, header_size}; /* empty for a MSG */
        row->header_tail = 0;
        row->payload = (Span){start + header_size, total - header_size};
        if (headed && header == NULL &&
            (header = PyBytes_FromStringAndSize((const char *)b + start, header_size)) == NULL)
            goto scan_error;
        if (drained < 0 && d.pending.len == 1 && b[d.pending.at] == '0')
            drained = run.count; /* the server counted nothing more pending after this one */
        prior = row->seq;
        run.count++;
        pos = start + total + 2;
    }
scanned:
    if (run.count == 0) {
        PyBuffer_Release(&buffer);
        result = PyLong_FromSsize_t(pos);
        goto done;
    }
    if (append_run(&c, &buffer, &run) < 0) /* releases the buffer */
        goto done;
    result = PyObject_CallFunction(h->callback, "OnOn", c.rows, c.first, header ? header : Py_None,
                                   drained >= 0 ? drained : run.count);
    if (result != NULL) {
        Py_DECREF(result);
        result = PyLong_FromSsize_t(pos);
    }
    goto done;

scan_error:
    PyBuffer_Release(&buffer);
done:
    Py_XDECREF(header);
    clear_columns(&c);
    PyMem_Free(run.rows);
    return result;
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
match_server_headers(const unsigned char *b, Py_ssize_t n, Py_ssize_t i, const Handler *h, Reply *r)
{
    Span last;
    Py_ssize_t j;

    if (!SKIP("Nats-Stream: ") || !skip(b, n, &i, h->stream_text, h->stream_len))
        return 0; /* another stream's reply (a mirror's) is not taken: the regex's escaped name */
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
        if (match_server_headers(b, n, i, h, r)) {
            r->own_end = i;
            return 1;
        }
        i += run_of(b, i, n, 0);
        if (!SKIP("\r\n"))
            return 0;
    }
}

/* direct_replies_handler_py's take(): the run of replies at `pos` onto the target's rows, then the callback; the
 * position after the run. */
static PyObject *
take_direct_replies(Handler *h, PyObject *buffer_object, Py_ssize_t pos)
{
    Columns c = {0};
    Run run = {0};
    Span pending = {0, 0};
    long long prior = -1;
    PyObject *pending_text = NULL, *result = NULL;
    Py_buffer buffer;
    Reply r;

    if (get_columns(h, &c) < 0 || PyObject_GetBuffer(buffer_object, &buffer, PyBUF_SIMPLE) < 0)
        goto done;
    const unsigned char *b = buffer.buf;
    Py_ssize_t size = buffer.len;

    while (pos < size && match_direct(b, size, pos, h, &r)) {
        Py_ssize_t total, header_size, own = r.own_end - r.start; /* "NATS/1.0\r\n" and its own lines: >= 10 */
        Row *row = next_row(&run);

        if (row == NULL)
            goto scan_error;
        TAKE(to_size(b, r.total, &total));
        TAKE(to_size(b, r.header_size, &header_size));
        if (header_size != r.header_end - r.start || total < header_size || total > size - r.start - 2 ||
            b[r.start + total] != '\r')
            break; /* sizes that disagree with the block (the per-message path reads by sizes), or not all here */
        TAKE(to_number(b, r.seq, &row->seq));
        if (row->seq <= prior)
            break;
        row->subject = r.subject;
        row->payload = (Span){r.header_end, r.start + total - r.header_end};
        row->time = r.stamp;
        row->stamp = 0;
        /* the message's own headers, what comes before the server's, ended by a blank line (empty: it had none) */
        int had = own > (Py_ssize_t)sizeof("NATS/1.0\r\n") - 1;
        row->header = (Span){r.start, had ? own : 0};
        row->header_tail = had ? 2 : 0;
        pending = r.pending;
        prior = row->seq;
        run.count++;
        pos = r.start + total + 2;
    }
scanned:
    if (run.count == 0) {
        PyBuffer_Release(&buffer);
        result = PyLong_FromSsize_t(pos);
        goto done;
    }
    if (pending.len > 0 &&
        (pending_text = PyBytes_FromStringAndSize((const char *)b + pending.at, pending.len)) == NULL)
        goto scan_error;
    if (append_run(&c, &buffer, &run) < 0) /* releases the buffer */
        goto done;
    result = PyObject_CallFunction(h->callback, "OnO", c.rows, c.first, pending_text ? pending_text : Py_None);
    if (result != NULL) {
        Py_DECREF(result);
        result = PyLong_FromSsize_t(pos);
    }
    goto done;

scan_error:
    PyBuffer_Release(&buffer);
done:
    Py_XDECREF(pending_text);
    clear_columns(&c);
    PyMem_Free(run.rows);
    return result;
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
    (void)view; /* the seam's: the pure twins slice it */
    if (h->callback == NULL || h->target == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a bulk handler without its target or callback");
        return NULL;
    }
    if (pos < 0) { /* outside the seam's contract: a position of a line in the buffer */
        PyErr_SetString(PyExc_ValueError, "a bulk handler's position must not be negative");
        return NULL;
    }
    if (h->kind == DELIVERIES)
        return take_deliveries(h, buffer_object, pos);
    return take_direct_replies(h, buffer_object, pos);
}

static int
handler_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(((Handler *)self)->target);
    Py_VISIT(((Handler *)self)->callback);
    Py_VISIT(((Handler *)self)->stream);
    Py_VISIT(Py_TYPE(self)); /* a heap type: its instances hold it */
    return 0;
}

static int
handler_clear(PyObject *self)
{
    Py_CLEAR(((Handler *)self)->target);
    Py_CLEAR(((Handler *)self)->callback);
    Py_CLEAR(((Handler *)self)->stream);
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
new_handler(int kind, long long sid, PyObject *stream, PyObject *target, PyObject *callback)
{
    allocfunc alloc = (allocfunc)PyType_GetSlot((PyTypeObject *)handler_type, Py_tp_alloc);
    Handler *h = (Handler *)alloc((PyTypeObject *)handler_type, 0);
    if (h == NULL)
        return NULL;
    h->kind = kind;
    h->sid_len = PyOS_snprintf(h->sid, sizeof(h->sid), "%lld", sid);
    h->target = Py_NewRef(target);
    h->callback = Py_NewRef(callback);
    if (stream != NULL) {
        char *text;
        h->stream = Py_NewRef(stream);
        if (PyBytes_AsStringAndSize(stream, &text, &h->stream_len) < 0) {
            Py_DECREF(h);
            return NULL;
        }
        h->stream_text = text;
    }
    return (PyObject *)h;
}

static PyObject *
deliveries_handler(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"sid", "target", "deliver", NULL};
    long long sid;
    PyObject *target, *callback;
    (void)module;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LOO:deliveries_handler", names, &sid, &target, &callback))
        return NULL;
    return new_handler(DELIVERIES, sid, NULL, target, callback);
}

static PyObject *
direct_replies_handler(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"sid", "stream", "target", "keep", NULL};
    long long sid;
    PyObject *stream, *target, *callback;
    (void)module;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LSOO:direct_replies_handler", names, &sid, &stream, &target,
                                     &callback))
        return NULL;
    return new_handler(DIRECT_REPLIES, sid, stream, target, callback);
}

static PyMethodDef methods[] = {
    {"deliveries_handler", (PyCFunction)(void (*)(void))deliveries_handler, METH_VARARGS | METH_KEYWORDS,
     "deliveries_handler(sid, target, deliver): protocol.deliveries_handler_py, compiled."},
    {"direct_replies_handler", (PyCFunction)(void (*)(void))direct_replies_handler, METH_VARARGS | METH_KEYWORDS,
     "direct_replies_handler(sid, stream, target, keep): protocol.direct_replies_handler_py, compiled."},
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
