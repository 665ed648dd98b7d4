"""The configuration reference: docs/configuration.md is generated from the schema and names every key once."""

from __future__ import annotations

import re

import pytest

from fedapp.catalog import METHODS
from fedapp.config import SCHEMA
from fedapp.config.reference import COMMAND, GROUPS, Group, allowed, check_groups, key_row, main, render
from tests.paths import ROOT

PAGE = ROOT / "docs" / "configuration.md"
# A table row of the reference starts with its key in a code span.
ROW = re.compile(r"^\| `([a-z0-9-]+)` \|", re.MULTILINE)


def test_the_committed_reference_is_the_generated_one():
    assert PAGE.read_text(encoding="utf-8") == render(), (
        f"docs/configuration.md is out of date with the schema in fedapp/config/schema.py: run `{COMMAND}`"
    )


def test_every_key_has_exactly_one_row_in_the_reference():
    rows = ROW.findall(render())
    assert sorted(rows) == sorted(SCHEMA), "every key once, and no row for anything else"
    assert len(rows) == len(set(rows))


def test_every_key_is_in_exactly_one_group():
    named = [name for group in GROUPS for name in group.keys]
    assert sorted(named) == sorted(SCHEMA)
    assert len(named) == len(set(named))
    check_groups()  # what render() runs first


def test_a_key_left_out_or_named_twice_stops_the_generator():
    dropped = tuple(Group(group.title, tuple(k for k in group.keys if k != "lr")) for group in GROUPS)
    with pytest.raises(ValueError, match=r"in no group \['lr'\]"):
        check_groups(dropped)
    doubled = (*GROUPS, Group("Again", ("seed", "no-such-key")))
    with pytest.raises(ValueError, match=r"named twice \['seed'\].*not a key \['no-such-key'\]"):
        check_groups(doubled)


def test_section_headings_are_unique_so_their_anchors_are_stable():
    titles = [group.title for group in GROUPS]
    assert len(titles) == len(set(titles))
    assert all(group.level in (2, 3) for group in GROUPS)


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("alpha", "> 0"),
        ("lr", "> 0"),
        ("weight-decay", "≥ 0"),
        ("fraction-fit", "0 < x ≤ 1"),
        ("momentum", "0 ≤ x ≤ 1"),
        ("image-size", "8 ≤ x ≤ 1024"),
        ("held-out-domain", "≥ -1"),
        ("download", "`true`, `false`"),
        ("local-split", "any text"),
        ("partition", "`iid`, `dirichlet`, `pathological`, `shard`, `domain`"),
    ],
)
def test_allowed_values_read_from_the_schema(key, expected):
    assert allowed(SCHEMA[key]) == expected


def test_method_choices_come_from_the_catalog_and_models_from_the_zoo():
    from fedapp.models import MODEL_NAMES  # noqa: PLC0415 - torch, for this test only

    assert allowed(SCHEMA["method"]) == ", ".join(f"`{name}`" for name in METHODS)
    assert all(f"`{name}`" in allowed(SCHEMA["model"]) for name in MODEL_NAMES)
    assert allowed(SCHEMA["client-models"]).startswith("comma list of: ")


def test_a_row_shows_the_default_as_toml_and_escapes_markdown_in_the_help():
    assert key_row("num-rounds", SCHEMA["num-rounds"]).startswith("| `num-rounds` | int | `15` | ≥ 1 |")
    assert '| `"dirichlet"` |' in key_row("partition", SCHEMA["partition"])
    assert "| `false` |" in key_row("resume", SCHEMA["resume"])
    run_name = key_row("run-name", SCHEMA["run-name"])
    assert "&lt;seed&gt;" in run_name and "<seed>" not in run_name  # not swallowed as an HTML tag
    assert "L\\_str" in key_row("sdfed-alpha", SCHEMA["sdfed-alpha"])
    assert "2\\*\\*22" in key_row("secagg-quantization-range", SCHEMA["secagg-quantization-range"])
    for name, key in SCHEMA.items():
        assert key_row(name, key).count(" | ") == 4, name  # five cells: no stray column break


def test_the_command_prints_the_page_or_writes_it(tmp_path, capsys):
    assert main([]) == 0
    assert capsys.readouterr().out == render()
    target = tmp_path / "configuration.md"
    assert main(["--write", str(target)]) == 0
    assert target.read_text(encoding="utf-8") == render()
    assert capsys.readouterr().out == ""


def test_the_page_keeps_its_introduction_and_links():
    page = render()
    assert page.startswith("<!-- Generated from fedapp/config/schema.py")
    for text in ("[tool.flwr.app.config]", "--run-config 'key=value ...'", 'preset="conf/<name>.yaml"'):
        assert text in page
    for link in ("privacy.md#differential-privacy", "reliability.md#robust-aggregation", "protocols.md#few-shot"):
        assert f"({link})" in page
