"""torchestimator.serving.config: TF Serving's text-format config files, parsed as TF Serving parses them."""

from __future__ import annotations

import logging

import pytest
from helpers import wait_until

from torchestimator.errors import ConfigError
from torchestimator.serving.config import (
    DEFAULT_PROMETHEUS_PATH,
    ModelConfig,
    MonitoringConfig,
    VersionPolicy,
    _protos,
    parse_model_server_config,
    read_batching_parameters_file,
    read_model_config_file,
    read_monitoring_config_file,
)

# The examples of SRV g3doc/serving_config.md, verbatim.
BASIC_EXAMPLE = """
model_config_list {
  config {
    name: 'my_first_model'
    base_path: '/tmp/my_first_model/'
    model_platform: 'tensorflow'
  }
  config {
    name: 'my_second_model'
    base_path: '/tmp/my_second_model/'
    model_platform: 'tensorflow'
  }
}
"""
SPECIFIC_ONE = """
model_version_policy {
  specific {
    versions: 42
  }
}
"""
SPECIFIC_TWO = """
model_version_policy {
  specific {
    versions: 42
    versions: 43
  }
}
"""
LABELS = """
model_version_policy {
  specific {
    versions: 42
    versions: 43
  }
}
version_labels {
  key: 'stable'
  value: 42
}
version_labels {
  key: 'canary'
  value: 43
}
"""
MONITORING_EXAMPLE = """
prometheus_config {
  enable: true,
  path: "/monitoring/prometheus/metrics"
}
"""
BATCHING_EXAMPLE = """
max_batch_size { value: 128 }
batch_timeout_micros { value: 0 }
max_enqueued_batches { value: 1000000 }
num_batch_threads { value: 8 }
"""


def one_model(fields: str) -> str:
    """The g3doc's ModelConfig fragments, inside a one-model config as a real file holds them."""
    return f"model_config_list {{\n  config {{\n    name: 'm'\n    base_path: '/models/m'\n{fields}\n  }}\n}}\n"


def write(tmp_path, text, name="models.config"):
    path = tmp_path / name
    path.write_text(text)
    return path


# -- the documented examples -----------------------------------------------------------------------


def test_basic_example_lists_both_models_with_the_default_policy(tmp_path):
    configs = read_model_config_file(write(tmp_path, BASIC_EXAMPLE))
    assert configs == [
        ModelConfig(name="my_first_model", base_path="/tmp/my_first_model/"),
        ModelConfig(name="my_second_model", base_path="/tmp/my_second_model/"),
    ]
    assert configs[0].version_policy == VersionPolicy(kind="latest", num_versions=1)
    assert dict(configs[0].version_labels) == {}


@pytest.mark.parametrize("fields, versions", [(SPECIFIC_ONE, (42,)), (SPECIFIC_TWO, (42, 43))])
def test_specific_version_examples(fields, versions):
    (config,) = parse_model_server_config(one_model(fields))
    assert config.version_policy == VersionPolicy(kind="specific", versions=versions)


def test_label_example_maps_labels_to_versions():
    (config,) = parse_model_server_config(one_model(LABELS))
    assert config.version_policy.versions == (42, 43)
    assert dict(config.version_labels) == {"stable": 42, "canary": 43}


def test_latest_and_all_policies_and_latest_without_a_count_means_one():
    text = """model_config_list {
      config { name: 'a' base_path: '/a' model_version_policy { latest { num_versions: 3 } } }
      config { name: 'b' base_path: '/b' model_version_policy { all {} } }
      config { name: 'c' base_path: '/c' model_version_policy { latest {} } }  # TF serves max(n, 1)
    }"""
    a, b, c = parse_model_server_config(text)
    assert a.version_policy == VersionPolicy(kind="latest", num_versions=3)
    assert b.version_policy == VersionPolicy(kind="all")
    assert c.version_policy == VersionPolicy(kind="latest", num_versions=1)


def test_fields_we_do_not_act_on_parse_and_those_changing_tf_behaviour_are_logged(caplog):
    text = one_model("""
    model_platform: 'tensorflow'
    logging_config {
      log_collector_config { type: 'file' filename_prefix: '/tmp/log' }
      sampling_config { sampling_rate: 0.5 attributes: 1 }
    }""")
    with caplog.at_level(logging.WARNING, logger="torchestimator.serving.config"):
        (config,) = parse_model_server_config(text, source="models.config")
    assert config.name == "m"
    assert any(
        "logging_config" in record.getMessage() and "models.config" in record.getMessage() for record in caplog.records
    )


def test_empty_config_serves_nothing():
    assert parse_model_server_config("# nothing yet\n") == []


def test_monitoring_example_and_the_default_path(tmp_path):
    assert read_monitoring_config_file(write(tmp_path, MONITORING_EXAMPLE)) == MonitoringConfig(
        enable=True, path="/monitoring/prometheus/metrics"
    )
    enabled = read_monitoring_config_file(write(tmp_path, "prometheus_config { enable: true }", "on.config"))
    assert enabled == MonitoringConfig(enable=True, path=DEFAULT_PROMETHEUS_PATH)
    assert DEFAULT_PROMETHEUS_PATH == "/monitoring/prometheus/metrics"  # PrometheusExporter::kPrometheusPath
    assert read_monitoring_config_file(write(tmp_path, "", "off.config")).enable is False


def test_batching_example_unwraps_the_wrappers_and_keeps_only_present_fields(tmp_path):
    assert read_batching_parameters_file(write(tmp_path, BATCHING_EXAMPLE)) == {
        "max_batch_size": 128,
        "batch_timeout_micros": 0,
        "max_enqueued_batches": 1000000,
        "num_batch_threads": 8,
    }
    text = """max_batch_size { value: 8 }
    allowed_batch_sizes: 2
    allowed_batch_sizes: 8
    pad_variable_length_inputs: true
    thread_pool_name { value: 'pool' }
    enable_large_batch_splitting { value: true }
    max_execution_batch_size { value: 4 }"""
    parameters = read_batching_parameters_file(write(tmp_path, text, "more.config"))
    assert parameters == {
        "max_batch_size": 8,
        "allowed_batch_sizes": (2, 8),
        "pad_variable_length_inputs": True,
        "thread_pool_name": "pool",
        "enable_large_batch_splitting": True,
        "max_execution_batch_size": 4,
    }
    assert type(parameters["enable_large_batch_splitting"]) is bool
    assert read_batching_parameters_file(write(tmp_path, "", "empty.config")) == {}


def test_message_classes_match_tf_serving_field_names_and_numbers():
    protos = _protos()
    model = protos.pool.FindMessageTypeByName("tensorflow.serving.ModelConfig")
    assert {field.name: field.number for field in model.fields} == {
        "name": 1,
        "base_path": 2,
        "model_type": 3,
        "model_platform": 4,
        "logging_config": 6,
        "model_version_policy": 7,
        "version_labels": 8,
    }
    policy = protos.pool.FindMessageTypeByName(
        "tensorflow.serving.FileSystemStoragePathSourceConfig.ServableVersionPolicy"
    )
    assert {field.name: field.number for field in policy.fields} == {"latest": 100, "all": 101, "specific": 102}
    server = protos.ModelServerConfig.DESCRIPTOR
    assert {field.name: field.number for field in server.fields} == {"model_config_list": 1, "custom_model_config": 2}
    batching = protos.BatchingParameters.DESCRIPTOR.fields_by_name
    assert [
        batching[name].number
        for name in (
            "max_batch_size",
            "batch_timeout_micros",
            "max_enqueued_batches",
            "num_batch_threads",
            "thread_pool_name",
            "allowed_batch_sizes",
            "pad_variable_length_inputs",
        )
    ] == [1, 2, 3, 4, 5, 6, 7]
    prometheus = protos.MonitoringConfig.DESCRIPTOR.fields_by_name["prometheus_config"].message_type
    assert {field.name: field.number for field in prometheus.fields} == {"enable": 1, "path": 2}


# -- bad files ----------------------------------------------------------------------------------------

BAD_MODEL_CONFIGS = [
    # (text, words the error must contain)
    ("model_config_list {\n  config {\n    name: 'a'\n    bogus: 1\n  }\n}", ["models.config:4:5", "bogus"]),
    ("model_config_list {\n  config {\n    name: 'a'\n", ["models.config:3:", 'Expected "}"']),
    (
        "model_config_list { config { name: 'a' base_path: '/a' version_labels { key: 's' value: 'x' } } }",
        ["models.config:1:", "integer"],
    ),
    (
        "model_config_list { config { name: 'a' base_path: '/a' model_version_policy { latest {} all {} } } }",
        ["models.config:1:", "oneof"],
    ),
    (
        "model_config_list { config { name: 'a' base_path: '/a' } config { name: 'a' base_path: '/b' } }",
        ["models.config", "Illegal to list model a multiple times in config list"],
    ),
    ("model_config_list { config { base_path: '/a' } }", ["config[0]", "has no name"]),
    ("model_config_list { config { name: 'a' } }", ["config[0]", "model a", "no base_path"]),
    ("custom_model_config { }", ["custom_model_config is not supported", "model_config_list"]),
    (
        "model_config_list { config { name: 'a' base_path: '/a' model_version_policy { specific { } } } }",
        ["model a", "lists no versions"],
    ),
    (
        "model_config_list { config { name: 'a' base_path: '/a' version_labels { key: '' value: 1 } } }",
        ["model a", "non-empty strings"],
    ),
]


@pytest.mark.parametrize("text, words", BAD_MODEL_CONFIGS, ids=[case[1][-1][:30] for case in BAD_MODEL_CONFIGS])
def test_bad_model_config_files_name_the_file_place_and_problem(tmp_path, text, words):
    path = write(tmp_path, text)
    with pytest.raises(ValueError) as raised:
        read_model_config_file(path)
    message = str(raised.value)
    assert str(path) in message
    for word in words:
        assert word in message, (word, message)


def test_a_label_on_a_version_outside_a_specific_policy_parses_tf_checks_it_at_load():
    (config,) = parse_model_server_config(one_model(SPECIFIC_ONE + "version_labels { key: 'canary' value: 7 }"))
    assert dict(config.version_labels) == {"canary": 7}


def test_missing_and_non_text_files_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="model config file .*missing.config does not exist") as raised:
        read_model_config_file(tmp_path / "missing.config")
    assert isinstance(raised.value, ConfigError)  # ours: `except TorchEstimatorError` catches it, the CLI says one line
    with pytest.raises(ConfigError, match="multiple times"):
        parse_model_server_config(
            "model_config_list { config { name: 'm' base_path: '/a' } config { name: 'm' base_path: '/b' } }"
        )
    binary = tmp_path / "binary.config"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="not UTF-8 text"):
        read_monitoring_config_file(binary)


def test_bad_batching_and_monitoring_files(tmp_path):
    with pytest.raises(ValueError, match=r"max_batch_size \{ value: 4 \}|Last entry in allowed_batch_sizes"):
        read_batching_parameters_file(
            write(tmp_path, "max_batch_size { value: 4 }\nallowed_batch_sizes: 2\nallowed_batch_sizes: 3\n")
        )
    with pytest.raises(ValueError, match="strictly increasing"):
        read_batching_parameters_file(write(tmp_path, "allowed_batch_sizes: 4\nallowed_batch_sizes: 2\n", "b.config"))
    with pytest.raises(ValueError, match=r"b2.config:1:17: .*Expected \"{\""):
        read_batching_parameters_file(write(tmp_path, "max_batch_size: 128", "b2.config"))  # needs { value: }
    with pytest.raises(ValueError, match="must start with '/'"):
        read_monitoring_config_file(write(tmp_path, "prometheus_config { enable: true path: 'metrics' }", "m.config"))


# -- the dataclasses' own checks -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments, words",
    [
        ({"kind": "newest"}, "must be one of"),
        ({"num_versions": 0}, "int >= 1"),
        ({"kind": "specific"}, "at least one version"),
        ({"kind": "latest", "versions": (1,)}, "only for kind='specific'"),
        ({"kind": "all", "num_versions": 2}, "only for kind='latest'"),
        ({"kind": "specific", "versions": ("1",)}, "must be ints"),
    ],
)
def test_version_policy_refuses_bad_combinations(arguments, words):
    with pytest.raises(ValueError, match=words):
        VersionPolicy(**arguments)


def test_version_policy_picks_aspired_versions_from_those_on_disk():
    on_disk = [3, 1, 7, 5]
    assert VersionPolicy().aspired(on_disk) == [7]
    assert VersionPolicy(num_versions=2).aspired(on_disk) == [5, 7]
    assert VersionPolicy(num_versions=9).aspired(on_disk) == [1, 3, 5, 7]
    assert VersionPolicy(kind="all").aspired(on_disk) == [1, 3, 5, 7]
    assert VersionPolicy(kind="specific", versions=(5, 1, 2)).aspired(on_disk) == [1, 5]  # 2 is not on disk
    assert VersionPolicy().aspired([]) == []


def test_model_config_checks_its_fields():
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        ModelConfig(name="", base_path="/a")
    with pytest.raises(ValueError, match="base_path of model 'a'"):
        ModelConfig(name="a", base_path="")
    with pytest.raises(ValueError, match="must map to an int version"):
        ModelConfig(name="a", base_path="/a", version_labels={"stable": "1"})
    with pytest.raises(TypeError, match="VersionPolicy"):
        ModelConfig(name="a", base_path="/a", version_policy="latest")
    config = ModelConfig(name="a", base_path="relative/path", version_labels={"stable": 1})
    assert config.base_path == "relative/path"  # kept as given (TF refuses it without a root dir)
    with pytest.raises(TypeError):
        config.version_labels["stable"] = 2  # frozen all the way down


# -- files that are not what they should be: every problem a ValueError naming the file ----------------

READERS = [read_model_config_file, read_batching_parameters_file, read_monitoring_config_file]


@pytest.mark.parametrize("reader", READERS, ids=lambda reader: reader.__name__)
def test_a_folder_a_fifo_a_device_an_unreadable_and_a_huge_file_are_value_errors_naming_it(tmp_path, reader):
    import os

    from torchestimator.serving import config as config_module

    with pytest.raises(ValueError, match=rf"{tmp_path} is a folder"):
        reader(tmp_path)  # IsADirectoryError was raw
    fifo = tmp_path / "fifo.config"
    os.mkfifo(fifo)  # no writer: a blocking open would hang here for good
    with pytest.raises(ValueError, match=r"fifo.config is not a regular file"):
        reader(fifo)
    with pytest.raises(ValueError, match=r"/dev/zero is not a regular file"):
        reader("/dev/zero")  # would be read for ever
    huge = tmp_path / "huge.config"
    with open(huge, "wb") as file:
        file.truncate(config_module.MAX_CONFIG_BYTES + 1)  # sparse: no disk used
    with pytest.raises(ValueError, match=r"huge.config is larger than 16 MiB"):
        reader(huge)
    loop = tmp_path / "loop.config"
    loop.symlink_to(loop)  # ELOOP: an OSError that is neither missing nor permission
    with pytest.raises(ValueError, match=r"loop.config could not be opened"):
        reader(loop)
    too_long = tmp_path / ("x" * 300)  # ENAMETOOLONG
    with pytest.raises(ValueError, match=r"could not be opened"):
        reader(too_long)


def test_an_unreadable_file_is_a_value_error_naming_it(tmp_path, monkeypatch):
    import builtins
    import os

    path = write(tmp_path, BASIC_EXAMPLE)
    real_open = os.open

    def refusing_open(name, *arguments, **keywords):  # CI runs as root, so chmod 000 would still read
        if os.fspath(name) == str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(name, *arguments, **keywords)

    monkeypatch.setattr(os, "open", refusing_open)
    monkeypatch.setattr(builtins, "open", lambda name, *a, **k: refusing_open(name))  # the old reader's way in
    with pytest.raises(ValueError, match=rf"{path} could not be opened \(Permission denied\)"):
        read_model_config_file(path)


# -- batching numbers out of TF's range ------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, words",
    [
        ("max_batch_size { value: -5 }", "max_batch_size must be positive; was -5"),
        ("max_batch_size { value: 0 }", "max_batch_size must be positive; was 0"),
        ("batch_timeout_micros { value: -1 }", "batch_timeout_micros must be non-negative; was -1"),
        ("num_batch_threads { value: 0 }", "num_batch_threads must be positive; was 0"),
        ("max_enqueued_batches { value: 0 }", "max_enqueued_batches must be positive; was 0"),
        ("max_execution_batch_size { value: -2 }", "max_execution_batch_size must be positive; was -2"),
        (
            "max_batch_size { value: 4 } allowed_batch_sizes: 0 allowed_batch_sizes: 4",
            r"allowed_batch_sizes\[0\] must be positive; was 0",
        ),
        (
            "max_batch_size { value: 4 } allowed_batch_sizes: 2 allowed_batch_sizes: 2 allowed_batch_sizes: 4",
            "strictly increasing",
        ),
    ],
)
def test_batching_numbers_out_of_range_are_refused_naming_file_field_and_value(tmp_path, text, words):
    path = write(tmp_path, text, "batching.config")
    with pytest.raises(ValueError, match=rf"{path}: .*{words}"):
        read_batching_parameters_file(path)


def test_batching_numbers_at_the_edge_of_the_range_are_accepted(tmp_path):
    path = write(
        tmp_path,
        "max_batch_size { value: 1 } batch_timeout_micros { value: 0 } "
        "max_enqueued_batches { value: 1 } num_batch_threads { value: 1 } allowed_batch_sizes: 1",
        "batching.config",
    )
    assert read_batching_parameters_file(path) == {
        "max_batch_size": 1,
        "batch_timeout_micros": 0,
        "max_enqueued_batches": 1,
        "num_batch_threads": 1,
        "allowed_batch_sizes": (1,),
    }


# -- names that cannot be routed ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, shown",
    [
        ("a/b", "'/'"),
        ("a:predict", "':'"),
        ("a\\x00b", r"'\x00'"),
        ("a\\nb", r"'\n'"),
        ("a\\x7f", r"'\x7f'"),
        ("..", "dot segment"),
    ],
)
def test_model_names_that_cannot_be_routed_are_refused_naming_file_and_line(tmp_path, name, shown):
    text = (
        "model_config_list {\n  config { name: 'ok' base_path: '/ok' }\n  # name: 'a comment'\n"
        f"  config {{\n    name: '{name}'\n    base_path: '/bad'\n  }}\n}}\n"
    )
    path = write(tmp_path, text)
    with pytest.raises(ValueError) as raised:
        read_model_config_file(path)
    message = str(raised.value)
    assert f"{path}:5: model_config_list.config[1]" in message, message
    assert shown in message and "model name" in message, message


def test_version_labels_that_cannot_be_routed_are_refused(tmp_path):
    path = write(tmp_path, one_model("version_labels { key: 'can/ary' value: 1 }"))
    with pytest.raises(ValueError, match=rf"{path}: model_config_list.config\[0\] .*version label 'can/ary' .*'/'"):
        read_model_config_file(path)
    with pytest.raises(ValueError, match="cannot be routed"):
        ModelConfig(name="a", base_path="/a", version_labels={"x:y": 1})
    with pytest.raises(ValueError, match="ModelConfig.name 'a/b'"):
        ModelConfig(name="a/b", base_path="/a")  # --model_name goes through ModelConfig too
    assert ModelConfig(name="my-model_1.v2 x", base_path="/a").name == "my-model_1.v2 x"  # what TF routes


# -- a reload hitting a broken file keeps the running models --------------------------------------------


def test_a_reload_hitting_a_folder_a_fifo_or_an_unroutable_name_keeps_the_running_models(tmp_path, caplog):
    import os

    from torchestimator.serving import start

    config = tmp_path / "models.config"
    config.write_text(f"model_config_list {{ config {{ name: 'a' base_path: '{tmp_path / 'a'}' }} }}")
    broken = {
        "a folder": lambda: (config.unlink(), config.mkdir()),
        "a fifo": lambda: (config.rmdir(), os.mkfifo(config)),
        "an unroutable name": lambda: (
            config.unlink(),
            config.write_text(f"model_config_list {{ config {{ name: 'b/c' base_path: '{tmp_path / 'b'}' }} }}"),
        ),
    }
    caplog.set_level(logging.ERROR, logger="torchestimator.serving.server")

    def keeps(words):
        wait_until(
            lambda: any(words in record.getMessage() for record in caplog.records),
            timeout=20,
            what=f"a reload refused with {words!r}",
        )

    with start(
        model_config_file=str(config), model_config_file_poll_wait_seconds=0.05, file_system_poll_wait_seconds=0
    ) as server:
        for kind, breaking in broken.items():
            caplog.clear()
            breaking()
            keeps(
                {
                    "a folder": "is a folder",
                    "a fifo": "not a regular file",
                    "an unroutable name": "the model name 'b/c'",
                }[kind]
            )
            assert sorted(server.managers) == ["a"], kind
        config.unlink()
        config.write_text(f"model_config_list {{ config {{ name: 'b' base_path: '{tmp_path / 'b'}' }} }}")
        wait_until(lambda: sorted(server.managers) == ["b"], timeout=20, what="the good config file picked up again")
