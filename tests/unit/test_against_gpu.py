"""benchmarks/published/against_gpu.py: the modelled runs say what the GPU ran, and the tables match
like with like."""

from __future__ import annotations

from benchmarks.published import against_gpu


def test_the_modelled_run_gets_unfused_attention_and_every_fusion_off():
    flags = against_gpu.as_the_gpu_ran(
        ["--num-layers", "2", "--attention-backend", "flash", "--no-rope-fusion"]
    )
    assert flags[:2] == ["--num-layers", "2"]
    assert (
        flags.count("--attention-backend") == 1 and flags[flags.index("--attention-backend") + 1] == "unfused"
    )
    assert flags.count("--no-rope-fusion") == 1
    assert set(against_gpu.NO_FUSIONS) <= set(flags)


def test_ops_are_matched_by_family_and_copies_are_one_family():
    profile = {
        "iterations": 2,
        "aten_ops": [
            {
                "name": "aten::copy_",
                "device_us": 4000.0,
                "count": 8,
            },  # the casts' kernels, 2 ms per iteration
            {"name": "aten::mm", "device_us": 20000.0, "count": 40},
            {"name": "aten::masked_fill_", "device_us": 3000.0, "count": 4},
        ],
    }
    modelled = {
        "_to_copy.default": 1.5e6,
        "mm.default": 9.0e6,
        "masked_fill_.Scalar": 1.0e6,
        "gelu.default": 0.5e6,
    }
    rows = {r["op"]: r for r in against_gpu.op_rows(profile, modelled)}
    assert rows["copy"] == {"op": "copy", "measured_ms": 2.0, "modelled_ms": 1.5}
    assert rows["mm"]["measured_ms"] == 10.0 and rows["mm"]["modelled_ms"] == 9.0
    assert rows["gelu"]["measured_ms"] is None  # the GPU's profile has no such op: shown, not matched
    assert against_gpu.op_rows(profile, modelled)[0]["op"] == "mm"  # the largest first
    assert against_gpu.op_rows(None, modelled) == [] and against_gpu.op_rows(profile, None) == []


def test_memory_rows_diff_the_gpus_groups_against_the_modelled_ones():
    group = {"site": "megatron/core/fusions/fused_softmax.py:314 forward_torch_softmax", "size": 1024}
    measured = {"groups": [{**group, "count": 2, "bytes": 2048}]}
    modelled = {"groups": [{**group, "count": 1, "bytes": 1024}]}
    (row,) = against_gpu.memory_rows("job", measured, modelled)
    assert (row["measured"], row["modelled"], row["bytes"]) == (2, 1, -1024)
    (alone,) = against_gpu.memory_rows("job", None, modelled)
    assert alone["measured"] is None and alone["modelled"] == 1


def test_groups_past_either_sides_cut_are_not_read_as_absent():
    shared = {"site": "a.py:1 f", "size": 1024}
    measured = {"num_groups": 2, "groups": [{**shared, "count": 3, "bytes": 3072}]}  # cut: one group left out
    modelled = {"num_groups": 2, "groups": [{**shared, "count": 1, "bytes": 1024},
                                            {"site": "b.py:2 g", "size": 512, "count": 1, "bytes": 512}]}  # fmt: skip
    rows = against_gpu.memory_rows("job", measured, modelled)
    assert [(r["site"], r["bytes"]) for r in rows] == [("a.py:1 f", -2048)]  # b.py may sit past the GPU's cut
    assert rows[0]["partial"]


def test_the_results_say_when_the_two_sides_ran_different_megatron_releases():
    env = {"python": "3.11.7", "torch": "2.13.0", "megatron_core": "0.16.1", "prism_megatron": "0.1.0",
           "platform": "Linux", "cpu_count": 2, "load_average_1min": 0.5}  # fmt: skip
    result = {
        "date": "2026-12-06", "gpu_results": "g.json", "measured_on": "gpu-host", "rows": [], "runs": {},
        "environment": env, "measured_environment": {**env, "megatron_core": "0.19.2", "torch": "2.11.0"},
    }  # fmt: skip
    text = against_gpu.markdown(result)
    assert "megatron-core 0.19.2" in text and "megatron-core 0.16.1" in text
    assert "**Not the same program**" in text
    same = against_gpu.markdown({**result, "measured_environment": env})
    assert "Not the same program" not in same


def test_the_gpus_op_calls_are_matched_by_shape_and_dtype_and_show_both_layouts():
    bf16_in = [{"shape": [2048, 2, 4096], "dtype": "c10::BFloat16", "stride": [8192, 4096, 1]},
               {"shape": [2048, 2, 4096], "dtype": "c10::BFloat16", "stride": [4096, 8388608, 1]}]  # fmt: skip
    profile = {
        "iterations": 4,
        "aten_op_calls": [
            {"name": "aten::copy_", "inputs": bf16_in, "device_us": 9000.0, "count": 8},
            {"name": "aten::add", "inputs": [*bf16_in, {"shape": [], "dtype": "Scalar", "stride": []}],
             "device_us": 24000.0, "count": 64},
            {"name": "aten::mul", "inputs": [{"shape": [8], "dtype": "float", "stride": [1]}],
             "device_us": 4.0, "count": 4},
        ],
    }  # fmt: skip
    modelled = [
        {"op": "add.Tensor", "ns": 1_600_000, "count": 128, "inputs": [
            {"shape": [2048, 2, 4096], "dtype": "bfloat16", "stride": [8192, 4096, 1]}] * 2},
    ]  # fmt: skip
    rows = against_gpu.call_rows(profile, modelled)
    assert [r["op"] for r in rows] == ["add", "mul"]  # copies left out (the family table has them)
    add = rows[0]
    assert add["measured_ms"] == 6.0 and add["modelled_ms"] == 1.6
    assert "/[4096, 8388608, 1]" in add["measured_layout"] and "8388608" not in add["modelled_layout"]
    assert rows[1]["modelled_ms"] is None
    assert against_gpu.call_rows(profile, None) == []


def test_a_profiler_without_dtypes_or_strides_is_matched_by_shapes():
    profile = {"iterations": 1, "aten_op_calls": [
        {"name": "aten::add", "inputs": [{"shape": [4, 8], "dtype": "", "stride": None}] * 2,
         "device_us": 10.0, "count": 1}]}  # fmt: skip
    modelled = [{"op": "add.Tensor", "ns": 5000, "count": 1,
                 "inputs": [{"shape": [4, 8], "dtype": "bfloat16", "stride": [8, 1]}] * 2}]  # fmt: skip
    (row,) = against_gpu.call_rows(profile, modelled)
    assert row["modelled_ms"] == 0.005 and row["measured_layout"] == "[4, 8] [4, 8]"
