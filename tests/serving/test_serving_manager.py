"""ModelManager: version policies, availability-preserving swaps and labels, with a fake loader (no torch export)."""

from __future__ import annotations

import shutil
import threading
import time

import pytest
from helpers import wait_until

from torchestimator.serving import ServingError
from torchestimator.serving.config import ModelConfig, VersionPolicy
from torchestimator.serving.manager import ModelManager


class FakeModel:
    """What the manager needs of an ExportedModel: no signatures, so warm-up has nothing to run."""

    signature_names: tuple[str, ...] = ()

    def __init__(self, path: str) -> None:
        self.path = path
        self.version = int(path.rstrip("/").rsplit("/", 1)[-1])


class FakeLoader:
    """Loads a version folder unless it holds a file named ``broken``; can hold a load until released."""

    def __init__(self) -> None:
        self.loaded: list[int] = []
        self.hold: threading.Event | None = None
        self.started = threading.Event()

    def __call__(self, path: str) -> FakeModel:
        model = FakeModel(path)
        self.started.set()
        if self.hold is not None:
            assert self.hold.wait(10), "test forgot to release the held load"
        with open(f"{path}/weights.txt") as file:
            if "broken" in file.read():
                raise ValueError("weights.txt is broken")
        self.loaded.append(model.version)
        return model


def add_versions(base, *versions, broken=False):
    for version in versions:
        (base / str(version)).mkdir(parents=True, exist_ok=True)
        (base / str(version) / "weights.txt").write_text("broken" if broken else f"version {version}")


def manager_for(tmp_path, *versions, **options):
    add_versions(tmp_path / "base", *versions)
    loader = FakeLoader()
    return ModelManager("m", tmp_path / "base", loader=loader, **options), loader


def states(manager):
    return {status.version: status.state for status in manager.statuses()}


def error_of(call, *arguments, **keywords) -> ServingError:
    with pytest.raises(ServingError) as raised:
        call(*arguments, **keywords)
    return raised.value


# -- policies -----------------------------------------------------------------------------------------


def test_default_policy_serves_the_highest_version_and_swaps_to_a_new_one(tmp_path):
    manager, loader = manager_for(tmp_path, 1, 2)
    assert manager.poll() and manager.served_versions == [2] and manager.served_version == 2
    assert loader.loaded == [2]  # version 1 is never aspired
    assert not manager.poll()
    add_versions(tmp_path / "base", 3)
    assert manager.poll() and manager.served_versions == [3]
    assert states(manager) == {2: "END", 3: "AVAILABLE"}
    assert manager.get(2) is None and manager.get().version == 3


def test_latest_n_serves_the_n_highest_and_unloads_the_lowest_when_a_new_one_arrives(tmp_path):
    manager, loader = manager_for(tmp_path, 1, 2, 3, version_policy=VersionPolicy(num_versions=2))
    assert manager.poll() and manager.served_versions == [2, 3]
    assert loader.loaded == [3, 2]  # highest first, as TF loads them
    add_versions(tmp_path / "base", 4)
    assert manager.poll() and manager.served_versions == [3, 4]
    assert states(manager) == {2: "END", 3: "AVAILABLE", 4: "AVAILABLE"}
    assert manager.get(3).version == 3 and manager.get().version == 4


def test_all_policy_serves_every_version_and_drops_a_deleted_one(tmp_path):
    manager, _ = manager_for(tmp_path, 1, 2, 3, version_policy=VersionPolicy(kind="all"))
    assert manager.poll() and manager.served_versions == [1, 2, 3]
    shutil.rmtree(tmp_path / "base" / "2")
    assert manager.poll() and manager.served_versions == [1, 3]
    assert states(manager)[2] == "END"


def test_specific_policy_serves_only_listed_versions_as_they_appear(tmp_path):
    manager, loader = manager_for(tmp_path, 1, 2, version_policy=VersionPolicy(kind="specific", versions=(1, 3)))
    assert manager.poll() and manager.served_versions == [1]
    add_versions(tmp_path / "base", 3, 4)
    assert manager.poll() and manager.served_versions == [1, 3]
    assert sorted(loader.loaded) == [1, 3]  # 2 and 4 are never loaded


def test_nothing_on_disk_or_nothing_aspired_keeps_serving(tmp_path):
    manager, _ = manager_for(tmp_path, 5)
    assert manager.poll()
    shutil.rmtree(tmp_path / "base" / "5")
    assert not manager.poll() and manager.served_versions == [5]
    manager, _ = manager_for(tmp_path / "other", 1, version_policy=VersionPolicy(kind="specific", versions=(9,)))
    assert not manager.poll() and manager.served_versions == []


# -- availability: a failed or slow load never takes the model down ------------------------------------


def test_a_broken_version_keeps_the_old_one_until_repaired(tmp_path):
    manager, loader = manager_for(tmp_path, 1)
    assert manager.poll()
    add_versions(tmp_path / "base", 2, broken=True)
    assert not manager.poll() and manager.served_versions == [1]
    assert not manager.poll() and loader.loaded == [1]  # unchanged files: not retried
    (failed,) = manager.statuses(2)
    assert failed.state == "END" and failed.error_code == "INVALID_ARGUMENT"
    assert "Failed to load version 2 of model m" in failed.error_message and "broken" in failed.error_message
    add_versions(tmp_path / "base", 2)  # repaired: retried
    assert manager.poll() and manager.served_versions == [2]


def test_latest_two_with_one_broken_new_version_still_swaps_in_the_good_one(tmp_path):
    manager, _ = manager_for(tmp_path, 1, 2, version_policy=VersionPolicy(num_versions=2))
    assert manager.poll()
    add_versions(tmp_path / "base", 4, broken=True)
    add_versions(tmp_path / "base", 3)
    # aspired {3, 4}: 3 serves, so 1 and 2 go although 4 failed (TF unloads once an aspired version serves).
    assert manager.poll() and manager.served_versions == [3]


def test_old_version_answers_while_the_new_one_loads(tmp_path):
    manager, loader = manager_for(tmp_path, 1)
    assert manager.poll()
    add_versions(tmp_path / "base", 2)
    loader.hold, loader.started = threading.Event(), threading.Event()
    poller = threading.Thread(target=manager.poll)
    poller.start()
    try:
        assert loader.started.wait(5)
        assert manager.resolve()[0] == 1  # still serving during the load
        assert states(manager) == {1: "AVAILABLE", 2: "LOADING"}
    finally:
        loader.hold.set()
        poller.join(10)
    assert manager.resolve()[0] == 2 and states(manager) == {1: "END", 2: "AVAILABLE"}


def test_readers_never_see_an_empty_model_during_many_swaps(tmp_path):
    manager, _ = manager_for(tmp_path, 1, version_policy=VersionPolicy(num_versions=2))
    assert manager.poll()
    failures, seen, stop = [], set(), threading.Event()

    def read():
        while not stop.is_set():
            try:
                version, model = manager.resolve()
                assert model.version == version
                seen.add(version)
                manager.statuses()
                time.sleep(0.0002)  # let the poller have the GIL now and then
            except Exception as error:  # collected: an assertion in a thread would be lost
                failures.append(error)
                return

    readers = [threading.Thread(target=read) for _ in range(4)]
    for reader in readers:
        reader.start()
    for version in range(2, 25):
        add_versions(tmp_path / "base", version)
        manager.poll()
        # the readers run between swaps
        wait_until(lambda: version in seen or failures, interval=0.001, what=f"a reader seeing version {version}")
        if version > 3:
            shutil.rmtree(tmp_path / "base" / str(version - 3))
    stop.set()
    for reader in readers:
        reader.join(10)
    assert failures == []
    assert manager.served_versions == [23, 24] and seen >= set(range(2, 25))


# -- resolve and statuses: TF's codes and wording ------------------------------------------------------


def test_resolve_errors_use_tf_wording(tmp_path):
    manager, _ = manager_for(tmp_path)
    nothing = error_of(manager.resolve)
    assert (nothing.code, nothing.message) == ("NOT_FOUND", "Servable not found for request: Latest(m)")
    add_versions(tmp_path / "base", 1)
    manager.poll()
    assert manager.resolve(1)[0] == 1
    unknown = error_of(manager.resolve, 7)
    assert (unknown.code, unknown.message) == ("NOT_FOUND", "Servable not found for request: Specific(m, 7)")
    both = error_of(manager.resolve, 1, "stable")
    assert (both.code, both.message) == (
        "INVALID_ARGUMENT",
        "Both model version (1) and model version label (stable) cannot be supplied.",
    )
    label = error_of(manager.resolve, label="stable")
    # ServerCore::GetModelVersionForLabel answers INVALID_ARGUMENT (REST 400) for an unknown label.
    assert (label.code, label.message, label.http_status) == (
        "INVALID_ARGUMENT",
        "Unrecognized servable version label: stable",
        400,
    )


def test_a_label_on_a_version_that_is_not_loaded_is_not_found_naming_label_version_and_state(tmp_path):
    manager, _ = manager_for(tmp_path, 1, version_labels={"canary": 2})  # constructor labels: taken as given
    manager.poll()
    error = error_of(manager.resolve, label="canary")
    assert error.code == "NOT_FOUND"
    assert "Specific(m, 2)" in error.message and "'canary'" in error.message and "never tried" in error.message
    add_versions(tmp_path / "base", 2, broken=True)
    manager.poll()
    assert "END after a failed load" in error_of(manager.resolve, label="canary").message


def test_statuses_filter_and_errors_follow_get_model_status(tmp_path):
    manager, _ = manager_for(tmp_path, 1, 2, version_policy=VersionPolicy(kind="all"))
    error = error_of(manager.statuses)
    assert (error.code, error.message) == ("NOT_FOUND", "Could not find any versions of model m")
    manager.poll()
    manager.set_version_labels({"stable": 1})
    assert [status.version for status in manager.statuses()] == [1, 2]
    assert [status.version for status in manager.statuses(2)] == [2]
    assert [status.version for status in manager.statuses(label="stable")] == [1]
    missing = error_of(manager.statuses, 9)
    assert (missing.code, missing.message) == ("NOT_FOUND", "Could not find version 9 of model m")
    assert error_of(manager.statuses, label="nope").message == "Unrecognized servable version label: nope"
    assert error_of(manager.statuses, 1, "stable").code == "INVALID_ARGUMENT"


# -- labels and config reloads ------------------------------------------------------------------------


def test_labels_point_only_at_loaded_versions_unless_allowed_for_new_labels(tmp_path):
    manager, _ = manager_for(tmp_path, 1, 2, version_policy=VersionPolicy(kind="all"))
    manager.poll()
    manager.set_version_labels({"stable": 1, "canary": 2})
    assert manager.version_labels == {"stable": 1, "canary": 2}
    assert manager.resolve(label="canary")[0] == 2
    with pytest.raises(ValueError, match=r"label 'next' to version 3 of model m.*not currently available"):
        manager.set_version_labels({"stable": 1, "next": 3})
    assert manager.version_labels == {"stable": 1, "canary": 2}  # all or nothing
    manager.set_version_labels({"stable": 1, "canary": 2, "next": 3}, allow_unavailable=True)  # a new label
    with pytest.raises(ValueError, match=r"'stable' to version 3 .*moving it from version 1"):
        manager.set_version_labels({"stable": 3}, allow_unavailable=True)  # moving a label: never early
    manager.set_version_labels({})
    assert manager.version_labels == {}
    for bad in ({"": 1}, {"a/b": 1}, {"stable": "1"}):
        with pytest.raises(ValueError, match="label"):
            manager.set_version_labels(bad)


def test_apply_config_changes_policy_then_checks_labels_after_its_poll(tmp_path):
    manager, _ = manager_for(tmp_path, 1, 2)
    manager.poll()
    assert manager.served_versions == [2]
    config = ModelConfig(
        name="m",
        base_path=str(tmp_path / "base"),
        version_policy=VersionPolicy(kind="specific", versions=(1, 2)),
        version_labels={"stable": 1, "canary": 2},
    )
    assert manager.apply_config(config)  # version 1 loads in this poll, so its label is accepted
    assert manager.served_versions == [1, 2] and manager.version_labels == {"stable": 1, "canary": 2}
    assert manager.version_policy == config.version_policy
    rollback = ModelConfig(
        name="m",
        base_path=str(tmp_path / "base"),
        version_policy=VersionPolicy(kind="specific", versions=(1,)),
        version_labels={"stable": 1, "canary": 2},
    )
    with pytest.raises(ValueError, match="version 2 of model m"):
        manager.apply_config(rollback)  # 2 was unloaded by this very reload
    assert manager.served_versions == [1] and manager.version_labels == {"stable": 1, "canary": 2}
    with pytest.raises(ValueError, match="config of model 'other'"):
        manager.apply_config(ModelConfig(name="other", base_path="/x"))


def test_apply_config_moves_the_base_path(tmp_path):
    manager, _ = manager_for(tmp_path, 1)
    manager.poll()
    add_versions(tmp_path / "moved", 5)
    assert manager.apply_config(ModelConfig(name="m", base_path=str(tmp_path / "moved")))
    assert manager.base_path == str(tmp_path / "moved") and manager.served_versions == [5]


def test_constructor_checks_its_arguments(tmp_path):
    with pytest.raises(ValueError, match="without '/' or ':'"):
        ModelManager("a/b", tmp_path)
    with pytest.raises(TypeError, match="version_policy must be a VersionPolicy"):
        ModelManager("a", tmp_path, version_policy="all")
    assert "serving=[]" in repr(ModelManager("a", tmp_path))


def test_an_emptied_base_keeps_serving_and_says_so_once_not_every_poll(tmp_path, caplog):
    manager, _ = manager_for(tmp_path, 1)
    assert manager.poll() and manager.served_versions == [1]
    shutil.rmtree(tmp_path / "base" / "1")
    with caplog.at_level("WARNING", logger="torchestimator.serving.manager"):
        for _ in range(3):
            assert not manager.poll()
    warnings = [record.getMessage() for record in caplog.records if "no integer version folders" in record.getMessage()]
    assert len(warnings) == 1 and "still serving version(s) [1]" in warnings[0]
    assert manager.served_versions == [1]
