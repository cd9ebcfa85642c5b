"""Study configs as overlays: a file names its ``base`` and holds only the keys it changes.

A config file may start with ``base: <file>`` (a path relative to the file's own folder); it
then means its base, resolved the same way, with the file's keys merged on top: mappings
merge key by key, lists and scalars replace. A mapping that must replace the base's whole
(so that none of the base's entries leaks into the study, e.g. the default's models) is
listed by its dotted key in the file's ``replace:`` list. Several files (``snakemake
--configfile a.yaml b.yaml``) apply in order, each an overlay on those before it, so only
the first may name a base; ``--config key=value`` overrides apply last, as plain overlays.

Snakemake's own merge of config files cannot delete a key or replace a mapping whole, hence
this one, used by the Snakefile and by ``coordgap plan`` alike. ``base`` and ``replace`` are
consumed here, a model entry's omitted keys get their schema defaults
(:func:`with_model_defaults`), and a run's ``seeds`` become one run per seed
(``coordgap.config.training.with_seed_runs``); the resolved config is then checked by the
schema as a whole, so an unknown key in an overlay is named there.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from coordgap.config.keys import SCHEMA, ConfigError
from coordgap.config.training import with_seed_runs

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

BASE = "base"
REPLACE = "replace"


@dataclass(frozen=True, slots=True)
class Resolved:
    """A resolved config and the files it came from.

    Attributes:
        config: The config, without ``base`` and ``replace``.
        files: Every file read, each base before the files on top of it.
    """

    config: dict[str, Any]
    files: tuple[Path, ...]


def merge(base: Mapping[str, Any], overlay: Mapping[str, Any], replace: Iterable[str] = ()) -> dict:
    """Merge an overlay onto a base, neither of them changed.

    Args:
        base: The config underneath.
        overlay: The keys that change: a mapping merges into the base's key by key, anything
            else replaces the base's value.
        replace: Dotted keys of the overlay (``training.runs``) whose mapping replaces the
            base's whole instead of merging into it.

    Returns:
        The merged config: the base's keys in the base's order, then the overlay's new ones.

    Raises:
        ConfigError: A key in ``replace`` that the overlay does not set.
    """
    whole = set(replace)
    if unset := sorted(whole - set(_dotted_keys(overlay, ""))):
        raise ConfigError(
            f"config key '{REPLACE}' lists '{unset[0]}', which this file does not set"
        )
    return _merge(base, overlay, whole, "")


def resolve(paths: Sequence[str | Path], overrides: Mapping[str, Any] | None = None) -> Resolved:
    """Resolve config files as the workflow reads them: bases first, files in order, overrides.

    Args:
        paths: The config files, as given to ``--configfile``.
        overrides: ``--config key=value`` settings, merged last.

    Returns:
        The resolved config and every file it was read from.

    Raises:
        ConfigError: A missing file, a base that is missing or makes a cycle, a base named by a
            file after the first, or a malformed ``base`` or ``replace``; the message starts
            with the file.
    """
    if not paths:
        raise ConfigError("no config file given")
    layers = _chain(Path(paths[0]).absolute(), ())
    for path in paths[1:]:
        layer = _load(Path(path).absolute())
        if layer.base is not None:
            raise ConfigError(
                f"{layer.path}: config key '{BASE}': only the first config file may name a "
                "base (each later file is an overlay on the files before it)"
            )
        layers.append(layer)
    config: dict[str, Any] = {}
    for layer in layers:
        try:
            config = merge(config, layer.keys, layer.replace)
        except ConfigError as error:
            raise ConfigError(f"{layer.path}: {error}") from None
    _check_sections(overrides or {}, "--config")
    config = merge(config, overrides or {})
    complete = with_seed_runs(with_model_defaults(config))
    return Resolved(complete, tuple(layer.path for layer in layers))


def with_model_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config with every model entry's omitted keys set to their schema defaults.

    A model entry states what is its own (an endpoint, a model name, a key's variable) and
    leaves the rest to the defaults of its kind in ``workflow/schemas/config.schema.yaml``,
    the one place they are written; a ``serve:`` block likewise. An entry of unknown kind is
    left as it is, for the schema to name.

    Args:
        config: A merged config.

    Returns:
        A copy with complete model entries, each one's own keys first, in its own order.
    """
    filled = copy.deepcopy(dict(config))
    models = filled.get("models")
    if isinstance(models, dict):
        kinds = _model_kinds()
        for name, entry in models.items():
            if isinstance(entry, dict) and entry.get("kind") in kinds:
                models[name] = _with_defaults(entry, kinds[entry["kind"]])
    return filled


@functools.cache
def _schema() -> dict[str, Any]:
    """The config schema, parsed."""
    return yaml.safe_load(SCHEMA.read_text(encoding="utf-8"))


@functools.cache
def _model_kinds() -> dict[str, dict[str, Any]]:
    """Each model kind's schema (its ``$defs`` entry), by the kind's name."""
    return {
        node["properties"]["kind"]["const"]: node
        for node in _schema()["$defs"].values()
        if "const" in node.get("properties", {}).get("kind", {})
    }


def _check_sections(keys: Mapping[str, Any], source: str | Path) -> None:
    """Refuse a top-level key the schema does not know, naming it, the known ones and ``source``.

    Checked here, as each file is read, rather than left to the schema check of the resolved
    config: Snakemake's validator reports it inside a dump of the whole schema and config,
    thousands of lines, without the file.

    Raises:
        ConfigError: The first unknown key.
    """
    sections = _schema()["properties"]
    if unknown := [key for key in keys if key not in sections]:
        raise ConfigError(
            f"{source}: config key '{unknown[0]}' is unknown; a config's top-level keys are "
            f"{', '.join(sections)} (and {BASE}, {REPLACE} in a file)"
        )


def _with_defaults(entry: dict[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """``entry`` with the defaults of ``schema``'s properties it lacks, nested mappings too."""
    filled = dict(entry)
    for key, node in schema.get("properties", {}).items():
        if key not in filled and "default" in node:
            filled[key] = copy.deepcopy(node["default"])
        elif isinstance(filled.get(key), dict) and "properties" in node:
            filled[key] = _with_defaults(filled[key], node)
    return filled


@dataclass(frozen=True, slots=True)
class _Layer:
    """One config file: its path, its base (resolved to a path) and what it sets."""

    path: Path
    base: Path | None
    replace: tuple[str, ...]
    keys: dict[str, Any]


def _chain(path: Path, below: tuple[Path, ...]) -> list[_Layer]:
    """The layers of a file, its farthest base first; ``below``: the files resting on it."""
    layer = _load(path)
    if layer.base is None:
        return [layer]
    seen = (*below, path)
    if layer.base.resolve() in {file.resolve() for file in seen}:
        cycle = " -> ".join(str(file) for file in (*seen, layer.base))
        raise ConfigError(f"{path}: config key '{BASE}' makes a cycle: {cycle}")
    if not layer.base.is_file():
        raise ConfigError(f"{path}: config key '{BASE}': no such file {layer.base}")
    return [*_chain(layer.base, seen), layer]


def _load(path: Path) -> _Layer:
    """Read one config file, its ``base`` and ``replace`` set apart from its keys."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    keys = yaml.safe_load(path.read_text())
    if not isinstance(keys, dict):
        raise ConfigError(f"{path}: a config file holds a mapping of keys")
    base, replace = keys.pop(BASE, None), keys.pop(REPLACE, [])
    if base is not None and not isinstance(base, str):
        raise ConfigError(f"{path}: config key '{BASE}' is a file path, not {base!r}")
    if not (isinstance(replace, list) and all(isinstance(key, str) for key in replace)):
        raise ConfigError(f"{path}: config key '{REPLACE}' is a list of dotted keys")
    _check_sections(keys, path)
    return _Layer(path, None if base is None else path.parent / base, tuple(replace), keys)


def _merge(base: Mapping, overlay: Mapping, whole: set[str], prefix: str) -> dict:
    merged = copy.deepcopy(dict(base))
    for key, value in overlay.items():
        dotted = f"{prefix}{key}"
        below = merged.get(key)
        if isinstance(value, Mapping) and isinstance(below, Mapping) and dotted not in whole:
            merged[key] = _merge(below, value, whole, f"{dotted}.")
        else:
            merged[key] = copy.deepcopy(dict(value) if isinstance(value, Mapping) else value)
    return merged


def _dotted_keys(node: Mapping, prefix: str) -> Iterator[str]:
    """Every key under ``node``, dotted (names may hold dots: they are matched whole)."""
    for key, value in node.items():
        yield f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _dotted_keys(value, f"{prefix}{key}.")
