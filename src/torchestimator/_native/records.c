/* torchestimator._native._records: the inner loop of TFRecord reading, and CRC32C.
 *
 * What belongs here: CRC32C (the SSE4.2 instruction where the CPU has it, three
 * streams at a time, a slicing-by-8 table otherwise), the masked CRC TensorFlow stores, and a block
 * scanner that slices whole records out of a buffer checking both CRCs. What
 * does not: reading files, compression, the length guard and every error
 * message; those stay in torchestimator/data/tfrecord.py, which calls `scan`
 * on blocks it has read (decompressed) and words what `scan` reports.
 *
 * scan(buffer, position, end, base, verify, limit) -> (offsets, records, position, status, detail)
 *   Records are sliced from buffer[position:end] until one cannot be handed out
 *   (buffer: any bytes-like object, e.g. the reader's reused bytearray):
 *   offsets[i] = base + start of record i in buffer, records[i] its data
 *   (bytes). The returned position is the start of the first record not
 *   handed out, and status says why it was not:
 *     NEED_HEADER     fewer than 12 bytes left (detail 0)
 *     NEED_RECORD     the header is there (and its CRC good) but not the whole
 *                     record: detail is its declared data length
 *     LENGTH_CRC_BAD  the length CRC does not match (detail 0)
 *     TOO_LARGE       the whole record is there but longer than limit (detail: its length)
 *     DATA_CRC_BAD    the data CRC does not match (detail: its length, so that
 *                     skip_corrupt can step over that one record)
 *   The checks run in the same order as the pure-Python loop in _tfrecord_scan.py,
 *   so both report the same record and the same kind of damage.
 *
 * find(buffer, position, end, limit) -> (position, status, detail)
 *   skip_corrupt's search after damaged framing: from position on, byte by
 *   byte, the first place in buffer[:end] where a whole record checks out
 *   (its length's masked CRC matches, length <= limit, and its data's masked
 *   CRC matches, so a header copied inside some record's data is passed by):
 *     FOUND           a record starts at position (detail: its length)
 *     NEED_RECORD     a header holds at position but its record reaches past
 *                     end (detail: its length): read on, or pass it by
 *     NEED_HEADER     none before position, where fewer than 12 bytes are left
 *   The same as _find_record_python, with the GIL released for large spans.
 *   The framing and CRCs are checked with the GIL released; the bytes objects
 *   are made afterwards (one copy of each record's data, no other work).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define HAVE_X86_CRC 1
#include <nmmintrin.h>
#endif

enum { NEED_HEADER = 0, NEED_RECORD = 1, LENGTH_CRC_BAD = 2, TOO_LARGE = 3, DATA_CRC_BAD = 4, FOUND = 5 };

#define HEADER_SIZE 12
#define FOOTER_SIZE 4
#define MASK_DELTA 0xA282EAD8u
/* Below this many bytes a scan keeps the GIL: releasing it costs more than the work. */
#define RELEASE_GIL_BYTES (64 * 1024)

/* ------------------------------------------------------------------ CRC32C */

static uint32_t crc_table[8][256];

static void build_table(void) {
    for (uint32_t byte = 0; byte < 256; byte++) {
        uint32_t crc = byte;
        for (int bit = 0; bit < 8; bit++) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
        crc_table[0][byte] = crc;
    }
    for (uint32_t byte = 0; byte < 256; byte++)
        for (int slice = 1; slice < 8; slice++)
            crc_table[slice][byte] = (crc_table[slice - 1][byte] >> 8) ^ crc_table[0][crc_table[slice - 1][byte] & 0xFF];
}

static inline uint64_t load_le64(const unsigned char *p) {
    uint64_t value;
    memcpy(&value, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    value = __builtin_bswap64(value);
#endif
    return value;
}

static inline uint32_t load_le32(const unsigned char *p) {
    uint32_t value;
    memcpy(&value, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    value = __builtin_bswap32(value);
#endif
    return value;
}

/* `crc` and the result are the plain (not inverted) CRC, as crc32c(data, crc) in google_crc32c. */
static uint32_t crc32c_table(uint32_t crc, const unsigned char *data, size_t size) {
    crc = ~crc;
    while (size && ((uintptr_t)data & 7)) { crc = (crc >> 8) ^ crc_table[0][(crc ^ *data++) & 0xFF]; size--; }
    while (size >= 8) {
        uint64_t word = load_le64(data) ^ crc;
        crc = crc_table[7][word & 0xFF] ^ crc_table[6][(word >> 8) & 0xFF] ^ crc_table[5][(word >> 16) & 0xFF]
            ^ crc_table[4][(word >> 24) & 0xFF] ^ crc_table[3][(word >> 32) & 0xFF]
            ^ crc_table[2][(word >> 40) & 0xFF] ^ crc_table[1][(word >> 48) & 0xFF] ^ crc_table[0][word >> 56];
        data += 8;
        size -= 8;
    }
    while (size--) crc = (crc >> 8) ^ crc_table[0][(crc ^ *data++) & 0xFF];
    return ~crc;
}

#ifdef HAVE_X86_CRC
/* The instruction has a latency of 3 cycles and a throughput of 1 per cycle, so three independent
 * streams over three adjacent stretches run about 3x faster than one; their CRCs are then joined by
 * shifting a CRC over a stretch of zeros (a linear map, applied by table: shift_long, shift_short). */
#define LONG_STRETCH 8192
#define SHORT_STRETCH 256
static uint32_t shift_long[4][256], shift_short[4][256];

static uint32_t gf2_times(const uint32_t *matrix, uint32_t vector) {
    uint32_t sum = 0;
    for (; vector; vector >>= 1, matrix++)
        if (vector & 1) sum ^= *matrix;
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *matrix) {
    for (int n = 0; n < 32; n++) square[n] = gf2_times(matrix, matrix[n]);
}

/* The matrix that runs the CRC register over `size` zero bytes (`size` a power of two). */
static void zeros_operator(uint32_t *even, size_t size) {
    uint32_t odd[32];
    odd[0] = 0x82F63B78u; /* one zero bit: the register shifts right, the polynomial comes in */
    for (int n = 1; n < 32; n++) odd[n] = 1u << (n - 1);
    gf2_square(even, odd); /* two bits */
    gf2_square(odd, even); /* four bits */
    for (;;) {
        gf2_square(even, odd); /* 8, 32, ... bits */
        size >>= 1;
        if (size == 0) return;
        gf2_square(odd, even); /* 16, 64, ... bits */
        size >>= 1;
        if (size == 0) break;
    }
    memcpy(even, odd, sizeof(odd));
}

static void build_shift(uint32_t table[4][256], size_t size) {
    uint32_t matrix[32];
    zeros_operator(matrix, size);
    for (uint32_t n = 0; n < 256; n++)
        for (int slice = 0; slice < 4; slice++) table[slice][n] = gf2_times(matrix, n << (8 * slice));
}

static inline uint32_t shift(uint32_t table[4][256], uint32_t crc) {
    return table[0][crc & 0xFF] ^ table[1][(crc >> 8) & 0xFF] ^ table[2][(crc >> 16) & 0xFF] ^ table[3][crc >> 24];
}

#if defined(__x86_64__)
#define STRETCHES(stretch, table)                                                                    \
    while (size >= 3 * (stretch)) {                                                                  \
        uint64_t one = crc, two = 0, three = 0;                                                      \
        for (const unsigned char *stop = data + (stretch); data < stop; data += 8) {                 \
            one = _mm_crc32_u64(one, load_le64(data));                                               \
            two = _mm_crc32_u64(two, load_le64(data + (stretch)));                                   \
            three = _mm_crc32_u64(three, load_le64(data + 2 * (stretch)));                           \
        }                                                                                            \
        crc = shift(table, shift(table, (uint32_t)one) ^ (uint32_t)two) ^ (uint32_t)three;           \
        data += 2 * (stretch);                                                                       \
        size -= 3 * (stretch);                                                                       \
    }
#endif

__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const unsigned char *data, size_t size) {
    crc = ~crc;
#if defined(__x86_64__)
    while (size && ((uintptr_t)data & 7)) { crc = _mm_crc32_u8(crc, *data++); size--; }
    STRETCHES(LONG_STRETCH, shift_long)
    STRETCHES(SHORT_STRETCH, shift_short)
    uint64_t wide = crc;
    while (size >= 8) { wide = _mm_crc32_u64(wide, load_le64(data)); data += 8; size -= 8; }
    crc = (uint32_t)wide;
#endif
    while (size >= 4) { crc = _mm_crc32_u32(crc, load_le32(data)); data += 4; size -= 4; }
    while (size--) crc = _mm_crc32_u8(crc, *data++);
    return ~crc;
}
#endif

static uint32_t (*crc32c_extend)(uint32_t, const unsigned char *, size_t) = crc32c_table;
static const char *crc32c_method = "table (slicing-by-8)";

static inline uint32_t mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + MASK_DELTA; }

/* ------------------------------------------------------------------ the block scanner */

typedef struct {
    Py_ssize_t position; /* start of the first record not handed out */
    Py_ssize_t count;    /* records handed out */
    int status;
    uint64_t detail;
} ScanResult;

/* Walks the records of data[position:size]; pure C (runs without the GIL). */
static ScanResult scan_framing(const unsigned char *data, Py_ssize_t size, Py_ssize_t position, int verify,
                               uint64_t limit) {
    ScanResult result = {position, 0, NEED_HEADER, 0};
    while (size - position >= HEADER_SIZE) {
        const unsigned char *header = data + position;
        uint64_t length = load_le64(header);
        if (verify && mask_crc(crc32c_extend(0, header, 8)) != load_le32(header + 8)) {
            result.status = LENGTH_CRC_BAD;
            break;
        }
        uint64_t room = (uint64_t)(size - position - HEADER_SIZE); /* bytes after the header */
        if (room < FOOTER_SIZE || length > room - FOOTER_SIZE) {
            result.status = NEED_RECORD;
            result.detail = length;
            break;
        }
        if (length > limit) {
            result.status = TOO_LARGE;
            result.detail = length;
            break;
        }
        const unsigned char *record = header + HEADER_SIZE;
        if (verify && mask_crc(crc32c_extend(0, record, (size_t)length)) != load_le32(record + length)) {
            result.status = DATA_CRC_BAD;
            result.detail = length;
            break;
        }
        position += HEADER_SIZE + (Py_ssize_t)length + FOOTER_SIZE;
        result.count++;
    }
    result.position = position;
    return result;
}

/* The offsets and bytes of the `count` good records from `position` (already checked by scan_framing). */
static int collect(const unsigned char *data, Py_ssize_t position, Py_ssize_t count, long long base,
                   PyObject **offsets_out, PyObject **records_out) {
    PyObject *offsets = PyList_New(count), *records = PyList_New(count);
    if (offsets == NULL || records == NULL) goto fail;
    for (Py_ssize_t index = 0; index < count; index++) {
        Py_ssize_t length = (Py_ssize_t)load_le64(data + position);
        PyObject *offset = PyLong_FromLongLong(base + position);
        if (offset == NULL) goto fail;
        PyList_SET_ITEM(offsets, index, offset);
        PyObject *record = PyBytes_FromStringAndSize((const char *)data + position + HEADER_SIZE, length);
        if (record == NULL) goto fail;
        PyList_SET_ITEM(records, index, record);
        position += HEADER_SIZE + length + FOOTER_SIZE;
    }
    *offsets_out = offsets;
    *records_out = records;
    return 0;
fail:
    Py_XDECREF(offsets);
    Py_XDECREF(records);
    return -1;
}

static PyObject *records_scan(PyObject *module, PyObject *args) {
    Py_buffer buffer;
    Py_ssize_t position, end;
    long long base;
    int verify;
    unsigned long long limit;
    if (!PyArg_ParseTuple(args, "y*nnLpK:scan", &buffer, &position, &end, &base, &verify, &limit)) return NULL;
    if (end < 0 || end > buffer.len || position < 0 || position > end) {
        PyErr_Format(PyExc_ValueError, "scan: position %zd and end %zd must satisfy 0 <= position <= end <= %zd "
                     "(the buffer's size)", position, end, buffer.len);
        PyBuffer_Release(&buffer);
        return NULL;
    }
    const unsigned char *data = buffer.buf;
    ScanResult result;
    if (end - position >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        result = scan_framing(data, end, position, verify, limit);
        Py_END_ALLOW_THREADS
    } else {
        result = scan_framing(data, end, position, verify, limit);
    }
    PyObject *offsets, *records, *answer = NULL;
    if (collect(data, position, result.count, base, &offsets, &records) == 0) {
        answer = Py_BuildValue("(NNniK)", offsets, records, result.position, result.status,
                               (unsigned long long)result.detail);
    }
    PyBuffer_Release(&buffer);
    return answer;
}

/* The search of find(); pure C (runs without the GIL). */
static ScanResult find_framing(const unsigned char *data, Py_ssize_t size, Py_ssize_t position, uint64_t limit) {
    ScanResult result = {position, 0, NEED_HEADER, 0};
    for (; size - position >= HEADER_SIZE; position++) {
        const unsigned char *header = data + position;
        uint64_t length = load_le64(header);
        if (length > limit || mask_crc(crc32c_extend(0, header, 8)) != load_le32(header + 8)) continue;
        uint64_t room = (uint64_t)(size - position - HEADER_SIZE);
        if (room < FOOTER_SIZE || length > room - FOOTER_SIZE) {
            result.status = NEED_RECORD;
            result.detail = length;
            break;
        }
        const unsigned char *record = header + HEADER_SIZE;
        if (mask_crc(crc32c_extend(0, record, (size_t)length)) == load_le32(record + length)) {
            result.status = FOUND;
            result.detail = length;
            break;
        }
    }
    result.position = position;
    return result;
}

static PyObject *records_find(PyObject *module, PyObject *args) {
    Py_buffer buffer;
    Py_ssize_t position, end;
    unsigned long long limit;
    if (!PyArg_ParseTuple(args, "y*nnK:find", &buffer, &position, &end, &limit)) return NULL;
    if (end < 0 || end > buffer.len || position < 0 || position > end) {
        PyErr_Format(PyExc_ValueError, "find: position %zd and end %zd must satisfy 0 <= position <= end <= %zd "
                     "(the buffer's size)", position, end, buffer.len);
        PyBuffer_Release(&buffer);
        return NULL;
    }
    ScanResult result;
    if (end - position >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        result = find_framing(buffer.buf, end, position, limit);
        Py_END_ALLOW_THREADS
    } else {
        result = find_framing(buffer.buf, end, position, limit);
    }
    PyBuffer_Release(&buffer);
    return Py_BuildValue("(niK)", result.position, result.status, (unsigned long long)result.detail);
}

/* ------------------------------------------------------------------ CRC functions for Python */

static PyObject *records_crc32c(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"data", "crc", NULL};
    Py_buffer buffer;
    unsigned long crc = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*|k:crc32c", keywords, &buffer, &crc)) return NULL;
    uint32_t value;
    if (buffer.len >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        value = crc32c_extend((uint32_t)crc, buffer.buf, (size_t)buffer.len);
        Py_END_ALLOW_THREADS
    } else {
        value = crc32c_extend((uint32_t)crc, buffer.buf, (size_t)buffer.len);
    }
    PyBuffer_Release(&buffer);
    return PyLong_FromUnsignedLong(value);
}

/* crc32c_table(data, crc=0): the slicing-by-8 method whatever the CPU, so tests check the fallback too. */
static PyObject *records_crc32c_table(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"data", "crc", NULL};
    Py_buffer buffer;
    unsigned long crc = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*|k:crc32c_table", keywords, &buffer, &crc)) return NULL;
    uint32_t value = crc32c_table((uint32_t)crc, buffer.buf, (size_t)buffer.len);
    PyBuffer_Release(&buffer);
    return PyLong_FromUnsignedLong(value);
}

static PyObject *records_masked_crc32c(PyObject *module, PyObject *arg) {
    Py_buffer buffer;
    if (PyObject_GetBuffer(arg, &buffer, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t value = mask_crc(crc32c_extend(0, buffer.buf, (size_t)buffer.len));
    PyBuffer_Release(&buffer);
    return PyLong_FromUnsignedLong(value);
}

/* frame(data) -> bytes: one whole record as TFRecordWriter writes it (length, its CRC, data, data CRC). */
static PyObject *records_frame(PyObject *module, PyObject *arg) {
    Py_buffer buffer;
    if (PyObject_GetBuffer(arg, &buffer, PyBUF_SIMPLE) < 0) return NULL;
    uint64_t length = (uint64_t)buffer.len;
    PyObject *framed = PyBytes_FromStringAndSize(NULL, buffer.len + HEADER_SIZE + FOOTER_SIZE);
    if (framed != NULL) {
        unsigned char *out = (unsigned char *)PyBytes_AS_STRING(framed);
        for (int index = 0; index < 8; index++) out[index] = (unsigned char)(length >> (8 * index));
        uint32_t crcs[2] = {mask_crc(crc32c_extend(0, out, 8)),
                            mask_crc(crc32c_extend(0, buffer.buf, (size_t)buffer.len))};
        memcpy(out + HEADER_SIZE, buffer.buf, (size_t)buffer.len);
        for (int index = 0; index < 4; index++) {
            out[8 + index] = (unsigned char)(crcs[0] >> (8 * index));
            out[HEADER_SIZE + buffer.len + index] = (unsigned char)(crcs[1] >> (8 * index));
        }
    }
    PyBuffer_Release(&buffer);
    return framed;
}

static PyMethodDef records_methods[] = {
    {"scan", records_scan, METH_VARARGS,
     "scan(buffer, position, end, base, verify, limit) -> (offsets, records, position, status, detail)\n\n"
     "Slices whole TFRecord records out of buffer[position:end]; see the module source for the statuses."},
    {"find", records_find, METH_VARARGS,
     "find(buffer, position, end, limit) -> (position, status, detail)\n\n"
     "The next place in buffer[position:end] where a whole record checks out (both CRCs), for skip_corrupt."},
    {"crc32c", (PyCFunction)(void (*)(void))records_crc32c, METH_VARARGS | METH_KEYWORDS,
     "crc32c(data, crc=0) -> int: the CRC32C of data, continuing from crc (as google_crc32c.extend)."},
    {"crc32c_table", (PyCFunction)(void (*)(void))records_crc32c_table, METH_VARARGS | METH_KEYWORDS,
     "crc32c_table(data, crc=0) -> int: crc32c by the slicing-by-8 table (the fallback), whatever the CPU."},
    {"masked_crc32c", records_masked_crc32c, METH_O, "masked_crc32c(data) -> int: TensorFlow's masked CRC32C."},
    {"frame", records_frame, METH_O, "frame(data) -> bytes: the framed record (header, data, data CRC)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef records_module = {
    PyModuleDef_HEAD_INIT, "_records", "The compiled inner loop of TFRecord reading, and CRC32C.", -1,
    records_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__records(void) {
    build_table();
#ifdef HAVE_X86_CRC
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        build_shift(shift_long, LONG_STRETCH);
        build_shift(shift_short, SHORT_STRETCH);
        crc32c_extend = crc32c_sse42;
        crc32c_method = "SSE4.2";
    }
#endif
    PyObject *module = PyModule_Create(&records_module);
    if (module == NULL) return NULL;
    if (PyModule_AddStringConstant(module, "CRC32C_METHOD", crc32c_method) < 0
        || PyModule_AddIntConstant(module, "NEED_HEADER", NEED_HEADER) < 0
        || PyModule_AddIntConstant(module, "NEED_RECORD", NEED_RECORD) < 0
        || PyModule_AddIntConstant(module, "LENGTH_CRC_BAD", LENGTH_CRC_BAD) < 0
        || PyModule_AddIntConstant(module, "TOO_LARGE", TOO_LARGE) < 0
        || PyModule_AddIntConstant(module, "DATA_CRC_BAD", DATA_CRC_BAD) < 0
        || PyModule_AddIntConstant(module, "FOUND", FOUND) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
