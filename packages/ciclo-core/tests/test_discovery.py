"""Adapter discovery through the ``ciclo.adapters`` entry-point group, and the lazy forwards."""

from __future__ import annotations

import subprocess
import sys

import pytest

import ciclo
from ciclo._plugins import _discovery
from ciclo.adapters import Adapter, AdapterLoadError, AdapterNotInstalledError


class FakeEntryPoint:
    """Quacks like importlib.metadata.EntryPoint."""

    def __init__(self, name, load, value="fake_adapter:adapter"):
        self.name, self.value, self._load = name, value, load
        self.dist = None

    def load(self):
        return self._load()


@pytest.fixture
def entry_points(monkeypatch):
    """Replaces the installed adapters with the list the test fills in."""
    points: list[FakeEntryPoint] = []
    monkeypatch.setattr(_discovery, "_entry_points", lambda: points)
    monkeypatch.setattr(_discovery, "_LOADED", {})
    monkeypatch.setattr(_discovery, "_REGISTERED", {})
    monkeypatch.setattr(
        _discovery, "_REGISTERED_EXTRAS", {"restore_in_place": {}, "partition_metadata": {}}
    )
    return points


class Model:
    pass


def fake_adapter(name="fakeframework", handles=lambda m: isinstance(m, Model)):
    def create_state(model, *args, **kwargs):
        return ("state of", model, args, kwargs)

    def create_other(*args, **kwargs):
        return ("other", args, kwargs)

    return Adapter(
        name=name,
        distribution=f"ciclo-{name}",
        handles=handles,
        create_state=create_state,
        factories={"create_nnx_state": create_other},
    )


@pytest.mark.parametrize(
    ("forward", "distribution"),
    [
        (ciclo.create_flax_state, "ciclo-flax"),
        (ciclo.create_nnx_state, "ciclo-flax"),
        (ciclo.create_haiku_state, "ciclo-haiku"),
        (ciclo.create_equinox_state, "ciclo-equinox"),
    ],
)
def test_a_missing_adapter_names_the_pip_install_that_fixes_it(entry_points, forward, distribution):
    with pytest.raises(AdapterNotInstalledError, match=f"fix: pip install {distribution}"):
        forward(object(), tx=None)


def test_forwards_call_the_installed_adapter(entry_points):
    adapter = fake_adapter("flax")
    entry_points.append(FakeEntryPoint("flax", lambda: adapter))
    assert ciclo.create_flax_state(1, 2, losses={}) == ("state of", 1, (2,), {"losses": {}})
    assert ciclo.create_nnx_state(1, a=2) == ("other", (1,), {"a": 2})


def test_a_forward_to_an_adapter_lacking_the_factory_says_to_upgrade(entry_points):
    adapter = Adapter("haiku", "ciclo-haiku", lambda m: False, lambda m: m)
    entry_points.append(FakeEntryPoint("haiku", lambda: adapter))
    assert ciclo.create_haiku_state(5) == 5
    entry_points[0] = FakeEntryPoint("flax", lambda: adapter)
    with pytest.raises(AdapterLoadError, match="has no create_nnx_state; upgrade it: pip install"):
        ciclo.create_nnx_state(5)


def test_a_broken_adapter_is_reported_when_used_with_its_cause(entry_points):
    def broken():
        raise RuntimeError("boom at import")

    entry_points.append(FakeEntryPoint("flax", broken, value="ciclo_flax:adapter"))
    with pytest.raises(AdapterLoadError, match=r"'flax' \(ciclo_flax:adapter\) failed to import: "):
        ciclo.create_flax_state()
    with pytest.raises(AdapterLoadError, match="RuntimeError: boom at import") as error:
        ciclo.adapters.get_adapter("flax")
    assert isinstance(error.value.__cause__, RuntimeError)


def test_an_entry_point_that_is_not_an_adapter_record_is_a_clear_error(entry_points):
    entry_points.append(FakeEntryPoint("flax", lambda: sys))
    with pytest.raises(AdapterLoadError, match=r"must point to a ciclo\.adapters\.Adapter, but it"):
        ciclo.adapters.get_adapter("flax")


def test_create_state_picks_the_adapter_from_the_model_type(entry_points):
    entry_points.append(FakeEntryPoint("sys", lambda: fake_adapter("sys", lambda m: False)))
    entry_points.append(FakeEntryPoint("pytest", lambda: fake_adapter("pytest")))
    assert ciclo.create_state(Model(), 1, b=2)[2:] == ((1,), {"b": 2})
    assert ciclo.adapters.adapter_for(Model()).name == "pytest"


def test_create_state_skips_broken_adapters_and_reports_them_when_none_fits(entry_points):
    def broken():
        raise ImportError("no module named framework_x")

    entry_points.append(FakeEntryPoint("framework_x", broken))
    entry_points.append(FakeEntryPoint("pytest", lambda: fake_adapter("pytest")))
    assert ciclo.create_state(Model())[0] == "state of"
    with pytest.raises(TypeError, match=r"no installed ciclo adapter handles it .*framework_x"):
        ciclo.create_state(object())


def test_create_state_refuses_to_guess_between_two_adapters(entry_points):
    entry_points.append(FakeEntryPoint("pytest", lambda: fake_adapter("pytest")))
    entry_points.append(FakeEntryPoint("sys", lambda: fake_adapter("sys")))
    with pytest.raises(TypeError, match=r"several ciclo adapters handle a Model: \["):
        ciclo.create_state(Model())


def test_an_adapter_registered_in_process_is_found_like_an_installed_one(entry_points):
    adapter = fake_adapter("scriptframework")
    assert ciclo.adapters.register_adapter(adapter) is adapter
    assert ciclo.adapters.installed_adapters() == ["scriptframework"]
    assert ciclo.adapters.get_adapter("scriptframework") is adapter
    model = Model()
    assert ciclo.create_state(model, 1, tx=2)[:3] == ("state of", model, (1,))
    replacement = fake_adapter("scriptframework")
    ciclo.adapters.register_adapter(replacement)  # a re-run notebook cell
    assert ciclo.adapters.get_adapter("scriptframework") is replacement


def test_a_registered_adapter_is_picked_without_importing_installed_ones(entry_points):
    loaded = []
    entry_points.append(FakeEntryPoint("notimported", lambda: loaded.append(1) or fake_adapter()))
    ciclo.adapters.register_adapter(fake_adapter("scriptframework"))
    assert ciclo.create_state(Model())[0] == "state of"
    assert loaded == []


def test_registering_needs_an_adapter_record_and_a_free_name(entry_points):
    with pytest.raises(TypeError, match=r"register_adapter needs a ciclo.adapters.Adapter"):
        ciclo.adapters.register_adapter(lambda model: None)
    entry_points.append(FakeEntryPoint("fakeframework", fake_adapter))
    with pytest.raises(ValueError, match=r"registers the adapter 'fakeframework'; rename yours"):
        ciclo.adapters.register_adapter(fake_adapter("fakeframework"))


def test_adapters_are_imported_only_on_use(entry_points):
    loads = []
    entry_points.append(FakeEntryPoint("sys", lambda: loads.append(1) or fake_adapter("sys")))
    assert ciclo.adapters.installed_adapters() == ["sys"]
    assert loads == []
    ciclo.adapters.get_adapter("sys")
    ciclo.adapters.get_adapter("sys")
    assert loads == [1]


def test_importing_ciclo_imports_no_adapter_and_no_framework():
    code = (
        "import sys, importlib.metadata as m\n"
        "calls = []\n"
        "real = m.entry_points\n"
        "m.entry_points = lambda *a, **k: calls.append(1) or real(*a, **k)\n"
        "import ciclo\n"
        "bad = [n for n in ('flax', 'haiku', 'equinox', 'ciclo_flax', 'ciclo_haiku',"
        " 'ciclo_equinox') if n in sys.modules]\n"
        "assert not bad and not calls, (bad, calls)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- the extras an adapter's record carries ------------------------------------------------
class Annotated:
    pass


def test_an_adapter_record_checks_its_extras():
    make = dict(name="fakeframework", distribution="x", handles=bool, create_state=print)
    with pytest.raises(
        TypeError,
        match=r"Adapter\('fakeframework'\): restore_in_place maps classes to functions "
        r"\(\(original, restored\) -> None\), got 'Annotated'",
    ):
        Adapter(**make, restore_in_place={"Annotated": print})
    with pytest.raises(
        TypeError, match=r"partition_metadata maps classes to functions .*got <class .*: None"
    ):
        Adapter(**make, partition_metadata={Annotated: None})


def test_extras_come_from_imported_and_registered_adapters_only(entry_points):
    loads = []

    def installed(name):
        record = Adapter(
            name=name,
            distribution=f"ciclo-{name}",
            handles=bool,
            create_state=print,
            partition_metadata={Annotated: lambda node: name},
        )
        return FakeEntryPoint(name, lambda: loads.append(name) or record)

    entry_points.append(installed("notimported"))  # its framework is not imported: never loaded
    entry_points.append(installed("sys"))
    table, broken = _discovery.extras("partition_metadata")
    assert loads == ["sys"]
    assert table[Annotated](None) == "sys"
    assert broken == {}
    ciclo.adapters.register_adapter(
        Adapter(
            name="script",
            distribution="none",
            handles=bool,
            create_state=print,
            restore_in_place={Annotated: print},
        )
    )
    assert _discovery.extras("restore_in_place") == ({Annotated: print}, {})


def test_a_broken_adapter_is_reported_by_extras_not_raised(entry_points):
    def broken():
        raise ImportError("no module named fake_adapter")

    entry_points.append(FakeEntryPoint("sys", broken))
    table, broken_adapters = _discovery.extras("restore_in_place")
    assert table == {}
    assert list(broken_adapters) == ["sys"]
    assert "no module named fake_adapter" in broken_adapters["sys"]
