"""A small client for TF Serving's REST API: ours or TensorFlow Serving's, same calls.

    client = Client("http://127.0.0.1:8501", "digits")
    client.predict([[0.0] * 64])                    # -> [[...10 probabilities...]] (the "predictions")
    client.predict({"image": x}, columnar=True)     # -> the "outputs"
    client.status(), client.metadata()
    client.regress([{"x": 1.0}]), client.classify([{"x": [..]}])

Standard library only (urllib), so it runs wherever a client does. Numpy
arrays and tensors are sent as nested lists; bytes as ``{"b64": ...}`` (TF
Serving's JSON for bytes, which string inputs take: serialized Examples, images). An error answer raises
ServingClientError carrying the HTTP status and the server's message.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from torchestimator.errors import ServingClientError

__all__ = ["Client", "ServingClientError"]


class Client:
    """Calls one model on a TF Serving REST endpoint; ``version`` or ``label`` pins a version (else the latest)."""

    def __init__(
        self,
        base_url: str,
        model_name: str,
        *,
        version: int | None = None,
        label: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        if version is not None and label is not None:
            raise ValueError(f"Give a version or a label, not both; received version={version!r}, label={label!r}.")
        parsed = urllib.parse.urlparse(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"base_url must look like http://host:port; received {base_url!r}.")
        self.base_url = base_url.rstrip("/")
        self.model_name = model_name
        self.timeout = timeout
        path = f"/v1/models/{urllib.parse.quote(model_name, safe='')}"
        if version is not None:
            path += f"/versions/{int(version)}"
        elif label is not None:
            path += f"/labels/{urllib.parse.quote(label, safe='')}"
        self._model_path = path

    def __repr__(self) -> str:
        return f"Client({self.base_url!r}, {self.model_name!r})"

    def status(self) -> dict[str, Any]:
        """The model's version status document (``model_version_status``)."""
        return self._call("GET", self._model_path)

    def metadata(self) -> dict[str, Any]:
        """The signature definitions of the served version."""
        return self._call("GET", self._model_path + "/metadata")

    def predict(self, instances: Any, *, columnar: bool = False, signature_name: str | None = None) -> Any:
        """Row format (``instances``) returns ``predictions``; columnar=True sends ``inputs`` and returns ``outputs``."""
        key = "inputs" if columnar else "instances"
        document = self._call("POST", self._model_path + ":predict", self._body(key, instances, signature_name))
        return document["outputs" if columnar else "predictions"]

    def classify(
        self,
        examples: Sequence[Mapping[str, Any]],
        *,
        context: Mapping[str, Any] | None = None,
        signature_name: str | None = None,
    ) -> list[list[list[Any]]]:
        """``[[[label, score], ...] per example]`` from a classify signature."""
        return self._examples("classify", examples, context, signature_name)

    def regress(
        self,
        examples: Sequence[Mapping[str, Any]],
        *,
        context: Mapping[str, Any] | None = None,
        signature_name: str | None = None,
    ) -> list[float]:
        """One value per example from a regress signature."""
        return self._examples("regress", examples, context, signature_name)

    def _examples(self, verb: str, examples: Any, context: Any, signature_name: str | None) -> Any:
        body = self._body("examples", examples, signature_name)
        if context is not None:
            body["context"] = _plain(context)
        return self._call("POST", f"{self._model_path}:{verb}", body)["results"]

    @staticmethod
    def _body(key: str, value: Any, signature_name: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {key: _plain(value)}
        if signature_name is not None:
            body["signature_name"] = signature_name
        return body

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        url = self.base_url + path
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            raw = error.read()
            try:
                message = json.loads(raw)["error"]
            except (ValueError, KeyError, TypeError):
                message = raw.decode("utf-8", "replace")[:500]
            raise ServingClientError(error.code, message, url) from None


def _plain(value: Any) -> Any:
    """Arrays and tensors as nested lists. Non-finite floats go out as NaN / Infinity, which TF Serving accepts."""
    if isinstance(value, (bytes, bytearray)):
        return {"b64": base64.b64encode(value).decode("ascii")}
    if hasattr(value, "tolist"):
        return _plain(value.tolist()) if getattr(value, "dtype", None) == object else value.tolist()  # noqa: E721
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value
