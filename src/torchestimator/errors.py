"""Every exception torchestimator defines, under one base class.

What belongs here: the exception classes and the little they need to build
their messages; nothing else, and no import from the package (every module may
import this one, so it must not import them back). The modules that raise an
error re-export it, so ``from torchestimator.data.tfrecord import
DataLossError`` keeps working. Each class keeps the builtin it always was a
kind of, so ``except ValueError`` code written before the base existed still
catches it::

    TorchEstimatorError(Exception)            catch-all for the package's own errors
    ├── ConfigError(ValueError)               a setting refused where its object is built; .field, .value
    │   └── ConfigTypeError(TypeError)        ... because of its type (a bool for a step count, a str for a float)
    ├── CheckpointError(ValueError)           a checkpoint missing, incomplete, corrupt or from a newer version
    ├── DiskFullError(OSError)                no room in model_dir; .errno (ENOSPC, EDQUOT, EFBIG), .filename
    ├── NanLossDuringTrainingError(RuntimeError)   the loss (or a weight about to be saved) is not finite
    ├── DataLossError(ValueError)             a damaged TFRecord file; .path, .offset (the record's start)
    ├── ExampleDecodeError(ValueError)        bytes that are not a tf.train.Example / SequenceExample
    ├── ExampleParseError(ValueError)         a valid Example that does not fit the parse spec (a feature missing, ...)
    ├── ImageDecodeError(ValueError)          bytes that are not an image decode_image can decode; .where, .format
    ├── WeightSourceError(ValueError)         a weight file missing, unreadable, corrupt or crafted
    │   └── KerasModelError                   ... or a Keras model file whose model cannot be converted (a layer named)
    ├── TensorNotFoundError(KeyError)         a weight source asked for a name it does not hold
    ├── ExportFormatError(ValueError)         an export's program.json / tensors.safetensors refused
    ├── InputError(ValueError)                inputs an exported model's signature does not take (load, predict, serve)
    │   └── InputTypeError(TypeError)         ... because of their type or dtype
    ├── MissingExtraError(ImportError)        an optional dependency is not installed; .module, .extra (the pip extra)
    ├── NotARegularFileError(ValueError)      a named file is a folder, FIFO, device or socket; .path, .kind
    ├── FileTooLargeError(ValueError)         a named file over its bound; .path, .size, .limit
    ├── ServingError                          a request the server refuses; .code (TF's), .http_status
    ├── GrpcListenError(OSError)              serve: the gRPC port cannot be taken (in use, not this host's address)
    ├── BodyTooLarge(ValueError)              a request body that inflates past the server's limit (answered 413)
    ├── ServingClientError                    the server answered an error; .status, .message, .url
    ├── RelaunchError(RuntimeError)           the program cannot be started again as the other replicas
    ├── ReplicaFailedError(RuntimeError)      run_in_processes: a replica raised or died; .rank, .exception_type
    ├── ReplicasDisagreeError(RuntimeError)   before step 1, replicas saw other model_dirs or checkpoints; .views
    ├── ChiefFailedError(RuntimeError)        on the other replicas: what the chief does for all of them failed; .what
    ├── ReplicaLostError(RuntimeError)        in training, another replica died or stopped answering; .lost_ranks
    └── TaskLostError(RuntimeError)           parameter servers: a ps, the chief or a synchronous step's trainer
                                              died or stopped answering; .task ("ps:0"), .step

The arguments of ``Estimator`` and ``Estimator.from_module`` (model_dir, config,
params, model, optimizer, ...) are settings: a wrong type is a ConfigTypeError
naming the argument (``.field``), still a TypeError. Other mistakes in how the API
is called (a hook that is not a Hook, a rule passed as a hook) stay plain
``TypeError``/``ValueError``: they are bugs in the caller's code, not conditions
a program handles.

Every class pickles and copies as itself, with its message and attributes (``PicklableError``), so
an error raised in a worker process (a spawn ProcessPoolExecutor, multiprocessing.Pool, a replica)
reaches the parent as the same error.
"""

from __future__ import annotations

import errno as errno_codes
from typing import Any, cast

__all__ = [
    "HTTP_STATUS",
    "BodyTooLarge",
    "CheckpointError",
    "ChiefFailedError",
    "ConfigError",
    "ConfigTypeError",
    "DataLossError",
    "DiskFullError",
    "ExampleDecodeError",
    "ExampleParseError",
    "ExportFormatError",
    "FileTooLargeError",
    "GrpcListenError",
    "ImageDecodeError",
    "InputError",
    "InputTypeError",
    "KerasModelError",
    "MissingExtraError",
    "NanLossDuringTrainingError",
    "NotARegularFileError",
    "RelaunchError",
    "ReplicaFailedError",
    "ReplicaLostError",
    "ReplicasDisagreeError",
    "ServingClientError",
    "ServingError",
    "TaskLostError",
    "TensorNotFoundError",
    "TorchEstimatorError",
    "WeightSourceError",
]


class PicklableError:
    """Mixin: pickle and ``copy`` rebuild the error from its state, not by calling ``cls(*args)`` again.

    Why: Python rebuilds an unpickled exception as ``cls(*self.args)``, and ``args`` is what the class passed
    to its builtin base (the message), not the arguments of its own ``__init__``; a class with a required
    keyword (``MissingExtraError(message, module=..., extra=...)``) or other positional arguments
    (``DiskFullError(cause, path=..., what=...)``) then failed with TypeError. Raised in a worker process
    (a spawn ProcessPoolExecutor, multiprocessing.Pool), that TypeError broke the pool instead of reaching
    the caller. Here the builtin base is rebuilt from the builtin's own reduction (``args``; errno and
    filename for OSError; name and path for ImportError) and the class's attributes (``__dict__``) are
    put back as they were, so type, ``str()`` and every attribute survive. Every TorchEstimatorError has it;
    an exception class outside the tree can mix it in before its builtin base.
    """

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        _, builtin_args, *state = cast("tuple[Any, ...]", super().__reduce__())  # always a tuple for exceptions
        return (_rebuilt_error, (type(self), builtin_args), *state)


def _rebuilt_error(cls: type[BaseException], builtin_args: tuple[Any, ...]) -> BaseException:
    """An instance of ``cls`` whose builtin part is made from ``builtin_args``, without ``cls.__init__``."""
    builtin = cast("type[BaseException]", next(base for base in cls.__mro__ if base.__module__ == "builtins"))
    error = builtin.__new__(cls, *builtin_args)
    builtin.__init__(error, *builtin_args)  # OSError parses errno, strerror and filename here
    return error


class TorchEstimatorError(PicklableError, Exception):
    """Base class of every exception torchestimator defines; ``except TorchEstimatorError`` catches them all."""


# --------------------------------------------------------------------------- configuration


class ConfigError(TorchEstimatorError, ValueError):
    """A setting refused when its object is built (RunConfig, a hook); ``field`` names it, ``value`` is what came."""

    def __init__(self, message: str, *, field: str = "", value: Any = None) -> None:
        super().__init__(message)
        self.field = field
        self.value = value


class ConfigTypeError(ConfigError, TypeError):
    """A setting of the wrong type (``save_checkpoints_steps=True``, ``clip_grad_norm="1"``)."""


# --------------------------------------------------------------------------- training and checkpoints


class CheckpointError(TorchEstimatorError, ValueError):
    """A checkpoint is missing, incomplete or corrupt; the message names the file and the fault."""


_NO_ROOM_WORDS: dict[int | None, str] = {
    errno_codes.ENOSPC: "disk full",
    errno_codes.EDQUOT: "disk quota exceeded",
    errno_codes.EFBIG: "file size limit reached (ulimit -f / RLIMIT_FSIZE)",
}


NO_ROOM_ERRNOS = frozenset({errno_codes.ENOSPC, errno_codes.EDQUOT, errno_codes.EFBIG})
"""The errnos of a write that found no room: a full disk, a quota, a file size limit."""


def is_no_room(error: BaseException | None) -> bool:
    """Whether ``error`` is an OSError of a full disk (``NO_ROOM_ERRNOS``): what ``DiskFullError`` wraps."""
    return isinstance(error, OSError) and error.errno in NO_ROOM_ERRNOS


class DiskFullError(TorchEstimatorError, OSError):
    """No room to write into model_dir; ``errno`` is the original one (ENOSPC, EDQUOT or EFBIG)."""

    def __init__(
        self,
        cause: OSError,
        *,
        path: str,
        what: str,
        bytes_needed: int | None = None,
        free_bytes: int | None = None,
        advice: str = "",
    ) -> None:
        message = f"{_NO_ROOM_WORDS.get(cause.errno, 'no room')}: could not write {what} to {path} ({cause.strerror})"
        if bytes_needed is not None:
            message += f"; it needs {bytes_needed:,} bytes"
            if free_bytes is not None and cause.errno != errno_codes.EFBIG:  # EFBIG: the disk has room
                message += f", {free_bytes:,} are free there"
        message += f". {advice}".rstrip()
        super().__init__(cause.errno, message, path)
        self.bytes_needed = bytes_needed

    def __str__(self) -> str:
        return f"[Errno {self.errno}] {self.strerror}"


class NanLossDuringTrainingError(TorchEstimatorError, RuntimeError):
    """The loss (or a weight about to be saved) stopped being finite."""


# --------------------------------------------------------------------------- data readers


class DataLossError(TorchEstimatorError, ValueError):
    """A TFRecord file is damaged: a CRC mismatch, a cut record, or a broken compressed stream.

    `path` names the file and `offset` is the byte offset of the damaged
    record's start in the uncompressed stream (where a reader could resume or a
    repair could cut). The message starts with TensorFlow's words and number:
    "corrupted record at N" / "truncated record at N", where for a *data* CRC
    mismatch TensorFlow's N is the data's offset, record start + 12 (its reader
    checks the data at `offset + kHeaderSize`); the message then names the
    record start too. A record longer than `max_record_size` gives
    "record too large at N", with the declared length and how to raise the limit.
    `kind` says which, for code to read (never the message): ``"corrupted"``,
    ``"truncated"`` (a cut record: a file still being written, or cut short),
    ``"unreadable"``, ``"too large"``, or ``""`` (a saved position that no longer fits).
    """

    def __init__(self, message: str, path: str = "", offset: int = -1, *, kind: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset
        self.kind = kind


class ExampleDecodeError(TorchEstimatorError, ValueError):
    """The bytes are not a valid serialized Example / SequenceExample."""


class ExampleParseError(TorchEstimatorError, ValueError):
    """A record is a valid Example that does not fit the parse spec: a required feature missing, a feature of
    another type or another number of values. The data's fault, not the caller's (a bad spec is a ValueError);
    the message names the feature and the record, in TensorFlow's words."""


class ImageDecodeError(TorchEstimatorError, ValueError):
    """Bytes that decode_image cannot decode, or a decode option their format refuses.

    ``where`` names the bytes (a file, a record, a request input and its index) and ``format`` the format
    seen in them (``"png"``, ``"jpeg"``, ``"gif"``, ``"bmp"``, ``"webp"`` or ``"unknown"``).
    """

    def __init__(self, message: str, *, where: str = "", format: str = "") -> None:
        super().__init__(message)
        self.where = where
        self.format = format


class WeightSourceError(TorchEstimatorError, ValueError):
    """A weight file is missing, unreadable, corrupt or crafted; the message names the file (and tensor/offset).

    Every reader raises it, and only it, for a bad file: a declared size the file
    cannot hold, a bad offset, a pickle that would need code to load. Anything
    else escaping a reader is a bug (tools/faults_readers.py counts them).
    """


class KerasModelError(WeightSourceError):
    """A Keras model file whose model cannot be built as a torch module: a Lambda layer or custom object (never
    run), a class without a converter, a config that does not fit the weights; names the file and the layer."""


class TensorNotFoundError(TorchEstimatorError, KeyError):
    """`WeightSource.read` was asked for a name the source does not hold."""

    def __str__(self) -> str:
        # KeyError's own __str__ shows repr(message), quotes and escapes included.
        return str(self.args[0]) if self.args else ""


class NotARegularFileError(TorchEstimatorError, ValueError):
    """The path names a folder, FIFO, device or socket; ``kind`` says which in words."""

    def __init__(self, path: str, kind: str) -> None:
        super().__init__(f"{path} is {kind}")
        self.path, self.kind = path, kind


class FileTooLargeError(TorchEstimatorError, ValueError):
    """The file holds more than the caller's bound; ``size`` is what it declares, ``limit`` the bound."""

    def __init__(self, path: str, size: int, limit: int) -> None:
        super().__init__(f"{path} holds {size} bytes, more than {limit}")
        self.path, self.size, self.limit = path, size, limit


# --------------------------------------------------------------------------- optional dependencies


class MissingExtraError(TorchEstimatorError, ImportError):
    """An optional dependency is not installed; the message names the pip extra that installs it.

    Raised by ``torchestimator._extras.import_extra`` where the feature needs it (``serve``, the demo,
    ``plot``, ``pandas_input_fn``, Keras HDF5 files), not at ``import torchestimator``.
    """

    def __init__(self, message: str, *, module: str, extra: str) -> None:
        super().__init__(message, name=module)
        self.module = module
        """The module that could not be imported (``aiohttp.web``)."""
        self.extra = extra
        """The extra of ``pip install 'torchestimator[<extra>]'`` that installs it (``serving``)."""


# --------------------------------------------------------------------------- export and serving


class InputError(TorchEstimatorError, ValueError):
    """Inputs given to an exported model do not fit its signature: a missing or unexpected name, a shape or batch
    size it does not take, values that cannot be read, or a request file that is not one. Raised where the inputs
    are checked (``te.export.load(...)(inputs)``, ``predict --exported``, a request to ``serve``, which answers it
    with INVALID_ARGUMENT); the message names the input or the file."""


class InputTypeError(InputError, TypeError):
    """The same for an input of the wrong type or dtype (a float64 array where float32 is expected, a number
    where a string input takes bytes): still an InputError, and a TypeError as before."""


class ExportFormatError(TorchEstimatorError, ValueError):
    """An export folder is not one (missing or incomplete files), or its files are malformed or hold something
    that could run code; the message names the file."""


HTTP_STATUS = {
    "OK": 200,
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 400,
    "ABORTED": 409,
    "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DATA_LOSS": 500,
    "UNAUTHENTICATED": 401,
}
"""TF Serving's canonical status names and the HTTP status each answers with (model_servers/http_server.cc)."""


class ServingError(TorchEstimatorError):
    """A request the server answers with an error: ``code`` is TF's canonical status name."""

    def __init__(self, code: str, message: str) -> None:
        if code not in HTTP_STATUS:
            raise ValueError(f"Unknown status code {code!r}; expected one of {sorted(HTTP_STATUS)}.")
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]


class BodyTooLarge(TorchEstimatorError, ValueError):
    """The decoded body would exceed the server's limit (app.py answers 413, as for a large raw body)."""


class ServingClientError(TorchEstimatorError):
    """The server answered with an error: ``status`` is the HTTP status, ``message`` its ``{"error": ...}``."""

    def __init__(self, status: int, message: str, url: str) -> None:
        super().__init__(f"HTTP {status} from {url}: {message}")
        self.status = status
        self.message = message
        self.url = url


# --------------------------------------------------------------------------- processes


class RelaunchError(TorchEstimatorError, RuntimeError):
    """The running program cannot be started again as the other replicas."""


class ReplicaFailedError(TorchEstimatorError, RuntimeError):
    """A function run by ``run_in_processes`` raised (or its process died) in one replica."""

    def __init__(self, message: str, *, rank: int, exception_type: str, traceback_text: str) -> None:
        super().__init__(message)
        self.rank = rank
        """The replica that failed first."""
        self.exception_type = exception_type
        """Qualified name of the exception it raised (e.g. 'builtins.ValueError')."""
        self.traceback_text = traceback_text
        """Its traceback, formatted in the replica."""


class ReplicasDisagreeError(TorchEstimatorError, RuntimeError):
    """Before step 1, the replicas of a run saw different states: model_dir not shared, another checkpoint, max_steps.

    Raised on every replica with the same message, naming the ranks and what each saw.
    """

    def __init__(self, message: str, *, views: Any = ()) -> None:
        super().__init__(message)
        self.views = list(views)
        """What each replica saw (``_core.agreement.ReplicaView``), in rank order; empty when unknown."""


class ReplicaLostError(TorchEstimatorError, RuntimeError):
    """A collective failed because another replica died or stopped answering during training, or the
    group never formed at start-up because a replica did not come (within the collective timeout).

    The message names the replicas found gone where this host can tell (those on the same host), and
    keeps the backend's own message (its ``__cause__``).
    """

    def __init__(self, message: str, *, lost_ranks: Any = (), step: int | None = None) -> None:
        super().__init__(message)
        self.lost_ranks = tuple(lost_ranks)
        """Ranks found gone (on this host); empty when none could be checked or all still ran."""
        self.step = step
        """The global step this replica had reached."""


class ChiefFailedError(TorchEstimatorError, RuntimeError):
    """Raised on every replica but the chief when what the chief does for all of them (write a checkpoint, the
    best-checkpoint record, an export) failed there; the chief raises its own error. ``what`` names the work,
    ``chief_error`` is the chief's error as ``"Type: message"``. Every replica raises, so none waits for the others.
    """

    def __init__(self, message: str, *, what: str = "", chief_error: str = "") -> None:
        super().__init__(message)
        self.what = what
        self.chief_error = chief_error


class TaskLostError(TorchEstimatorError, RuntimeError):
    """Parameter-server training lost a task: a ps stopped answering (the trainers that called it raise), the chief
    stopped sending its heartbeat (the ps tasks end training and the workers raise), or a synchronous step waited
    for a trainer's gradient past the timeout. ``task`` names the task lost ("ps:1", "chief", "worker:0"),
    ``step`` the global step reached. Every task stops within the timeout; a restart of every task resumes from
    the newest checkpoint."""

    def __init__(self, message: str, *, task: str = "", step: int | None = None) -> None:
        super().__init__(message)
        self.task = task
        self.step = step


class GrpcListenError(TorchEstimatorError, OSError):
    """The model server cannot listen for gRPC (the port in use, or the host not this machine's); the message
    names the address. A class of its own so that ``serve`` adds its ``--port`` advice without reading words."""
