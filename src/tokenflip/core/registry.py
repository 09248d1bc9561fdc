"""A registry of named extensions (engines, benchmark kinds, interventions, probes): the one list
from which the config schema's enums, the CLI's choices and the probe rules are made, so
that adding one is its own file plus one line in its registry."""

from __future__ import annotations

from typing import Any, Generic, Iterable, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries by name, in registration order; an entry's name is its `key` attribute
    (`name`, or `kind` for benchmark classes)."""

    def __init__(self, what: str, entries: Iterable[T] = (), key: str = "name") -> None:
        self.what = what
        self.key = key
        self._entries: dict[str, T] = {}
        for entry in entries:
            self.register(entry)

    def register(self, entry: T) -> T:
        """Add an entry (usable as a class decorator); a name may be registered once."""
        name = getattr(entry, self.key, None)
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.what} needs a non-empty `{self.key}`, got {entry!r}")
        if name in self._entries and self._entries[name] is not entry:
            raise ValueError(f"{self.what} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)

    def __getitem__(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"unknown {self.what} {name!r}; known: {', '.join(self._entries)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self):
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self):
        return self._entries.keys()

    def names(self) -> list[str]:
        return list(self._entries)

    def items(self):
        return self._entries.items()

    def values(self):
        return self._entries.values()


def kinds_schema(entries: dict[str, dict[str, Any]], common: dict[str, Any]) -> dict[str, Any]:
    """JSON schema of a config entry whose keys depend on its `kind`: one if/then branch
    per kind with that kind's options (`entries`: kind -> options schema)."""
    return {
        "type": "object", "required": ["kind"],
        "properties": {"kind": {"enum": list(entries)}},
        "allOf": [{"if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
                   "then": {"properties": {**common, **options}, "additionalProperties": False}}
                  for kind, options in entries.items()],
    }
