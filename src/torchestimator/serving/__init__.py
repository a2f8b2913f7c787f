"""A model server speaking TensorFlow Serving's REST API for exports of ``export_saved_model``.

    manager = ModelManager("digits", "export/digits")   # integer version folders
    manager.poll()                                      # load the latest
    app = make_app(manager)                             # aiohttp application
    serve("digits", "export/digits", port=8501)         # or all of it, blocking

Modules: manager.py (versions, load, warm-up, swap), json_tensor.py (request
and response JSON), errors.py (ServingError and TF's status mapping), app.py
(paths, dispatch, ``serve``).
"""

from torchestimator.serving.app import DEFAULT_MAX_BODY_BYTES, add_polling, make_app, serve
from torchestimator.serving.errors import ServingError
from torchestimator.serving.manager import ModelManager, VersionStatus

__all__ = ["DEFAULT_MAX_BODY_BYTES", "ModelManager", "ServingError", "VersionStatus", "add_polling", "make_app",
           "serve"]
