"""The catalog is filled from the ``fedapp.methods`` entry points (issue 64): ours are declared in
pyproject.toml like anyone else's and keep their table's order, another package's methods follow,
and an entry point that cannot be used leaves its method out with the reason a run is refused with."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import tomllib

from fedapp import catalog
from fedapp.builtin_methods import BUILTIN, FEDAVG
from fedapp.catalog import CATALOG, CATALOG_PROBLEMS, ENTRY_POINT_GROUP, MethodSpec
from fedapp.config import resolve_run_config
from fedapp.errors import ConfigError
from fedapp.options import Key
from tests.paths import ROOT

PLUGIN = MethodSpec("zz-mine", "my_pkg.server:S", "my_pkg.client:C", "a user's method", "cnn", "parameters")


def point(name: str, value: str, loaded: object, dist: str = "my-pkg") -> SimpleNamespace:
    def load() -> object:
        if isinstance(loaded, Exception):
            raise loaded
        return loaded

    return SimpleNamespace(name=name, value=value, group=ENTRY_POINT_GROUP, dist=SimpleNamespace(name=dist), load=load)


def ours() -> list[SimpleNamespace]:
    # In the order entry points come: by name.
    return sorted(
        (point(spec.name, f"fedapp.builtin_methods:{spec.name}", spec, dist="fedapp") for spec in BUILTIN),
        key=lambda p: p.name,
    )


def test_our_methods_are_declared_as_entry_points_and_keep_their_table_order():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][ENTRY_POINT_GROUP]
    assert set(declared) == {spec.name for spec in BUILTIN}
    for name, value in declared.items():
        module, _, attribute = value.partition(":")
        assert module == "fedapp.builtin_methods" and getattr(catalog.import_module(module), attribute).name == name
    assert list(CATALOG) == [spec.name for spec in BUILTIN] and CATALOG_PROBLEMS == {}


def test_another_package_s_method_follows_ours(monkeypatch):
    monkeypatch.setattr(catalog, "entry_points", lambda group: [point("zz-mine", "my_pkg:SPEC", PLUGIN), *ours()])
    found, problems = catalog._load_entry_points()
    assert list(found) == [*(spec.name for spec in BUILTIN), "zz-mine"] and problems == {}
    assert found["zz-mine"] is PLUGIN


def test_a_checkout_not_installed_still_has_our_methods(monkeypatch):
    monkeypatch.setattr(catalog, "entry_points", lambda group: [point("zz-mine", "my_pkg:SPEC", PLUGIN)])
    found, _ = catalog._load_entry_points()
    assert list(found) == [*(spec.name for spec in BUILTIN), "zz-mine"]


@pytest.mark.parametrize(
    ("loaded", "why"),
    [
        (
            ModuleNotFoundError("No module named 'my_pkg'"),
            "does not load: ModuleNotFoundError: No module named 'my_pkg'",
        ),
        ("not a spec", "is a str, not a fedapp.catalog.MethodSpec"),
        (FEDAVG, "is a MethodSpec named 'fedavg'"),
    ],
    ids=["does not load", "not a MethodSpec", "another name"],
)
def test_an_entry_point_that_cannot_be_used_leaves_its_method_out_with_the_reason(monkeypatch, loaded, why):
    monkeypatch.setattr(catalog, "entry_points", lambda group: [*ours(), point("zz-mine", "my_pkg:SPEC", loaded)])
    found, problems = catalog._load_entry_points()
    assert "zz-mine" not in found and list(found) == [spec.name for spec in BUILTIN]
    assert problems == {"zz-mine": f"method 'zz-mine' of my-pkg (my_pkg:SPEC) {why}"}


def test_a_second_package_declaring_one_of_our_names_is_refused(monkeypatch):
    impostor = MethodSpec("fedavg", "x:S", "x:C", "another fedavg", "cnn", "parameters")
    monkeypatch.setattr(catalog, "entry_points", lambda group: [*ours(), point("fedavg", "x:SPEC", impostor)])
    found, problems = catalog._load_entry_points()
    assert "fedavg" not in found and "another package declares a method of that name" in problems["fedavg"]


def test_a_run_asking_for_a_method_left_out_is_refused_with_the_reason():
    key = Key(str, "fedavg", "federated method", choices=("fedavg",), unavailable={"zz-mine": "it does not load"})
    with pytest.raises(ConfigError, match=r"^config key 'method' = 'zz-mine' cannot run: it does not load$"):
        key.check("method", "zz-mine")
    with pytest.raises(ConfigError, match="is not one of: fedavg"):
        key.check("method", "zz-other")
    assert resolve_run_config({"method": "fedavg"}).method == "fedavg"
