"""render(): strict both ways, and every packaged template renders with our mappings."""

from __future__ import annotations

import pytest

from specserve.triton.render import TemplateError, load_template, placeholders, render


def test_render_fills_every_placeholder() -> None:
    assert render("a: ${x}\nb: ${y}", {"x": "1", "y": "two"}) == "a: 1\nb: two"


def test_render_rejects_unknown_key() -> None:
    with pytest.raises(TemplateError, match=r"unknown keys \['z'\]"):
        render("a: ${x}", {"x": "1", "z": "2"})


def test_render_rejects_missing_value() -> None:
    with pytest.raises(TemplateError, match=r"no value for placeholders \['y'\]"):
        render("a: ${x} ${y}", {"x": "1"})


def test_render_rejects_leftover_from_value() -> None:
    with pytest.raises(TemplateError, match="unfilled"):
        render("a: ${x}", {"x": "${oops}"})


def test_render_rejects_non_string_value() -> None:
    with pytest.raises(TemplateError, match="non-strings"):
        render("a: ${x}", {"x": 3})  # type: ignore[dict-item]


def test_tensorrt_llm_template_has_the_pinned_placeholders() -> None:
    names = placeholders(load_template("tensorrt_llm/config.pbtxt"))
    ours = {"model_name", "specserve_extra_inputs", "specserve_extra_outputs",
            "specserve_parameters"}
    # the pinned release's config: 8 structural + 43 parameter placeholders = 51
    assert len(names - ours) == 51
    assert {"triton_backend", "decoupled_mode", "prompt_embedding_table_data_type",
            "engine_dir", "batching_strategy", "medusa_choices", "decoding_mode"} <= names


def test_missing_template_is_an_error() -> None:
    with pytest.raises(TemplateError, match="no such packaged template"):
        load_template("nope/config.pbtxt")
