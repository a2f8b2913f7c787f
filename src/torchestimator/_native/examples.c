/* Batched tf.train.Example parsing: the compiled half of data/parsing.py's parse_example.
 *
 * One call parses a whole batch of serialized Examples against a compiled spec and fills, per
 * requested feature, either a caller-allocated numpy buffer (FixedLen int64/float) or buffers
 * this module returns (values as a bytearray or a list of bytes, and row lengths as a bytearray
 * of int64). No numpy headers: Python allocates and wraps.
 *
 * The rule that keeps both paths identical: this pass never words an error. Anything that is
 * not the plain, well-formed case (a missing required feature, a wrong kind or count, bytes
 * that are not an Example, a record that is not bytes, a map entry with a repeated or unknown
 * field, a Feature with a repeated kind field, a requested key repeated with a later Feature() that
 * has no list, a non-ASCII key, groups, odd wire types) makes the call return the index of that
 * record ("bail"), and parsing.py runs its pure-Python parser on the batch, which raises its
 * own exact error, or returns its own result where protobuf accepts what this pass refused.
 * So this pass may refuse more than protobuf does; it must never accept bytes that protobuf
 * refuses (hence every map entry is validated, requested or not) nor read them differently.
 *
 * Wire format (tensorflow/core/example/{example,feature}.proto, proto3):
 *   Example { Features features = 1; }      Features { map<string, Feature> feature = 1; }
 *   Feature { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
 *   BytesList { repeated bytes value = 1; }  FloatList { repeated float value = 1 [packed]; }
 *   Int64List { repeated int64 value = 1 [packed]; }
 * Repeated scalars may come packed or unpacked (and mixed); a repeated embedded message field
 * merges (so map entries of several `features` fields all count); a repeated map key: the last
 * entry wins, except where TF's parsers read an earlier copy (see read_entries). Int64 varints
 * are two's complement (negatives take 10 bytes).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { KIND_BYTES = 1, KIND_FLOAT = 2, KIND_INT64 = 3 };
enum { WT_VARINT = 0, WT_FIXED64 = 1, WT_LEN = 2, WT_FIXED32 = 5 };
#define BAIL (-1)
#define NOMEM (-2)

typedef struct { const uint8_t *p, *end; } Span;

/* ------------------------------------------------------------------ wire primitives */

static inline int read_varint(Span *s, uint64_t *out) {
    if (s->p < s->end && *s->p < 0x80) { *out = *s->p++; return 0; } /* most tags and lengths: one byte */
    uint64_t value = 0;
    for (int i = 0; i < 10; i++) {
        if (s->p >= s->end) return BAIL;
        uint8_t byte = *s->p++;
        if (i == 9 && byte > 1) return BAIL; /* beyond 64 bits: let protobuf decide */
        value |= (uint64_t)(byte & 0x7f) << (7 * i);
        if (!(byte & 0x80)) { *out = value; return 0; }
    }
    return BAIL;
}

/* The next field's number and wire type; BAIL at field 0, groups and invalid wire types. */
static inline int read_tag(Span *s, uint32_t *field, int *wire_type) {
    uint64_t tag;
    const uint8_t *start = s->p;
    /* a tag takes at most 5 bytes in protobuf's decoders; an overlong one is left to them */
    if (read_varint(s, &tag) || tag > 0xffffffffu || s->p - start > 5) return BAIL;
    *field = (uint32_t)(tag >> 3);
    *wire_type = (int)(tag & 7);
    if (*field == 0 || (*wire_type != WT_VARINT && *wire_type != WT_FIXED64 && *wire_type != WT_LEN &&
                        *wire_type != WT_FIXED32)) return BAIL;
    return 0;
}

static inline int read_length_delimited(Span *s, Span *inner) {
    uint64_t length;
    const uint8_t *start = s->p;
    /* protobuf refuses a length written in more than 5 bytes ("wire format was corrupt"): so do we,
       by leaving the record to the pure path, which words protobuf's error */
    if (read_varint(s, &length) || s->p - start > 5 || length > (uint64_t)(s->end - s->p)) return BAIL;
    inner->p = s->p;
    inner->end = s->p + length;
    s->p += length;
    return 0;
}

static int skip_field(Span *s, int wire_type) {
    uint64_t ignored;
    Span inner;
    switch (wire_type) {
    case WT_VARINT: return read_varint(s, &ignored);
    case WT_LEN: return read_length_delimited(s, &inner);
    case WT_FIXED64: if (s->end - s->p < 8) return BAIL; s->p += 8; return 0;
    case WT_FIXED32: if (s->end - s->p < 4) return BAIL; s->p += 4; return 0;
    default: return BAIL;
    }
}

/* ------------------------------------------------------------------ output sinks */

/* A feature's values: a byte buffer (numeric kinds) or a list (bytes kind). A fixed-length
 * numeric sink writes into the caller's array at one record's window and refuses to overflow. */
typedef struct {
    char *data;
    Py_ssize_t length, capacity;
    int growable;
    PyObject *list;
} Sink;

static int sink_reserve(Sink *sink, Py_ssize_t extra) {
    if (sink->length + extra <= sink->capacity) return 0;
    if (!sink->growable) return BAIL; /* more values than the FixedLen shape holds */
    Py_ssize_t capacity = sink->capacity ? sink->capacity : 256;
    while (capacity < sink->length + extra) capacity *= 2;
    char *data = realloc(sink->data, (size_t)capacity);
    if (!data) return NOMEM;
    sink->data = data;
    sink->capacity = capacity;
    return 0;
}

static int sink_append(Sink *sink, const void *bytes, Py_ssize_t size) {
    if (size == 0) return 0; /* memcpy from/to NULL is undefined even for 0 bytes (an empty list, no buffer yet) */
    int status = sink_reserve(sink, size);
    if (status) return status;
    memcpy(sink->data + sink->length, bytes, (size_t)size);
    sink->length += size;
    return 0;
}

static int sink_append_object(Sink *sink, PyObject *item) { /* steals nothing; the list takes a reference */
    return PyList_Append(sink->list, item) ? NOMEM : 0;
}

/* ------------------------------------------------------------------ lists */

static int append_int64(Span *s, Sink *sink) { /* two's complement, as TF writes int64 (not zigzag) */
    uint64_t value;
    if (read_varint(s, &value)) return BAIL;
    int64_t signed_value = (int64_t)value;
    return sink ? sink_append(sink, &signed_value, 8) : 0;
}

/* Walks one BytesList/FloatList/Int64List; with a sink, appends its values there and counts
 * them; without one, only checks that protobuf would accept it. */
static int walk_list(int kind, Span list, Sink *sink, Py_ssize_t *count) {
    uint32_t field;
    int wire_type, status;
    while (list.p < list.end) {
        if (read_tag(&list, &field, &wire_type)) return BAIL;
        if (field != 1) { if (skip_field(&list, wire_type)) return BAIL; continue; }
        if (kind == KIND_BYTES) {
            Span value;
            if (wire_type != WT_LEN || read_length_delimited(&list, &value)) return BAIL;
            (*count)++;
            if (sink) {
                PyObject *item = PyBytes_FromStringAndSize((const char *)value.p, value.end - value.p);
                if (!item) return NOMEM;
                status = sink_append_object(sink, item);
                Py_DECREF(item);
                if (status) return status;
            }
        } else if (kind == KIND_FLOAT && wire_type == WT_FIXED32) {
            if (list.end - list.p < 4) return BAIL;
            if (sink && (status = sink_append(sink, list.p, 4))) return status;
            list.p += 4;
            (*count)++;
        } else if (kind == KIND_FLOAT && wire_type == WT_LEN) {
            Span packed;
            if (read_length_delimited(&list, &packed) || (packed.end - packed.p) % 4) return BAIL;
            if (sink && (status = sink_append(sink, packed.p, packed.end - packed.p))) return status;
            *count += (packed.end - packed.p) / 4;
        } else if (kind == KIND_INT64 && wire_type == WT_VARINT) {
            if ((status = append_int64(&list, sink))) return status;
            (*count)++;
        } else if (kind == KIND_INT64 && wire_type == WT_LEN) {
            Span packed;
            if (read_length_delimited(&list, &packed)) return BAIL;
            if (sink) { /* at most one value per byte: make room once, then write in place */
                Py_ssize_t most = (packed.end - packed.p) * 8, room = sink->capacity - sink->length;
                if ((status = sink_reserve(sink, most < room || !sink->growable ? 0 : most))) return status;
            }
            while (packed.p < packed.end) {
                uint64_t value;
                if (read_varint(&packed, &value)) return BAIL;
                if (sink) {
                    if (sink->length + 8 > sink->capacity) return BAIL; /* more values than the FixedLen shape */
                    int64_t signed_value = (int64_t)value; /* two's complement, as TF writes int64 */
                    memcpy(sink->data + sink->length, &signed_value, 8);
                    sink->length += 8;
                }
                (*count)++;
            }
        } else {
            return BAIL; /* field 1 with a wire type protobuf might read as unknown: not ours to guess */
        }
    }
    return 0;
}

/* A Feature's kind (0: no list set) and its list; BAIL when a kind field repeats (protobuf
 * merges or switches the oneof) or the Feature is malformed. */
static int read_feature(Span feature, int *kind, Span *list) {
    uint32_t field;
    int wire_type;
    *kind = 0;
    while (feature.p < feature.end) {
        if (read_tag(&feature, &field, &wire_type)) return BAIL;
        if (field >= 1 && field <= 3) {
            if (wire_type != WT_LEN || *kind || read_length_delimited(&feature, list)) return BAIL;
            *kind = (int)field;
        } else if (skip_field(&feature, wire_type)) {
            return BAIL;
        }
    }
    return 0;
}

static int validate_feature(Span feature) {
    int kind;
    Span list;
    Py_ssize_t count = 0;
    if (read_feature(feature, &kind, &list)) return BAIL;
    return kind ? walk_list(kind, list, NULL, &count) : 0;
}

/* Whether a (valid) Feature has a list set; a malformed one counts as not. */
static int has_list(Span feature) {
    int kind;
    Span list;
    return read_feature(feature, &kind, &list) == 0 && kind != 0;
}

/* ------------------------------------------------------------------ the compiled spec */

typedef struct {
    const char *key;
    Py_ssize_t key_length;
    Span value;
    int present;
} Slot;

typedef struct {
    Py_ssize_t slot, size;
    int kind, fixed, sparse; /* sparse: also the SparseValue's indices, built from lengths at the end */
    Py_buffer out;       /* FixedLen numeric: the caller's [B * size] array */
    int has_out;
    const char *fill;    /* FixedLen numeric default: size values, or NULL (required) */
    PyObject *fill_list; /* FixedLen bytes default: a tuple of size bytes, or NULL */
    Sink values, lengths;
} Spec;

typedef struct {
    Slot *slots;
    Py_ssize_t slot_count;
    int32_t *table; /* open addressing over the slots' keys; -1 empty */
    size_t table_mask;
    Spec *specs;
    Py_ssize_t spec_count;
} Plan;

static uint64_t hash_key(const char *key, Py_ssize_t length) { /* FNV-1a */
    uint64_t hash = 1469598103934665603ull;
    for (Py_ssize_t i = 0; i < length; i++) hash = (hash ^ (uint8_t)key[i]) * 1099511628211ull;
    return hash;
}

static Slot *find_slot(Plan *plan, const char *key, Py_ssize_t length) {
    for (size_t at = hash_key(key, length) & plan->table_mask;; at = (at + 1) & plan->table_mask) {
        int32_t index = plan->table[at];
        if (index < 0) return NULL;
        Slot *slot = &plan->slots[index];
        if (slot->key_length == length && memcmp(slot->key, key, (size_t)length) == 0) return slot;
    }
}

static void plan_free(Plan *plan) {
    for (Py_ssize_t i = 0; i < plan->spec_count; i++) {
        Spec *spec = &plan->specs[i];
        if (spec->has_out) PyBuffer_Release(&spec->out);
        free(spec->values.data);
        free(spec->lengths.data);
        Py_XDECREF(spec->values.list);
    }
    free(plan->specs);
    free(plan->slots);
    free(plan->table);
}

static int plan_keys(Plan *plan, PyObject *keys) {
    plan->slot_count = PyTuple_GET_SIZE(keys);
    size_t table_size = 8;
    while (table_size < 2 * (size_t)plan->slot_count + 1) table_size *= 2;
    plan->slots = calloc((size_t)plan->slot_count + 1, sizeof(Slot));
    plan->table = malloc(table_size * sizeof(int32_t));
    if (!plan->slots || !plan->table) { PyErr_NoMemory(); return -1; }
    memset(plan->table, 0xff, table_size * sizeof(int32_t));
    plan->table_mask = table_size - 1;
    for (Py_ssize_t i = 0; i < plan->slot_count; i++) {
        char *key;
        Py_ssize_t length;
        if (PyBytes_AsStringAndSize(PyTuple_GET_ITEM(keys, i), &key, &length)) return -1;
        if (find_slot(plan, key, length)) { PyErr_SetString(PyExc_ValueError, "_examples: duplicate key"); return -1; }
        size_t at = hash_key(key, length) & plan->table_mask;
        while (plan->table[at] >= 0) at = (at + 1) & plan->table_mask;
        plan->table[at] = (int32_t)i;
        plan->slots[i].key = key;
        plan->slots[i].key_length = length;
    }
    return 0;
}

/* One spec tuple: (slot, kind, mode, size, out, default); see parse_examples' docstring. */
static int plan_spec(Plan *plan, Spec *spec, PyObject *item, Py_ssize_t batch) {
    PyObject *out, *fill;
    int mode;
    if (!PyArg_ParseTuple(item, "niinOO", &spec->slot, &spec->kind, &mode, &spec->size, &out, &fill)) return -1;
    spec->fixed = mode == 1;
    spec->sparse = mode == 2;
    if (spec->slot < 0 || spec->slot >= plan->slot_count || spec->kind < KIND_BYTES || spec->kind > KIND_INT64 ||
        spec->size < 0 || mode < 0 || mode > 2) {
        PyErr_SetString(PyExc_ValueError, "_examples: spec out of range");
        return -1;
    }
    Py_ssize_t itemsize = spec->kind == KIND_FLOAT ? 4 : 8;
    if (spec->kind == KIND_BYTES) {
        if (!(spec->values.list = PyList_New(0))) return -1;
        if (fill != Py_None) {
            if (!PyTuple_Check(fill) || PyTuple_GET_SIZE(fill) != spec->size) {
                PyErr_SetString(PyExc_TypeError, "_examples: a bytes default must be a tuple of size bytes");
                return -1;
            }
            spec->fill_list = fill;
        }
    } else if (spec->fixed) {
        if (PyObject_GetBuffer(out, &spec->out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)) return -1;
        spec->has_out = 1;
        if (spec->out.len != batch * spec->size * itemsize) {
            PyErr_SetString(PyExc_ValueError, "_examples: output buffer of the wrong size");
            return -1;
        }
        if (fill != Py_None) {
            if (!PyBytes_Check(fill) || PyBytes_GET_SIZE(fill) != spec->size * itemsize) {
                PyErr_SetString(PyExc_TypeError, "_examples: a numeric default must be bytes of size values");
                return -1;
            }
            spec->fill = PyBytes_AS_STRING(fill);
        }
    } else {
        spec->values.growable = 1;
    }
    if (!spec->fixed) {
        spec->lengths.growable = 1;
        if (sink_reserve(&spec->lengths, batch * 8)) { PyErr_NoMemory(); return -1; }
    }
    return 0;
}

static int plan_build(Plan *plan, PyObject *keys, PyObject *specs, Py_ssize_t batch) {
    if (plan_keys(plan, keys)) return -1;
    Py_ssize_t count = PyTuple_GET_SIZE(specs);
    plan->specs = calloc((size_t)count + 1, sizeof(Spec));
    if (!plan->specs) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < count; i++) {
        plan->spec_count = i + 1; /* so plan_free releases what this one acquired, even half-built */
        if (plan_spec(plan, &plan->specs[i], PyTuple_GET_ITEM(specs, i), batch)) return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ one record */

/* Fills the plan's slots from one record's map entries; validates every entry's Feature
 * (requested ones when they are read, superseded ones when replaced, the others here). */
static int read_entries(Plan *plan, Span features) {
    uint32_t field;
    int wire_type;
    while (features.p < features.end) {
        if (read_tag(&features, &field, &wire_type)) return BAIL;
        if (field != 1) { if (skip_field(&features, wire_type)) return BAIL; continue; }
        static const uint8_t empty[1] = {0};
        Span entry, key = {empty, empty}, value = {empty, empty}; /* absent: "" and Feature() */
        int has_key = 0, has_value = 0;
        if (wire_type != WT_LEN || read_length_delimited(&features, &entry)) return BAIL;
        while (entry.p < entry.end) {
            uint32_t entry_field;
            if (read_tag(&entry, &entry_field, &wire_type)) return BAIL;
            if (entry_field == 1 || entry_field == 2) {
                int *seen = entry_field == 1 ? &has_key : &has_value;
                if (wire_type != WT_LEN || *seen ||
                    read_length_delimited(&entry, entry_field == 1 ? &key : &value)) return BAIL;
                *seen = 1;
            } else {
                return BAIL; /* upb drops a map entry holding an unknown field (to the unknown fields) */
            }
        }
        for (const uint8_t *c = key.p; c < key.end; c++)
            if (*c >= 0x80) return BAIL; /* proto3 checks UTF-8; leave that to protobuf */
        Slot *slot = find_slot(plan, (const char *)key.p, key.end - key.p);
        if (!slot) { if (validate_feature(value)) return BAIL; continue; }
        /* A key present twice (Examples' bytes concatenated, or one map holding it twice): protobuf keeps
           the last copy, and so do TF's parsers unless that copy is a Feature() with no list, which they
           (but the batched one for VarLen/Ragged) skip for an earlier copy: Python reads those records. */
        if (slot->present && (validate_feature(slot->value) || !has_list(value))) return BAIL;
        slot->value = value;
        slot->present = 1;
    }
    return 0;
}

static int read_example(Plan *plan, Span record) {
    uint32_t field;
    int wire_type;
    while (record.p < record.end) {
        if (read_tag(&record, &field, &wire_type)) return BAIL;
        if (field != 1) { if (skip_field(&record, wire_type)) return BAIL; continue; }
        Span features;
        if (wire_type != WT_LEN || read_length_delimited(&record, &features)) return BAIL;
        int status = read_entries(plan, features);
        if (status) return status;
    }
    return 0;
}

static int fill_default(Spec *spec, Py_ssize_t itemsize) {
    if (spec->kind == KIND_BYTES) {
        if (!spec->fill_list) return BAIL; /* required: Python words the error */
        for (Py_ssize_t i = 0; i < spec->size; i++) {
            int status = sink_append_object(&spec->values, PyTuple_GET_ITEM(spec->fill_list, i));
            if (status) return status;
        }
        return 0;
    }
    if (!spec->fill) return BAIL;
    return sink_append(&spec->values, spec->fill, spec->size * itemsize);
}

static int read_spec(Plan *plan, Spec *spec, Py_ssize_t record) {
    Slot *slot = &plan->slots[spec->slot];
    Py_ssize_t itemsize = spec->kind == KIND_FLOAT ? 4 : 8, count = 0;
    int kind = 0, status;
    Span list;
    if (spec->fixed && spec->kind != KIND_BYTES) { /* this record's window of the caller's array */
        spec->values.data = (char *)spec->out.buf + record * spec->size * itemsize;
        spec->values.length = 0;
        spec->values.capacity = spec->size * itemsize;
    }
    if (slot->present && read_feature(slot->value, &kind, &list)) return BAIL;
    if (kind && kind != spec->kind) return BAIL; /* wrong kind: an error Python words */
    if (kind && (status = walk_list(kind, list, &spec->values, &count))) return status;
    if (spec->fixed) {
        if (!kind) return fill_default(spec, itemsize);
        return count == spec->size ? 0 : BAIL; /* a wrong count: an error Python words */
    }
    int64_t length = count;
    return sink_append(&spec->lengths, &length, 8);
}

/* A memoryview of plain contiguous bytes (as a block reader may hand out); any other is left to
 * Python (released, strided, or of another format), as is every other type but bytes/bytearray. */
static int memoryview_bytes(PyObject *item, Py_buffer *view) {
    if (PyObject_GetBuffer(item, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS)) { PyErr_Clear(); return BAIL; }
    if (view->itemsize == 1 && view->format && strcmp(view->format, "B") == 0) return 0;
    PyBuffer_Release(view);
    return BAIL;
}

static int read_record(Plan *plan, PyObject *item, Py_ssize_t record) {
    Span span;
    Py_buffer view = {0};
    int has_view = 0;
    if (PyBytes_Check(item)) {
        span.p = (const uint8_t *)PyBytes_AS_STRING(item);
        span.end = span.p + PyBytes_GET_SIZE(item);
    } else if (PyByteArray_Check(item)) {
        span.p = (const uint8_t *)PyByteArray_AS_STRING(item);
        span.end = span.p + PyByteArray_GET_SIZE(item);
    } else if (PyMemoryView_Check(item) && memoryview_bytes(item, &view) == 0) {
        has_view = 1;
        span.p = (const uint8_t *)view.buf;
        span.end = span.p + view.len;
    } else {
        return BAIL; /* Python raises its TypeError for this record, or reads it its own way */
    }
    for (Py_ssize_t i = 0; i < plan->slot_count; i++) plan->slots[i].present = 0;
    int status = read_example(plan, span);
    for (Py_ssize_t i = 0; !status && i < plan->spec_count; i++) status = read_spec(plan, &plan->specs[i], record);
    if (has_view) PyBuffer_Release(&view);
    return status;
}

/* ------------------------------------------------------------------ the Python function */

/* A SparseValue's indices as torch takes them, [2, nnz] row-major: every value's record, then its
 * position in the record; sorted and unique by construction (coalesced). */
static PyObject *sparse_indices(const Spec *spec) {
    const int64_t *lengths = (const int64_t *)spec->lengths.data;
    Py_ssize_t records = spec->lengths.length / 8, total = 0;
    for (Py_ssize_t record = 0; record < records; record++) total += (Py_ssize_t)lengths[record];
    PyObject *indices = PyByteArray_FromStringAndSize(NULL, total * 16);
    if (!indices) return NULL;
    int64_t *rows = (int64_t *)PyByteArray_AS_STRING(indices), *positions = rows + total;
    for (Py_ssize_t record = 0; record < records; record++)
        for (int64_t position = 0; position < lengths[record]; position++) {
            *rows++ = (int64_t)record;
            *positions++ = position;
        }
    return indices;
}

static PyObject *spec_result(Spec *spec) {
    if (spec->fixed && spec->kind != KIND_BYTES) Py_RETURN_NONE;
    PyObject *values = spec->kind == KIND_BYTES ? Py_NewRef(spec->values.list)
                                                : PyByteArray_FromStringAndSize(spec->values.data, spec->values.length);
    if (!values || spec->fixed) return values;
    PyObject *lengths = PyByteArray_FromStringAndSize(spec->lengths.data, spec->lengths.length);
    PyObject *indices = spec->sparse ? sparse_indices(spec) : Py_NewRef(Py_None);
    PyObject *parts = lengths && indices ? PyTuple_Pack(3, values, lengths, indices) : NULL;
    Py_DECREF(values);
    Py_XDECREF(lengths);
    Py_XDECREF(indices);
    return parts;
}

static PyObject *parse_examples(PyObject *self, PyObject *args) {
    PyObject *records, *keys, *specs, *result = NULL;
    if (!PyArg_ParseTuple(args, "OO!O!", &records, &PyTuple_Type, &keys, &PyTuple_Type, &specs)) return NULL;
    PyObject *sequence = PySequence_Fast(records, "_examples.parse_examples: records must be a sequence");
    if (!sequence) return NULL;
    Py_ssize_t batch = PySequence_Fast_GET_SIZE(sequence);
    Plan plan = {0};
    if (plan_build(&plan, keys, specs, batch)) goto done;
    for (Py_ssize_t record = 0; record < batch; record++) {
        int status = read_record(&plan, PySequence_Fast_GET_ITEM(sequence, record), record);
        if (status == NOMEM) { if (!PyErr_Occurred()) PyErr_NoMemory(); goto done; }
        if (status) { result = PyLong_FromSsize_t(record); goto done; }
    }
    if (!(result = PyList_New(plan.spec_count))) goto done;
    for (Py_ssize_t i = 0; i < plan.spec_count; i++) {
        PyObject *item = spec_result(&plan.specs[i]);
        if (!item) { Py_CLEAR(result); goto done; }
        PyList_SET_ITEM(result, i, item);
    }
done:
    for (Py_ssize_t i = 0; i < plan.spec_count; i++) /* fixed numeric windows point into the caller's array */
        if (plan.specs[i].fixed && plan.specs[i].kind != KIND_BYTES) plan.specs[i].values.data = NULL;
    plan_free(&plan);
    Py_DECREF(sequence);
    return result;
}

PyDoc_STRVAR(parse_examples_doc,
"parse_examples(records, keys, specs) -> list | int\n\n"
"Parse a batch of serialized tf.train.Example. keys: a tuple of distinct feature keys (bytes).\n"
"specs: a tuple of (slot, kind, mode, size, out, default): slot indexes keys; kind 1 bytes,\n"
"2 float, 3 int64; mode 1 for FixedLen (size values per record), 0 any count, 2 any count\n"
"with sparse indices.\n"
"FixedLen float/int64: out is a writable C-contiguous buffer of len(records) * size float32 /\n"
"int64 values, filled in place; default is bytes of size values (native order) or None.\n"
"FixedLen bytes: default is a tuple of size bytes or None. out is ignored elsewhere.\n"
"Returns per spec: None (FixedLen numeric), a list of bytes (FixedLen bytes), or (values,\n"
"lengths, indices) with values a bytearray of float32/int64 or a list of bytes, lengths a\n"
"bytearray of one int64 per record and indices (mode 2; else None) a bytearray of int64\n"
"[2, nnz] row-major: each value's record, then each value's position in it. Returns instead the int index of the first record it does not\n"
"handle (malformed, missing required, wrong kind or count, a key repeated with a later Feature()\n"
"that has no list, not bytes, bytearray or a plain\n"
"memoryview): the caller then parses\n"
"the batch its own way, which words the error.");

static PyMethodDef methods[] = {
    {"parse_examples", parse_examples, METH_VARARGS, parse_examples_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_examples",
                                    "Batched tf.train.Example parsing (see torchestimator.data.parsing).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__examples(void) { return PyModule_Create(&module); }
