"""Optional dependencies: import one where a feature needs it, or say in one line which extra installs it.

Every import of a package from pyproject.toml's ``[project.optional-dependencies]``
goes through :func:`import_extra`, so a missing one ends in
``MissingExtraError: the model server needs aiohttp: pip install 'torchestimator[serving]'``
(one line from the CLI, exit 2) instead of a ModuleNotFoundError traceback.
MissingExtraError is an ImportError, so ``except ImportError`` keeps working.

What does not belong here: dependencies with a fallback (orjson, crc32c), which
stay plain ``try: import`` where they are used.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from torchestimator.errors import MissingExtraError

__all__ = ["EXTRAS", "import_extra"]

EXTRAS = {
    "pandas": ("pandas",),
    "images": ("pillow", "simplejpeg"),
    "keras": ("h5py",),
    "plot": ("matplotlib",),
    "serving": ("aiohttp", "prometheus-client", "orjson", "uvloop", "grpcio"),
    "demo": ("scikit-learn",),
    "onnx": ("onnx", "onnxscript", "onnxruntime"),
    "s3": ("s3fs",),
    "gcs": ("gcsfs",),
    "azure": ("adlfs",),
}
"""Each extra of pyproject.toml and the distributions it installs (kept equal by tests/test_extras.py)."""

_DISTRIBUTION_OF_MODULE = {
    "PIL": "Pillow",
    "prometheus_client": "prometheus-client",
    "sklearn": "scikit-learn",
    "grpc": "grpcio",
}
"""Where the name one imports differs from the name one installs (as its project spells it; pip ignores case)."""


def import_extra(module: str, *, extra: str, feature: str, alternative: str = "") -> ModuleType:
    """``importlib.import_module(module)``, or MissingExtraError naming ``feature`` and ``pip install`` of ``extra``.

    ``feature`` is what the user asked for, as they would say it: ``"the model server"``, ``"the digits demo"``.
    ``alternative``, when the feature has a way around the extra, ends the message after the pip command:
    ``"pass --image_mode encoded to store the file bytes as they are"``.
    """
    if extra not in EXTRAS:  # our own call sites: a typo here would print a pip command that fails
        raise AssertionError(
            f"import_extra({module!r}): {extra!r} is not an extra of pyproject.toml ({sorted(EXTRAS)})"
        )
    top_level = module.partition(".")[0]
    try:
        # The top-level package first, as the import statement does: a submodule already in sys.modules
        # (PIL.Image) must not hide that its package is gone (blocked, uninstalled since).
        importlib.import_module(top_level)
        return importlib.import_module(module)
    except ImportError as error:
        distribution = _DISTRIBUTION_OF_MODULE.get(top_level, top_level)
        missing = (error.name or "").partition(".")[0]
        if isinstance(error, ModuleNotFoundError) and missing == top_level:
            message = f"{feature} needs {distribution}: pip install 'torchestimator[{extra}]'"
        else:  # installed, but broken or too old (one of its own dependencies missing, a name it lacks)
            cause = " ".join(str(error).split())  # one line, whatever the library's message
            message = (
                f"{feature} needs {distribution}, which could not be imported ({cause}): "
                f"pip install --upgrade 'torchestimator[{extra}]'"
            )
        if alternative:
            message += f"; or {alternative}"
        # from None: the message says all; the original stays in __context__ for --verbosity DEBUG.
        raise MissingExtraError(message, module=module, extra=extra) from None
