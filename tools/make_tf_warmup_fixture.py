"""Writes tests/fixtures/tf_warmup/tf_serving_warmup_requests with real TensorFlow and tensorflow-serving-api.

A PredictionLog file as TF Serving's g3doc/saved_model_warmup.md makes it: a predict_log for serving_default
(x: float32 [2, 1] from tf.make_tensor_proto, shift: int64 [2]) and a regress_log of two tf.train.Examples with a
context, for tests/serving/test_serving_warmup.py's half-plus-three export. Run in the comparison environment:

    /tmp/benchenv/bin/python tools/make_tf_warmup_fixture.py
"""

import os

import tensorflow as tf
from tensorflow_serving.apis import input_pb2, predict_pb2, prediction_log_pb2, regression_pb2

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "tf_warmup", "tf_serving_warmup_requests")


def main() -> None:
    predict = predict_pb2.PredictRequest()
    predict.model_spec.name = "half"
    predict.model_spec.signature_name = "serving_default"
    predict.inputs["x"].CopyFrom(tf.make_tensor_proto([[1.0], [2.0]], dtype=tf.float32))
    predict.inputs["shift"].CopyFrom(tf.make_tensor_proto([0, 1], dtype=tf.int64))
    regress = regression_pb2.RegressionRequest()
    regress.model_spec.name = "half"
    regress.model_spec.signature_name = "tensorflow/serving/regress"
    examples = input_pb2.ExampleListWithContext()
    for x in (1.0, 5.0):
        examples.examples.add().features.feature["x"].float_list.value.append(x)
    examples.context.features.feature["shift"].int64_list.value.append(1)
    regress.input.example_list_with_context.CopyFrom(examples)
    with tf.io.TFRecordWriter(OUT) as writer:
        writer.write(
            prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=predict)
            ).SerializeToString()
        )
        writer.write(
            prediction_log_pb2.PredictionLog(
                regress_log=prediction_log_pb2.RegressLog(request=regress)
            ).SerializeToString()
        )
    print("wrote", os.path.normpath(OUT))


if __name__ == "__main__":
    main()
