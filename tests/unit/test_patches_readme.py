"""prism_megatron/patches/README.md is the catalog's table, generated (`make patches-readme`)."""

from __future__ import annotations

from prism_megatron.patches import catalog


def test_the_readme_is_what_the_catalog_generates():
    with open(catalog.README, encoding="utf-8") as f:
        written = f.read()
    assert written == catalog.readme(), (
        f"prism_megatron/patches/README.md differs from the catalog; run {catalog.REGENERATE}"
    )


def test_the_readme_lists_every_record_with_its_target_and_versions():
    text = catalog.readme()
    for record in catalog.all_patches():
        rows = [line for line in text.splitlines() if line.startswith(f"| `{record.name}` |")]
        assert any(f"`{record.target}`" in row and ", ".join(record.verified_on) in row for row in rows)
    for name in ("build.mla_have_te", "build.current_device", "build.tensor_cuda", "plan.gbuf_range_map"):
        assert f"| `{name}` |" in text
