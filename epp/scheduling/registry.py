"""The plugin registry: plugin type name -> factory, filled by one decorator.

There is one registration style. A plugin module decorates its class with
`@registry.register("<type>")`, and `epp.scheduling.plugins` imports every plugin module, so importing
that package registers all built-in types. Nothing else needs editing to add a plugin.

A plugin class derives from `PluginBase` and has

- a nested `Params` msgspec Struct with `forbid_unknown_fields=True`, its fields spelt as GIE spells
  the parameters (camelCase); `PluginBase.Params` is the empty one for plugins without parameters;
- `__init__(self, name: str, params: Params, handle: interfaces.Handle)`.

`register` checks that shape when the module is imported and wraps the class in an
`interfaces.Factory`, which decodes the raw parameters with `msgspec.convert`. GIE decodes them with a
lenient JSON decoder, so a misspelt parameter silently keeps its default; here an unknown, mistyped
or out-of-range parameter is a `ConfigError` naming the plugin, its type and the parameter.

The module-level `default` registry is the only module-level state of the scheduling package.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, TypeVar

import msgspec

from epp.scheduling import interfaces


class ConfigError(ValueError):
    """A configuration epp refuses to start with. The message names the culprit."""


class PluginBase:
    """What every built-in plugin shares: `type` (set by `register`) and `name` (from the config)."""

    type: ClassVar[str] = ""

    class Params(msgspec.Struct, forbid_unknown_fields=True):
        """No parameters: any parameter given is a configuration error."""

    def __init__(self, name: str, params: Any, handle: interfaces.Handle) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"{self.name}/{self.type}"  # GIE prints a plugin's TypedName the same way


class PickerBase(PluginBase):
    """What every picker shares: GIE's `maxNumOfEndpoints`, the length of the ordered list
    (primary, then fallbacks) the picker returns."""

    class Params(msgspec.Struct, forbid_unknown_fields=True):
        maxNumOfEndpoints: Annotated[int, msgspec.Meta(ge=1)] = 1

    def __init__(self, name: str, params: Params, handle: interfaces.Handle) -> None:
        self.name = name
        self.max_endpoints = params.maxNumOfEndpoints


_C = TypeVar("_C", bound="type[PluginBase]")


class Registry:
    """Plugin types by name. `build` turns one `plugins[]` entry of the config into a plugin."""

    def __init__(self) -> None:
        self._factories: dict[str, interfaces.Factory] = {}

    def register(self, type_name: str) -> Callable[[_C], _C]:
        """Class decorator: register the class as plugin type `type_name` and set its `type`."""

        def decorate(cls: _C) -> _C:
            if type_name in self._factories:
                raise ValueError(f"plugin type {type_name!r} is registered twice")
            params = cls.Params
            if not (issubclass(params, msgspec.Struct) and params.__struct_config__.forbid_unknown_fields):
                raise TypeError(
                    f"{cls.__qualname__}.Params must be a msgspec.Struct with forbid_unknown_fields=True"
                )
            cls.type = type_name
            self._factories[type_name] = _factory(cls)
            return cls

        return decorate

    def types(self) -> list[str]:
        """Every registered plugin type, sorted."""
        return sorted(self._factories)

    def __contains__(self, type_name: object) -> bool:
        return type_name in self._factories

    def build(
        self,
        type_name: str,
        name: str,
        parameters: Mapping[str, Any] | None,
        handle: interfaces.Handle,
    ) -> interfaces.Plugin:
        """Create plugin `name` of type `type_name`. Raises ConfigError naming what is wrong."""
        factory = self._factories.get(type_name)
        if factory is None:
            raise ConfigError(
                f"plugin {name!r}: unknown plugin type {type_name!r}; known types: {', '.join(self.types())}"
            )
        return factory(name, parameters if parameters is not None else {}, handle)


def _factory(cls: type[PluginBase]) -> interfaces.Factory:
    def factory(name: str, parameters: Mapping[str, Any], handle: interfaces.Handle) -> interfaces.Plugin:
        try:
            params = msgspec.convert(parameters, cls.Params)
        except msgspec.ValidationError as err:
            # msgspec names the field: "Object contains unknown field `x`", "Expected `int` ... at `$.y`".
            raise ConfigError(f"plugin {name!r} (type {cls.type!r}): invalid parameters: {err}") from None
        return cls(name, params, handle)

    return factory


default = Registry()
register = default.register
