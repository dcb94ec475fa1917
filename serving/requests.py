"""The JSON request of TF Serving's REST API, which Vertex AI's TensorFlow prediction containers serve:
`{"instances": [...]}`, one instance per example.

In the row format an instance is a {input name: value} object (or, for a signature with one input, the value
itself); the server stacks the instances' values of each input into one batch tensor of the signature's dtype.
Strings are JSON strings (or {"b64": "..."} for bytes that are not UTF-8). `to_batch` does the same here, so a
request can be checked without a server (tests, `python -m tools.predict --input=request.json`), and `to_instances`
writes the export's example request, assets.extra/example_request.json.
"""

import base64
import json

import numpy as np

FILE_NAME = "example_request.json"  # In assets.extra/.


def to_instances(batch: dict) -> list[dict]:
    """{input name: array [n, ...]} -> n instances {input name: value} as JSON values (strings decoded as UTF-8, or
    {"b64": ...} when they are not text)."""
    count = len(next(iter(batch.values())))
    return [{name: _json_value(values[index]) for name, values in batch.items()} for index in range(count)]


def _json_value(value):
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(value).decode("ascii")}
    array = np.asarray(value)
    if array.dtype == np.float32:  # Each number at float32's shortest exact form (11.74, not 11.739999771118164).
        return _shortest_floats(array)
    return array.tolist()


def _shortest_floats(array: np.ndarray):
    if array.ndim == 0:
        return float(str(array[()]))  # str of a NumPy float32: the shortest text that reads back to it.
    return [_shortest_floats(row) for row in array]


def request_json(batch: dict) -> str:
    """The text of `{"instances": [...]}` for `batch`, one instance per line."""
    lines = ",\n".join("  " + json.dumps(instance) for instance in to_instances(batch))
    return '{"instances": [\n' + lines + "\n]}\n"


def to_batch(request, inputs: dict) -> dict:
    """A parsed `{"instances": [...]}` request -> {input name: array [n, ...]}, as the server builds it; `inputs` is
    the metadata's {name: {'dtype', 'shape'}} (serving/metadata.py). A ValueError says what is wrong with it."""
    if not isinstance(request, dict) or not isinstance(request.get("instances"), list):
        raise ValueError('the request must be a JSON object {"instances": [...]}')
    instances = request["instances"]
    if not instances:
        raise ValueError('"instances" is empty: give at least one example')
    names = sorted(inputs)
    if all(isinstance(instance, dict) and "b64" not in instance for instance in instances):
        rows = instances
    elif len(names) == 1:  # A bare value per instance: the one input's.
        rows = [{names[0]: instance} for instance in instances]
    else:
        raise ValueError(f"the signature has the inputs {names}: give each instance as an object with them")
    batch = {}
    for name in names:
        missing = [index for index, row in enumerate(rows) if name not in row]
        if missing:
            raise ValueError(f"instance {missing[0]} has no {name!r} (its keys: {sorted(rows[missing[0]])})")
        batch[name] = _column([row[name] for row in rows], name, inputs[name])
    extra = sorted({key for row in rows for key in row} - set(names))
    if extra:
        raise ValueError(f"the instances have keys {extra} that are not inputs of the signature ({names})")
    return batch


def _column(values: list, name: str, description: dict) -> np.ndarray:
    dtype = description["dtype"]
    if dtype == "string":
        return np.array([_bytes(value, name) for value in values], dtype=object)
    try:
        column = np.asarray(values)
    except ValueError:  # Ragged: instances of different shapes.
        raise ValueError(f"the instances' {name!r} values have different shapes") from None
    check_shape(column, description["shape"], name)
    return cast(column, dtype, name)


def check_shape(values: np.ndarray, shape: list, name: str) -> None:
    """A ValueError unless `values` is a batch of `shape` (the metadata's, batch first; None = any size)."""
    expected = shape[1:]
    if values.dtype == object or values.ndim != len(expected) + 1 or any(
            size is not None and size != actual for size, actual in zip(expected, values.shape[1:], strict=True)):
        described = tuple("any" if size is None else size for size in expected)
        raise ValueError(f"{name!r} of each example must have shape {described}; got {values.shape[1:]}")


def cast(values: np.ndarray, dtype: str, name: str) -> np.ndarray:
    """`values` as `dtype` ('uint8', 'float32', ...) when every value fits it exactly (a ValueError otherwise): a
    pixel of 300 or 2.5 is an error, not silently wrapped or truncated."""
    target = np.dtype(dtype)
    if not (np.issubdtype(values.dtype, np.number) or values.dtype == bool):
        raise ValueError(f"{name!r} must hold numbers ({dtype}); got {values.dtype}")
    if np.issubdtype(target, np.integer):
        info = np.iinfo(target)
        if not np.all(np.isfinite(values)) or np.any(values != np.round(values)) or \
                values.min(initial=info.min) < info.min or values.max(initial=info.max) > info.max:
            raise ValueError(f"{name!r} must hold whole numbers from {info.min} to {info.max} ({dtype})")
    return values.astype(target)


def _bytes(value, name: str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
        return base64.b64decode(value["b64"])
    raise ValueError(f"{name!r} must be a string (or {{\"b64\": ...}}); got {json.dumps(value)[:60]}")
