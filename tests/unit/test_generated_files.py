"""The files made from the catalog and the schema (``python -m fedapp.generated_files``) are current, and
a method added to the catalog reaches the index, the navigation and the defaults with no other edit (issue 64)."""

from __future__ import annotations

import shutil
from dataclasses import replace

import fedapp.builtin_methods as builtin
from fedapp import catalog, generated_files
from fedapp.generated_files import generated, main, out_of_date
from tests.paths import ROOT

FILES = ("README.md", "docs/index.md", "mkdocs.yml", "pyproject.toml", "docs/configuration.md")


def copy_of_the_repository(tmp_path):
    for name in FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    return tmp_path


def test_the_generated_files_are_current(capsys):
    assert out_of_date() == []
    assert main([]) == 0 and capsys.readouterr().err == ""
    # docs/extending.md's command, as typed: with every file current it rewrites none
    assert main(["--write"]) == 0 and capsys.readouterr().out == ""


def test_a_stale_row_is_found(tmp_path):
    root = copy_of_the_repository(tmp_path)
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("[SDFed](docs/methods/sdfed.md)", "[SDFed](docs/methods/old.md)"))
    assert out_of_date(root) == [readme]
    assert "[SDFed](docs/methods/sdfed.md)" in generated(root)[readme]


def test_a_method_in_the_catalog_gets_its_index_row_and_its_page_in_the_navigation(tmp_path, monkeypatch):
    root = copy_of_the_repository(tmp_path)
    (root / "conf" / "fedavg-x-digits.yaml").write_text("method: fedavg-x\ndataset: digits\n")
    (root / "conf" / "fedavg-x-vitb16.yaml").write_text('method: fedavg-x\npretrained: "openai"\ndataset: cifar100\n')
    new = replace(builtin.FEDAVG, name="fedavg-x", title="FedAvg-X", page="methods/fedavg-x.md")
    new = replace(new, borrowed_presets=("fedavg-cifar10",))
    monkeypatch.setattr(builtin, "BUILTIN", (*builtin.BUILTIN, new))
    monkeypatch.setattr(generated_files, "CATALOG", {**catalog.CATALOG, "fedavg-x": new})
    files = generated(root)
    row = (
        "| `fedavg-x` | `fedavg-x-digits` | `fedavg-cifar10`† | `fedavg-x-vitb16` (CIFAR-100) "
        "| [FedAvg-X](docs/methods/fedavg-x.md) |"
    )
    assert files[root / "README.md"].count(row) == 1
    assert row.replace("docs/methods", "methods") in files[root / "docs" / "index.md"]
    assert "      - FedAvg-X: methods/fedavg-x.md\n  - Evaluation protocols" in files[root / "mkdocs.yml"]
