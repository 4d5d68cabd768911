"""The package itself: every submodule `kit` advertises imports (lazily, by attribute)."""
import importlib

import pytest

import kit


@pytest.mark.parametrize("name", kit._SUBMODULES)
def test_every_advertised_submodule_imports(name):
    module = getattr(kit, name)
    assert module is importlib.import_module(f"kit.{name}")


def test_unknown_attribute_is_a_clear_attribute_error():
    with pytest.raises(AttributeError, match="module 'kit' has no attribute 'nope'"):
        kit.nope


def test_profile_loader_is_reachable_from_the_package():
    assert kit.profile_loader is importlib.import_module("kit.profiler").profile_loader
