"""TF Serving's warmup file, `assets.extra/tf_serving_warmup_requests`: a TFRecord of PredictionLog protos, each
holding one PredictRequest that the server runs once before it answers its first client.

Why the messages are built here: `tensorflow-serving-api` (the package that ships them) requires the `tensorflow`
wheel, and this template installs `tensorflow-cpu` or `tensorflow-tpu`: pip would install a second TensorFlow beside
ours. So the five messages a warmup file needs (ModelSpec, PredictRequest, PredictResponse, PredictLog,
PredictionLog) are declared below with TF Serving's own names and field numbers (tensorflow_serving/apis/model.proto,
predict.proto, prediction_log.proto; the fields a warmup request never sets are left out, which the wire format
allows), against TensorFlow's own TensorProto, in a private descriptor pool (so they never clash with the real
classes should a process import those too). The bytes written are what TF Serving's classes write.
"""

import functools

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

FILE_NAME = "tf_serving_warmup_requests"  # In assets.extra/, where TF Serving looks for it.
SIGNATURE = "serving_default"

_TENSOR_PROTO = ".tensorflow.TensorProto"
_Field = descriptor_pb2.FieldDescriptorProto
_STRING, _MESSAGE = _Field.TYPE_STRING, _Field.TYPE_MESSAGE
_OPTIONAL, _REPEATED = _Field.LABEL_OPTIONAL, _Field.LABEL_REPEATED


def _field(name: str, number: int, kind: int, type_name: str = "", label: int = _OPTIONAL):
    field = _Field(name=name, number=number, type=kind, label=label)
    if type_name:  # Set only for message fields: an empty one counts as set and is refused.
        field.type_name = type_name
    return field


def _tensor_map(message: descriptor_pb2.DescriptorProto, name: str, number: int, entry: str) -> None:
    """A `map<string, TensorProto> name = number;` field of `message` (maps are repeated entry messages)."""
    nested = message.nested_type.add(name=entry, field=[_field("key", 1, _STRING),
                                                        _field("value", 2, _MESSAGE, _TENSOR_PROTO)])
    nested.options.map_entry = True
    message.field.append(_field(name, number, _MESSAGE, f".tensorflow.serving.{message.name}.{entry}", _REPEATED))


def _serving_file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(name="template_serving/prediction_log_subset.proto",
                                              package="tensorflow.serving", syntax="proto3",
                                              dependency=["tensorflow/core/framework/tensor.proto"])
    file.message_type.add(name="ModelSpec", field=[_field("name", 1, _STRING), _field("signature_name", 3, _STRING)])
    request = file.message_type.add(name="PredictRequest", field=[
        _field("model_spec", 1, _MESSAGE, ".tensorflow.serving.ModelSpec")])
    _tensor_map(request, "inputs", 2, "InputsEntry")
    request.field.append(_field("output_filter", 3, _STRING, label=_REPEATED))
    response = file.message_type.add(name="PredictResponse", field=[
        _field("model_spec", 2, _MESSAGE, ".tensorflow.serving.ModelSpec")])
    _tensor_map(response, "outputs", 1, "OutputsEntry")
    file.message_type.add(name="PredictLog", field=[
        _field("request", 1, _MESSAGE, ".tensorflow.serving.PredictRequest"),
        _field("response", 2, _MESSAGE, ".tensorflow.serving.PredictResponse")])
    file.message_type.add(name="PredictionLog", field=[
        _field("predict_log", 6, _MESSAGE, ".tensorflow.serving.PredictLog")])
    return file


def _add_with_dependencies(pool: descriptor_pool.DescriptorPool, file_descriptor) -> None:
    for dependency in file_descriptor.dependencies:
        _add_with_dependencies(pool, dependency)
    try:
        pool.FindFileByName(file_descriptor.name)
    except KeyError:
        pool.AddSerializedFile(file_descriptor.serialized_pb)


@functools.cache
def messages() -> dict:
    """{'ModelSpec': class, 'PredictRequest': ..., 'PredictResponse': ..., 'PredictLog': ..., 'PredictionLog': ...,
    'TensorProto': ...}: message classes of the private pool."""
    from tensorflow.core.framework import tensor_pb2

    pool = descriptor_pool.DescriptorPool()
    _add_with_dependencies(pool, tensor_pb2.DESCRIPTOR)
    pool.Add(_serving_file())
    names = {name: f"tensorflow.serving.{name}" for name in
             ("ModelSpec", "PredictRequest", "PredictResponse", "PredictLog", "PredictionLog")}
    names["TensorProto"] = "tensorflow.TensorProto"
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(full)) for name, full in names.items()}


def prediction_log(inputs: dict) -> bytes:
    """One serialized PredictionLog whose PredictRequest asks `serving_default` for `inputs` ({name: array})."""
    import tensorflow as tf

    classes = messages()
    log = classes["PredictionLog"]()
    request = log.predict_log.request
    request.model_spec.signature_name = SIGNATURE
    for name, value in inputs.items():
        request.inputs[name].ParseFromString(tf.make_tensor_proto(value).SerializeToString())
    return log.SerializeToString()


def write(path: str, batches: list[dict]) -> None:
    """Writes the warmup file at `path` (local or gs://): one request per batch ({input name: array [n, ...]})."""
    import tensorflow as tf

    with tf.io.TFRecordWriter(path) as writer:
        for inputs in batches:
            writer.write(prediction_log(inputs))


def read(path: str) -> list[dict]:
    """The warmup file's requests as they were written: [{'signature_name': str, 'inputs': {name: array}}, ...]."""
    import tensorflow as tf
    from tensorflow.core.framework import tensor_pb2

    classes, requests = messages(), []
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        request = classes["PredictionLog"].FromString(record).predict_log.request
        inputs = {name: tf.make_ndarray(tensor_pb2.TensorProto.FromString(tensor.SerializeToString()))
                  for name, tensor in request.inputs.items()}
        requests.append({"signature_name": request.model_spec.signature_name, "inputs": inputs})
    return requests
