"""The registry mechanism the provider and tool-source registries share: classes of one base
by a key attribute, refused when they clash, extended without changing the original."""

from __future__ import annotations

import pytest

from turnkeep.support.registry import Registry


class Plugin:
    tag = ""


class PluginRegistry(Registry[Plugin]):
    base = Plugin
    key = "tag"
    what = "plugin"
    share = "are tagged"
    forbidden = "./"


class Red(Plugin):
    tag = "red"


class Blue(Plugin):
    tag = "blue"


def test_classes_by_key_in_registration_order() -> None:
    registry = PluginRegistry([Red, Blue, Red])  # the same class again: a no-op
    assert list(registry) == [Red, Blue]
    assert registry["blue"] is Blue and registry.get("green") is None
    with pytest.raises(KeyError):
        registry["green"]


def test_a_clash_a_bad_key_or_another_base_is_refused() -> None:
    class Crimson(Plugin):
        tag = "red"

    registry = PluginRegistry([Red])
    with pytest.raises(ValueError, match=r"two plugins are tagged 'red': Red and .*Crimson"):
        registry.register(Crimson)
    assert list(registry) == [Red]

    class Dotted(Plugin):
        tag = "a.b"

    for bad in (Plugin, Dotted):
        with pytest.raises(
            ValueError, match=r"\.tag must be a non-empty string without '\.' or '/'"
        ):
            registry.register(bad)
    with pytest.raises(TypeError, match="is not a Plugin subclass"):
        registry.register(object)  # type: ignore[arg-type]


def test_extended_leaves_the_original_unchanged() -> None:
    registry = PluginRegistry([Red])
    extended = registry.extended([Blue])
    assert type(extended) is PluginRegistry
    assert list(extended) == [Red, Blue] and list(registry) == [Red]


def test_admit_may_refuse_a_class_before_it_is_kept() -> None:
    class NoBlue(PluginRegistry):
        def _admit(self, cls: type[Plugin], key: str) -> None:
            if key == "blue":
                raise ValueError("no blue")

    registry = NoBlue([Red])
    with pytest.raises(ValueError, match="no blue"):
        registry.register(Blue)
    assert list(registry) == [Red]


def test_no_installed_package_adds_nothing() -> None:
    # No installed package declares this group: nothing is added.
    assert list(PluginRegistry([Red]).register_installed("turnkeep.no_such_group")) == [Red]
