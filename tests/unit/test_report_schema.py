"""report.json's schema: what it accepts, and errors that name the key path of every problem."""

import copy
import dataclasses

import pytest

from prism_megatron.report import (
    Failure,
    RankReport,
    RoleReport,
    RunReport,
    SchemaError,
    TargetJob,
    iterations_from_times,
    median_iteration_time_s,
    validate,
)
from prism_megatron.report.schema import SCHEMA_VERSION
from prism_megatron.topology import Layout


def _doc(**changes):
    iterations = iterations_from_times([2.0, 1.0, 1.2, 1.1], num_warmup=1)
    report = RunReport(
        target=TargetJob.from_layout(
            Layout(world_size=16, tp=2, pp=2), micro_batch_size=1, global_batch_size=8, seq_length=128
        ),
        real_ranks=(0, 5),
        iterations=iterations,
        iteration_time_s=median_iteration_time_s(iterations),
        ranks={
            0: RankReport(
                virtual_rank=0,
                peak_memory_allocated_bytes=100,
                compute_s=0.6,
                exposed_comm_s=0.1,
                bubble_s=0.3,
            ),
            5: RankReport(virtual_rank=5, peak_memory_allocated_bytes=120, cpu_threads=1, cpu_cores=(1,)),
        },
        roles=(
            RoleReport(role="pp0", virtual_rank=0, count=8, compute_s=0.6, exposed_comm_s=0.1, bubble_s=0.3),
            RoleReport(role="pp1", virtual_rank=4, count=8, compute_s=0.6, exposed_comm_s=0.2, bubble_s=0.2),
        ),
        simulated_iteration_time_s=1.0,
    )
    doc = report.to_json()
    doc.update(changes)
    return doc


def _errors(doc):
    with pytest.raises(SchemaError) as info:
        validate(doc)
    return info.value.errors


def test_a_complete_report_is_valid_and_says_its_schema_version():
    doc = _doc()
    validate(doc)
    assert doc["schema_version"] == SCHEMA_VERSION
    assert doc["iteration_time_s"] == 1.1  # median of 1.0, 1.2, 1.1


def test_negative_times_and_sizes_are_refused_with_their_key_path():
    doc = _doc()
    doc["ranks"]["0"]["compute_s"] = -0.1
    doc["target"]["tp"] = 0
    assert _errors(doc) == [
        "$.target.tp: must be >= 1, got 0",
        "$.ranks.0.compute_s: must be >= 0, got -0.1",
    ]


def test_types_are_json_types_and_a_boolean_is_not_a_number():
    doc = _doc(real_ranks=[0, True], iterations="four")
    doc["target"]["seq_length"] = "128"
    errors = _errors(doc)
    assert "$.target.seq_length: must be an integer, got '128'" in errors
    assert "$.real_ranks[1]: must be an integer, got True" in errors
    assert "$.iterations: must be an array, got str" in errors


def test_missing_and_unknown_keys_are_named():
    doc = _doc(throughput=3)
    del doc["target"]["seq_length"]
    del doc["versions"]
    errors = _errors(doc)
    assert "$.target: missing key 'seq_length'" in errors
    assert "$: missing key 'versions'" in errors
    assert "$: unknown key(s) 'throughput'" in errors


def test_ranks_must_be_inside_the_world_and_real():
    doc = _doc(real_ranks=[0, 5, 16])
    doc["ranks"]["7"] = copy.deepcopy(doc["ranks"]["5"])
    errors = _errors(doc)
    assert "$.real_ranks: rank 16 is outside the world (0..15)" in errors
    assert "$.ranks.7: virtual rank 7 is not one of real_ranks [0, 5, 16]" in errors
    assert "$.ranks: an ok run reports every real rank; missing [16]" in errors


def test_iteration_indices_must_increase_and_the_iteration_time_be_their_median_after_warmup():
    doc = _doc()
    doc["iterations"][2]["index"] = 1
    assert _errors(doc) == ["$.iterations: indices must increase, got [0, 1, 1, 3]"]
    wrong_median = _doc(iteration_time_s=1.0)
    assert _errors(wrong_median)[0].startswith("$.iteration_time_s: must be the median")


def test_the_parallel_sizes_must_agree():
    doc = _doc()
    doc["target"]["dp"] = 8
    assert _errors(doc) == ["$.target.dp: must be world_size / (tp * pp * cp) = 16/4, got 8"]


def test_each_role_adds_up_to_the_simulated_time_and_the_roles_cover_the_world():
    doc = _doc(simulated_iteration_time_s=1.5)
    doc["roles"]["pp1"]["count"] = 4
    errors = _errors(doc)
    assert any(e.startswith("$.roles.pp0: compute_s + exposed_comm_s + bubble_s") for e in errors)
    assert "$.roles: the role counts must add up to world_size 16" in errors


def test_a_failed_run_says_why_and_only_a_failed_or_interrupted_run_has_a_failure():
    assert _errors(_doc(status="failed")) == [
        "$.failure: a failed run must say why (message, dead_rank, last_op)"
    ]
    failure = {"message": "rank 5 died", "dead_rank": 5, "last_op": None}
    assert _errors(_doc(failure=failure)) == [
        "$.failure: only a failed or interrupted run has a failure, but status is 'ok'"
    ]
    failed = _doc(status="failed", failure=failure, ranks={})  # a failed run may lack rank results
    validate(failed)
    assert _errors(_doc(status="failed", failure={**failure, "dead_rank": 99}))[0] == (
        "$.failure.dead_rank: rank 99 is outside the world (0..15)"
    )
    assert _errors(_doc(status="done"))[0] == (
        "$.status: must be one of ok, failed, running, interrupted, got 'done'"
    )
    # Stopped by a signal: what was measured so far, and why it stopped (or not).
    validate(_doc(status="interrupted", ranks={}, failure={**failure, "message": "interrupted by SIGTERM"}))
    validate(_doc(status="interrupted", ranks={}, real_ranks=[]))


def test_a_newer_schema_is_refused_with_what_to_do():
    with pytest.raises(SchemaError, match="upgrade prism-megatron"):
        validate(_doc(schema_version=SCHEMA_VERSION + 1))


def test_every_problem_is_reported_at_once():
    doc = _doc(tflops_per_gpu=-1.0, simulated_iteration_time_s=float("nan"))
    doc["ranks"]["5"]["bubble_s"] = "slow"
    errors = _errors(doc)
    assert len(errors) == 3
    assert "$.simulated_iteration_time_s: must be finite, got nan" in errors


def test_a_report_round_trips_through_json():
    report = RunReport.from_json(_doc())
    assert report.to_json() == _doc() | {"created": report.created}
    failed = RunReport.from_json(
        _doc(status="failed", failure={"message": "x", "dead_rank": 3, "last_op": "y"})
    )
    assert failed.failure == Failure(message="x", dead_rank=3, last_op="y")


def test_the_shape_is_a_json_schema_file_that_jsonschema_itself_checks():
    import jsonschema

    from prism_megatron.report.schema import SCHEMA_FILE, json_schema

    assert SCHEMA_FILE.endswith("report.schema.json")
    schema = json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(_doc(), schema, cls=jsonschema.Draft202012Validator)  # valid without our code
    bad = _doc()
    bad["target"]["tp"] = 0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema, cls=jsonschema.Draft202012Validator)
    # What the schema cannot say is still checked: the median, which jsonschema accepts.
    wrong_median = _doc(iteration_time_s=5.0)
    jsonschema.validate(wrong_median, schema, cls=jsonschema.Draft202012Validator)
    assert _errors(wrong_median)[0].startswith("$.iteration_time_s: must be the median")


def test_tokens_per_second_per_gpu_and_megatrons_names_are_reported():
    doc = _doc(tokens_per_s_per_gpu=8 * 128 / (1.1 * 16))
    validate(doc)
    assert doc["megatron_names"]["iteration_time_s"].startswith("elapsed time per iteration (ms)")
    assert doc["megatron_names"]["tflops_per_gpu"].startswith("throughput per GPU (TFLOP/s/GPU)")
    assert _errors(_doc(tokens_per_s_per_gpu=1.0))[0].startswith(
        "$.tokens_per_s_per_gpu: must be global_batch_size x seq_length / (iteration_time_s x world_size)"
    )


def _capture_doc():
    from prism_megatron.report.model import CaptureSummary

    capture = CaptureSummary(
        num_roles=2,
        captured_ranks={"pp0": 0},
        classes={"pp0": ("pp0", "pp1")},
        num_passes=1,
        capture_s=12.5,
    )
    return _doc(capture=capture.to_json()), capture


def test_the_capture_says_how_many_roles_ran_for_how_many_and_reads_back():
    doc, capture = _capture_doc()
    validate(doc)
    assert doc["capture"]["num_captured_roles"] == 1 and doc["capture"]["num_roles"] == 2
    assert RunReport.from_json(doc).capture == capture
    assert capture.describe() == "1 of 2 roles captured (1 program) in 1 pass, 12.5 s"
    earlier = dataclasses.replace(capture, num_passes=None, capture_s=None)
    assert (
        earlier.describe()
        == "1 of 2 roles captured (1 program) before this report (--prism-graph, or passes launched by hand)"
    )


def test_capture_classes_must_hold_every_role_once_and_count_what_was_captured():
    doc, _ = _capture_doc()
    doc["capture"]["classes"] = {"pp0": ["pp0", "pp0"]}
    doc["capture"]["num_captured_roles"] = 3
    doc["capture"]["captured_ranks"]["pp9"] = 99
    assert _errors(doc) == [
        "$.capture.classes: must hold each of the 2 roles once, holds 2",
        "$.capture.num_captured_roles: must count $.capture.captured_ranks",
        "$.capture.captured_ranks: roles ['pp9'] are in no class",
        "$.capture.captured_ranks: rank 99 is outside the world",
    ]


def test_a_cpu_ranks_share_of_the_machine_is_recorded_and_checked():
    doc = _doc()
    assert doc["ranks"]["5"]["cpu_threads"] == 1 and doc["ranks"]["5"]["cpu_cores"] == [1]
    assert doc["ranks"]["0"]["cpu_threads"] is None  # not measured (a cuda rank)
    doc["ranks"]["5"]["cpu_threads"] = 0
    doc["ranks"]["5"]["cpu_cores"] = [-1]
    assert sorted(_errors(doc)) == [
        "$.ranks.5.cpu_cores[0]: must be >= 0, got -1",
        "$.ranks.5.cpu_threads: must be >= 1, got 0",
    ]
